"""The RPC study's network term: learned at RTT 0, predicting the other points."""

from __future__ import annotations

from llamaspec.perf import rpcstudy


def _cell(rtt: float, plain_tps: float, spec_tps: float, rp: float, rs: float) -> dict:
    def side(tps, r):
        return {
            "tok_s": tps,
            "turns_per_token": r,
            "bytes_per_token": 10,
            "turns_per_step": None,
            "accepted": 1,
            "drafted": 2,
        }

    return {
        "placement": "p",
        "rtt_ms": rtt,
        "plain": side(plain_tps, rp),
        "spec": side(spec_tps, rs),
    }


def test_fit_predicts_from_rtt_zero_and_finds_the_crossover() -> None:
    # plain: 10 ms/token, 4 turns/token; spec: 12.5 ms/token, 1 turn/token
    # at 5 ms: plain 1/(0.010 + 0.020) = 33.3 tok/s; spec 1/(0.0125 + 0.005) = 57.1 tok/s
    report = {"cells": [_cell(0, 100, 80, 4, 1), _cell(5, 33.3333, 50, 4, 1)]}
    rpcstudy.fit(report)
    far = report["cells"][1]
    assert far["plain"]["expected_tok_s"] == 33.333
    assert far["spec"]["expected_tok_s"] == 57.143
    assert far["spec"]["measured_over_expected"] == round(50 / 57.143, 3)
    # meet where 0.010 + 0.004·x = 0.0125 + 0.001·x: x = 0.833 ms
    assert report["crossover"]["p"].startswith("speculation starts paying above 0.83 ms RTT")
    assert "| p | 5 |" in rpcstudy.markdown(
        {
            **report,
            "artifact": "a",
            "model": "m",
            "draft_n_max": 8,
            "n_predict": 32,
            "link": "l",
            "delay": "d",
        }
    )


def test_spec_that_pays_at_zero_and_costs_more_turns_stops_paying() -> None:
    report = {"cells": [_cell(0, 50, 100, 1, 3)]}
    rpcstudy.fit(report)
    # 0.020 + 0.001·x = 0.010 + 0.003·x → x = 5 ms
    assert report["crossover"]["p"].startswith("speculation stops paying above 5.00 ms RTT")
