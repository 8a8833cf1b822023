"""The strict tier's traffic mode: its schedule, what it counts, how it is shown and the
options that shape it (the real server's side is tests/integration/test_verify_traffic.py)."""

from __future__ import annotations

import itertools

import pytest

from llamaspec.proof import traffic, traffic_report
from llamaspec.proof.traffic import Answer, Arrival, TrafficPlan, schedule, summary
from llamaspec.proof.verify_report import Case, MethodResult, VerifyReport, markdown

from runcli import cli

FULL = [64, 64, 32, 64, 96, 64, 64, 32, 64, 96]  # five prompts, then their long versions


def test_the_schedule_has_every_kind_of_request_and_more_requests_than_slots() -> None:
    for slots in (2, 4, 8):
        arrivals = schedule(5, slots, TrafficPlan(), 1.0, FULL)
        assert len(arrivals) == 3 * slots
        assert [a.index for a in arrivals] == list(range(len(arrivals)))
        assert all(b.at >= a.at for a, b in itertools.pairwise(arrivals))
        assert any(a.prompt >= 5 for a in arrivals)  # a long prompt
        assert any(a.prompt < 5 for a in arrivals)
        assert any(a.cancel_after and a.stream for a in arrivals)  # a stream hung up on
        assert any(a.stream and not a.cancel_after for a in arrivals)
        assert any(not a.stream for a in arrivals)
        assert any(a.cache for a in arrivals[1:])
        assert all(1 <= a.n_predict <= FULL[a.prompt] for a in arrivals)
        assert all(not a.cancel_after or a.stream for a in arrivals)


def test_the_schedule_is_seeded_and_paced_by_the_slots() -> None:
    a = schedule(5, 4, TrafficPlan(), 2.0, FULL)
    assert a == schedule(5, 4, TrafficPlan(), 2.0, FULL)
    assert a != schedule(5, 4, TrafficPlan(seed=1), 2.0, FULL)
    slow = schedule(5, 4, TrafficPlan(), 20.0, FULL)
    assert slow[-1].at > a[-1].at  # slower answers, later arrivals
    # a short run still mixes: four requests at least, each kind present
    few = schedule(5, 1, TrafficPlan(per_slot=1), 1.0, FULL)
    assert len(few) == 4 and any(x.cancel_after for x in few) and any(x.prompt >= 5 for x in few)


def _answer(i: int, ended: str, slot: int | None, drafted: int, accepted: int) -> Answer:
    return Answer(Arrival(i, i % 10, 8, ended == "cancelled", 0, False, 0.1 * i), (1, 2), ended,
                  slot, drafted, accepted, 1.0 + i)  # fmt: skip


def test_the_summary_counts_per_slot_and_names_a_slot_that_never_accepts() -> None:
    answers = [
        _answer(0, "completed", 0, 10, 7),
        _answer(1, "completed", 1, 8, 0),
        _answer(2, "cancelled", 1, 0, 0),
        _answer(3, "completed", 0, 4, 4),
        _answer(4, "error: HTTP 500: boom", None, 0, 0),
        _answer(6, "completed", 2, 0, 0),
    ]
    t = summary(4, answers, 5)
    assert (t.mode, t.requests, t.completed, t.cancelled, t.failed) == ("traffic-4", 6, 4, 1, 1)
    assert t.long_prompts == 1 and t.streamed == 1 and t.span_s == 7.0
    by = {s.slot: s for s in t.per_slot}
    assert (by[0].requests, by[0].drafted, by[0].accepted) == (2, 14, 11)
    assert (by[1].requests, by[1].drafted, by[1].accepted) == (2, 8, 0)
    assert t.silent_slots == [1]  # drafted, never accepted; slot 2 drafted nothing
    assert by[2].rate is None


def test_the_report_lists_traffic_rows_and_fails_on_an_error() -> None:
    answers = [_answer(0, "completed", 0, 10, 7), _answer(1, "completed", 1, 8, 0)]
    t = summary(4, answers, 5)
    ok = MethodResult("draft", ("--spec-type", "draft"), traffic=(t,),
                      cases=(Case("code #0", "traffic-4", "identical"),),
                      per_mode={"traffic-4": (18, 7)})  # fmt: skip
    report = VerifyReport("a", "embedded-traffic", "strict", "m.gguf", (ok,))
    assert report.passed and ok.modes() == ["traffic-4"]
    text = markdown(report)
    assert "## Traffic" in text and "| draft | 4 | 2 | 2 | 0 | 0 |" in text
    assert "never accepted on [1]" in text and "0: 7/10 (0.70)" in text
    summary_json = report.to_json()["methods"][0]["summary"]
    assert summary_json["traffic-4"]["identical"] == 1
    bad = MethodResult("draft", (), cases=(Case("code #1", "traffic-4", "error", note="x"),))
    assert not VerifyReport("a", "t", "strict", "m", (bad,)).passed
    assert traffic_report.lines([("draft", ())]) == []


def test_a_completed_answer_is_compared_as_a_completion() -> None:
    c = _answer(0, "completed", 0, 10, 7).completion()
    assert c.tokens == (1, 2) and c.draft_n == 10 and c.tokens_predicted == 2
    long = traffic.long_version(traffic.Prompt("code", "def f():", 32))
    assert long.name == "code+preamble" and long.text.endswith("def f():")
    assert long.text.startswith(traffic.PREAMBLE)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--mode", "traffic", "--recipe", "gemma3-270m-ngram"], "built-in reference models"),
        (["--traffic-slots", "4"], "add --mode traffic"),
        (["--mode", "traffic", "--tier", "oracle"], "mode of the strict tier"),
        (["--mode", "traffic", "--traffic-slots", "0,4"], "whole numbers from 1 to 64"),
        (["--mode", "traffic", "--traffic-slots", "4,x"], "whole numbers from 1 to 64"),
        (["--mode", "traffic", "--traffic-requests", "0"], "1 or more"),
    ],
)
def test_traffic_options_are_refused_where_they_mean_nothing(argv, needle, tmp_path) -> None:
    proc = cli("verify", "--dist", str(tmp_path), *argv, env_cache=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
