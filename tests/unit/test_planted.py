"""The oracle-power study's own arithmetic: the emulated n-gram drafter, which outputs count
toward each rate, the goals, and what the report states (issue 52)."""

from __future__ import annotations

import math

import pytest

from llamaspec.proof import planted, planted_report
from llamaspec.proof.planted_report import Clean, Planted, PowerRun
from llamaspec.proof.verify_report import Envelope

pytestmark = pytest.mark.unit


def test_the_ngram_drafter_proposes_what_followed_the_latest_match() -> None:
    assert planted._ngram_draft([1, 2, 3, 4, 5, 9, 1, 2]) == [3, 4, 5, 9]
    assert planted._ngram_draft([1, 2, 7, 1, 2, 8, 1, 2]) == [8, 1, 2]  # the latest match
    assert planted._ngram_draft([1, 2, 3]) == []  # no earlier occurrence: no draft


def _p(defect: str, pos: int | None, near: bool, strict: bool, oracle: bool, legacy: bool):
    gap = None if pos is None else (0.05 if near else math.inf)
    kind = "over-envelope" if oracle else ("identical" if pos is None else "within")
    return Planted(defect, "code", "sequential", pos, gap, near, strict, oracle, legacy, kind)


def _run(planted_: tuple[Planted, ...], clean: tuple[Clean, ...] = ()) -> PowerRun:
    env = Envelope(("sequential",), 0.2, {"sequential": 0.2}, (), {"code": {"sequential": 0.2}},
                   {"sequential": "sequential"}, 0.3, {"code": 0.3})  # fmt: skip
    return PowerRun("art", "m.gguf", ("code",), env, planted_, clean, 10, 60.0, True)


def test_rates_count_changed_outputs_and_leave_true_near_ties_out_of_the_oracles() -> None:
    run = _run(
        (
            _p("rank-10", 5, False, True, True, False),  # caught now, missed before
            _p("rank-2", 7, True, True, False, False),  # a true near-tie: not counted
            _p("random-acceptance", None, False, False, False, False),  # the coin left it
            _p("outside-top-10", 3, False, True, True, True),
        ),
        (
            Clean("ngram-mod", "code", "parallel", "within"),
            Clean("ngram-mod", "code", "sequential", "over-envelope"),
        ),
    )
    r = planted_report.rates(run)
    assert (r["planted"], r["expressed"], r["strict_rate"]) == (4, 3, 1.0)
    assert (r["near_ties"], r["oracle_detected"], r["oracle_rate"]) == (1, 2, 1.0)
    assert (r["legacy_detected"], r["legacy_rate"]) == (1, 0.5)
    assert (r["false_alarms"], r["false_alarm_rate"]) == (1, 0.5)
    assert planted_report.goals_met(run)


def test_a_missed_defect_or_a_strict_pass_misses_the_goals() -> None:
    missed = _run((_p("rank-10", 5, False, True, False, False),))
    assert planted_report.rates(missed)["oracle_rate"] == 0.0
    assert not planted_report.goals_met(missed)
    strict_pass = _run((_p("rank-10", 5, False, False, True, True),))
    assert not planted_report.goals_met(strict_pass)


def test_the_report_states_rates_allowances_and_every_planted_output(tmp_path) -> None:
    run = _run(
        (_p("rank-10", 5, False, True, True, False), _p("rank-2", 7, True, True, False, False))
    )
    js, md = planted_report.write(run, tmp_path)
    assert js.name == "oracle-power-art-short.json"
    text = md.read_text()
    assert "verdict: goals met" in text
    assert "oracle tier: 1 of 1 that are not true near-ties failed (100.0 %); before: 0" in text
    assert "| code | 0.200 | 0.200 | 0.300 |" in text  # envelope and measured noise
    assert "| rank-10 | code | sequential | 5 | outside top-10 | no | failed |" in text
    assert "| rank-2 | code | sequential | 7 | 0.050 | yes | failed |" in text
