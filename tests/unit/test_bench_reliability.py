"""Bench's measurement discipline: a run that cannot be trusted says so instead of printing
a headline (perf.reliability, perf.bench_report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.perf import bench, bench_report, costmodel, reliability
from llamaspec.perf.bench_report import BenchReport, Cell, Sample

pytestmark = pytest.mark.unit

# One client's plain tok/s per repetition, and the speculative tok/s beside each.
QUIET_PLAIN, QUIET_SPEC = (95.0, 94.0, 96.0), (150.0, 147.0, 153.0)
# The issue's busy run: plain at 7.2 tok/s, speedups 18.71×, 0.63× and 2.88× on repeats.
BUSY_PLAIN = (7.2, 7.0, 7.4)
BUSY_SPEC = (7.2 * 18.71, 7.0 * 0.63, 7.4 * 2.88)


def _cost_model(batch_2: float = 1.22) -> dict:
    """A cost model whose one-token time (10.5 ms) estimates plain decoding at ~95 tok/s."""
    costs = costmodel.BatchCosts({1: 10.0, 2: 10.0 * batch_2, 4: 13.6}, 10.5, 37)
    return costmodel.summary(costs, 0.0, 95.0 * 253_000_000, 253_000_000)


def _report(
    plain: tuple[float, ...],
    spec: tuple[float, ...],
    cost_model: dict | None,
    load: reliability.HostLoad | None,
    warm: tuple[float, ...] = (),
) -> BenchReport:
    cell = Cell(
        "code-edit",
        1,
        tuple(Sample(128, x, 1.0) for x in plain),
        tuple(Sample(128, x, 1.0, 40, 30, 10, (0.9, 0.8)) for x in spec),
        tuple(Sample(128, x, 1.0, 40, 36, 6, (0.9,)) for x in warm),
    )
    costs = {1: 1.0, 2: 1.2, 4: 1.4} if cost_model else None
    cell = Cell(**{**asdict(cell), "summary": bench.summarize(cell, costs, 0.0, True)})
    cell = Cell(
        cell.workload,
        cell.concurrency,
        tuple(Sample(**s) for s in cell.plain),  # asdict flattened the samples
        tuple(Sample(**s) for s in cell.spec),
        tuple(Sample(**s) for s in cell.warm),
        cell.summary,
    )
    report = BenchReport(
        recipe="gemma3-270m-ngram-tuned",
        artifact_id="llamacpp-cpu-0123456789ab",
        engine="llama.cpp",
        commit="0c1e57098bba",
        backend="cpu",
        machine={
            "cpu": "AMD EPYC",
            "cores": 2,
            "gpus": [],
            "description": "AMD EPYC, 2 cores; no GPU",
        },
        date="2026-11-25",
        types=("ngram-mod",),
        spec_args=("--spec-type", "ngram-mod"),
        commands={"plain, 1 slot(s)": "llama-server -m t.gguf -t 1"},
        models={"target": "t.gguf", "draft": None},
        repetitions=len(plain),
        concurrency=(1,),
        exposure="first",
        keeps_state=("ngram-mod",) if warm else (),
        workloads=(cell,),
        cost_model=cost_model,
        wall_seconds=60.0,
        host_load=load.to_json() if load else None,
    )
    verdict = reliability.judge(report.to_json())
    return BenchReport(**{**report.__dict__, "reliability": verdict.to_json()})


QUIET_LOAD = reliability.HostLoad(cpus=2, threads=1, before=0.2, during=(1.1, 1.2), after=1.0)
BUSY_LOAD = reliability.HostLoad(cpus=2, threads=1, before=7.5, during=(8.3,), after=8.0)


def test_the_issues_busy_run_is_unreliable_for_every_reason_it_gave() -> None:
    report = _report(BUSY_PLAIN, BUSY_SPEC, _cost_model(batch_2=0.125), BUSY_LOAD)
    v = report.reliability
    assert v["reliable"] is False
    reasons = "\n".join(v["reasons"])
    assert "speedup 0.63×–18.71× across 3 repetitions" in reasons
    assert "plain decoding at 7.2 tok/s, 13.2× below the cost model's own one-token time" in (
        reasons
    )
    assert "below the memory-bandwidth limit (95.0 tok/s" in reasons
    assert "k=2: 0.125" in reasons and "less than one token" in reasons
    assert "machine loaded: other work took 7.5 CPUs" in reasons
    assert v["flagged"] == [{"workload": "code-edit", "concurrency": 1}]


def test_a_quiet_run_is_reliable_and_gets_its_headline() -> None:
    report = _report(QUIET_PLAIN, QUIET_SPEC, _cost_model(), QUIET_LOAD)
    v = report.reliability
    assert v["reliable"] is True and v["reasons"] == [] and v["notes"] == [] and not v["flagged"]
    md = bench_report.markdown(report.to_json())
    assert "**Headline** — first exposure, 1 client: 1.58–1.58× by workload" in md
    assert "medians of 3 repetitions, repetitions 1.56–1.59×" in md
    (row,) = bench_report.rows(report.to_json())
    assert row[4] == "1.58× (1.56–1.59)"
    assert "Unreliable" not in md


def test_an_unreliable_report_prints_reasons_instead_of_a_headline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench_report, "plot", lambda *_a: False)  # no matplotlib figure
    report = _report(BUSY_PLAIN, BUSY_SPEC, _cost_model(batch_2=0.125), BUSY_LOAD)
    md = bench_report.markdown(report.to_json())
    assert md.splitlines()[2].startswith("**Unreliable: no headline.**")
    assert "**Headline**" not in md
    (row,) = bench_report.rows(report.to_json())
    assert row[4] == "2.96× (0.63–18.71) unreliable"  # the number stays, marked
    # the tok/s stand beside the hardware that gave them, its threads and load included
    assert (
        "- machine: AMD EPYC, 2 cores; no GPU; server threads: 1; load: 7.5 CPUs busy before "
        "(2-second sample), at most 8.3 during and 8.0 after (1-minute averages), on 2 CPUs" in md
    )
    console = Console(record=True, width=300)
    stem = bench_report.write(report, tmp_path, console, "b")
    out = console.export_text()
    assert "bench: unreliable: no headline speedup" in out and "k=2: 0.125" in out
    assert "tok/s on AMD EPYC, 2 cores; no GPU; server threads: 1" in out
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["reliability"]["reliable"] is False and saved["host_load"]["cpus"] == 2
    assert "Unreliable: no headline" in stem.with_suffix(".md").read_text()


def test_each_check_alone_makes_a_run_unreliable() -> None:
    # one bad repetition among quiet ones
    spread = _report(QUIET_PLAIN, (150.0, 147.0, 260.0), _cost_model(), QUIET_LOAD)
    assert not spread.reliability["reliable"]
    # plain far below its own estimate, repetitions agreeing (a machine busy throughout)
    slow = _report((30.0, 31.0, 30.5), (45.0, 46.0, 45.5), _cost_model(), QUIET_LOAD)
    assert [r.split(":")[1].strip()[:14] for r in slow.reliability["reasons"]] == ["plain decoding"]
    # the cost model timed a batch below one token
    assert not _report(QUIET_PLAIN, QUIET_SPEC, _cost_model(0.5), QUIET_LOAD).reliability[
        "reliable"
    ]
    assert not _report(QUIET_PLAIN, QUIET_SPEC, _cost_model(), BUSY_LOAD).reliability["reliable"]
    # one repetition has no spread to judge
    one = _report((95.0,), (150.0,), _cost_model(), QUIET_LOAD)
    assert one.reliability["reasons"] == ["1 repetition(s): a spread needs two or more"]
    # a reason about the whole run (not one cell's) marks every cell
    assert one.reliability["flagged"] == [{"workload": "code-edit", "concurrency": 1}]


def test_a_server_that_counts_tokens_it_never_returned_is_not_trusted() -> None:
    """f49e917 (measured: 96 counted, 81 returned on verify's rewrite prompt) and ik's
    short-output defect count the whole budget for outputs that end early."""
    report = _report(QUIET_PLAIN, QUIET_SPEC, _cost_model(), QUIET_LOAD).to_json()
    assert reliability.judge(report).reliable  # returned unknown: a report from before
    (cell,) = report["workloads"]
    cell["plain"] = [{**x, "returned": 128} for x in cell["plain"]]
    cell["spec"] = [{**x, "returned": 126} for x in cell["spec"]]  # within the floor
    assert reliability.judge(report).reliable
    cell["spec"][1]["returned"] = 81
    v = reliability.judge(report)
    assert not v.reliable and v.flagged == (("code-edit", 1),)
    assert v.reasons == (
        "code-edit (1 client): the speculative server counted 384 tokens but returned 333 "
        "(outputs cut short, an engine defect): its tok/s counts tokens no client received "
        "(floor 0.98)",
    )
    cell["spec"][1]["returned"] = 128
    cell["warm"] = [{**x, "returned": 64} for x in cell["spec"]]  # warm: marked, not decisive
    v = reliability.judge(report)
    assert v.reliable and "warm speculative server counted" in v.warnings[0]


def test_warm_figures_that_disagree_are_marked_but_do_not_decide() -> None:
    report = _report(QUIET_PLAIN, QUIET_SPEC, _cost_model(), QUIET_LOAD, (190.0, 95.0, 200.0))
    v = report.reliability
    assert v["reliable"] and v["warnings"][0].startswith("code-edit (1 client): warm speedup")
    (row,) = bench_report.rows(report.to_json())
    assert row[-3].endswith("unreliable") and not row[4].endswith("unreliable")
    assert "Warm figures marked unreliable (not the headline)" in bench_report.markdown(
        report.to_json()
    )


def test_the_thresholds_are_named_and_reported() -> None:
    assert reliability.THRESHOLDS == {
        "spread_max": reliability.SPREAD_MAX,
        "plain_floor": reliability.PLAIN_FLOOR,
        "limit_floor": reliability.LIMIT_FLOOR,
        "batch_floor": reliability.BATCH_FLOOR,
        "load_slack": reliability.LOAD_SLACK,
    }
    assert reliability.BENCH_THRESHOLDS == {
        **reliability.THRESHOLDS,
        "returned_floor": reliability.RETURNED_FLOOR,
    }
    report = _report(QUIET_PLAIN, QUIET_SPEC, _cost_model(), QUIET_LOAD)
    assert report.reliability["thresholds"]["spread_max"] == 1.5


def test_load_and_threads() -> None:
    assert reliability.server_threads(["-m", "x.gguf", "-t", "4"]) == 4
    assert reliability.server_threads(["--threads=2"]) == 2
    assert reliability.server_threads(["-m", "x.gguf"]) is None
    # the server's own threads are not "other work" while it runs
    assert QUIET_LOAD.others() == pytest.approx(0.2)
    assert reliability.load_reason(QUIET_LOAD) is None
    # default threads take every core: one other busy CPU is the slack
    assert reliability.load_reason(reliability.HostLoad(16, None, 0.8, (16.9,), 16.5)) is None
    assert reliability.load_reason(reliability.HostLoad(16, None, 2.5)) is not None
    assert reliability.HostLoad(2, 1, None).others() is None
    assert reliability.HostLoad.from_json(BUSY_LOAD.to_json()) == BUSY_LOAD
    now = reliability.load_now()
    assert now is None or now >= 0


def test_busy_now_sees_a_spinning_process_that_the_load_average_would_lag() -> None:
    """`busy_now` counts the CPUs busy during its own window: a process spinning through
    the window shows as (at least about) one busy CPU, whatever came before."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        busy = reliability.busy_now(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert busy is not None and 0.7 <= busy <= (os.cpu_count() or 1) + 0.01


def test_no_cost_model_says_what_was_skipped_and_keeps_the_counters_it_read() -> None:
    report = _report(QUIET_PLAIN, QUIET_SPEC, None, QUIET_LOAD)
    s = report.workloads[0].summary
    assert s["where_the_rest_goes"] == costmodel.NO_COST_MODEL
    assert "no speculative counters" not in s["where_the_rest_goes"]
    assert s["drafted"] == 120 and s["accepted"] == 90 and s["counters_from"] == "/metrics"
    md = bench_report.markdown(report.to_json())
    assert "- cost model: skipped (`--no-cost-model`)" in md
    assert "the speculative counters were read as usual (from /metrics)" in md
    assert report.reliability["notes"] == [
        "plain speed against an estimate (the cost model was skipped)"
    ]
    # without --no-cost-model, a server without counters is still told apart
    assert "no speculative counters" in costmodel.where_the_rest_goes(None)


def test_a_committed_report_from_before_verdicts_is_judged_when_rendered() -> None:
    root = Path(__file__).resolve().parents[2]
    raw = json.loads(
        (root / "reports" / "bench-gemma3-270m-ngram-llamacpp-cpu-9036434bcbf5.json").read_text()
    )
    raw.pop("reliability")
    raw.pop("host_load")
    v = bench_report.verdict(raw)
    assert "load (not recorded: a report from before the load check)" in v["notes"]
    assert "server threads and load not recorded" in bench_report.markdown(raw)


def test_bench_records_the_load_threads_and_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bench run (servers stubbed) samples the load around the run, reads the server's
    threads from its command, and judges itself; with --no-cost-model it says so."""
    from llamaspec.engine import toolchain
    from llamaspec.engine.artifact import Artifact
    from llamaspec.models import dialects

    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF" + bytes(100))
    art = Artifact("llamacpp-cpu-0123456789ab", tmp_path, {"backend": "cpu"}, False)

    @contextmanager
    def running(*_a, **_k):
        yield None

    speeds = iter([95.0, 150.0, 94.0, 147.0])
    monkeypatch.setattr(bench, "server_help", lambda _s: "")
    monkeypatch.setattr(dialects, "dialect_for", lambda *_a: "upstream")
    monkeypatch.setattr(bench, "running", running)
    monkeypatch.setattr(bench, "run", lambda *_a: Sample(64, next(speeds), 1.0, 10, 8, 3))
    monkeypatch.setattr(costmodel, "counters", lambda _s: costmodel.SpecCounters(available=True))
    monkeypatch.setattr(toolchain, "machine", lambda: {"description": "a CPU, 2 cores"})
    loads = iter([1.1, 1.2, 1.0])
    monkeypatch.setattr(reliability, "busy_now", lambda: 0.1)  # CPUs busy just before
    monkeypatch.setattr(reliability, "load_now", lambda: next(loads))
    plan = bench.BenchPlan("r", ("-m", str(target), "-t", "1"), ("--spec-type", "ngram-simple"),
                           ("ngram-simple",), target, None, 17)  # fmt: skip
    report = bench.bench(
        art, plan, [bench.WORKLOADS["qa"]], tmp_path, Console(), concurrency=(1,),
        repetitions=2, cost_model=False, write_report=False,
    )  # fmt: skip
    assert report.host_load == {
        "cpus": reliability.os.cpu_count(),
        "server_threads": 1,
        "before": 0.1,
        "before_from": "busy",
        "during": [1.1, 1.2],
        "after": 1.0,
    }
    assert report.reliability == reliability.judge(report.to_json()).to_json()
    assert report.workloads[0].summary["where_the_rest_goes"] == costmodel.NO_COST_MODEL
    assert report.workloads[0].summary["speedup_by_repetition"] == [1.579, 1.564]


def _tune(first: dict, second: dict, load: reliability.HostLoad | None):
    from llamaspec.perf import tune_report

    win = tune_report.CandidateResult(
        "ngram-mod 12/4/48",
        {"types": ["ngram-mod"]},
        (),
        passed=True,
        score=round(tune_report.score(first), 4),
        speedups=first,
        speedups_pass2=second,
        score_pass2=round(tune_report.score(second), 4),
        final_score=1.5,
        spread=0.1,
    )
    return tune_report.TuneReport(
        recipe="gemma3-270m-ngram",
        artifact_id="llamacpp-cpu-0123456789ab",
        engine="llama.cpp",
        commit="0c1e57098bba",
        machine={"description": "AMD EPYC, 2 cores; no GPU"},
        date="2026-11-25",
        workloads=tuple(first),
        plain_tps={"copy": 7.2},
        candidates_total=1,
        results=(win,),
        winner=win,
        checked_on="t.gguf",
        host_load=load.to_json() if load else None,
    )


def test_tune_says_when_its_winner_cannot_be_trusted(tmp_path: Path) -> None:
    from llamaspec.perf import tune_report

    busy = _tune({"copy": 18.71, "qa": 1.1}, {"copy": 2.88, "qa": 1.0}, BUSY_LOAD)
    v = busy.to_json()["reliability"]
    assert not v["reliable"] and "copy 18.71× in pass 1, 2.88× in pass 2" in v["reasons"][0]
    assert "machine loaded" in v["reasons"][1]
    md = tune_report.write_report(busy, tmp_path, "t").read_text()
    assert "**Unreliable: no headline.**" in md and "Fastest over both passes" not in md
    assert "Unreliable: the fastest over both passes was **ngram-mod 12/4/48**" in md
    assert "server threads: 1; load: 7.5 CPUs busy before (2-second sample), 8.0 after" in md
    # a report from before the 2-second sample said the load average, and still does
    old = {**BUSY_LOAD.to_json()}
    old.pop("before_from")
    assert reliability.HostLoad.from_json(old).before_from == reliability.LOADAVG
    assert reliability.before_text(old) == "7.5 before (1-minute average)"
    quiet = _tune({"copy": 1.88, "qa": 1.31}, {"copy": 2.2, "qa": 1.2}, QUIET_LOAD)
    assert quiet.to_json()["reliability"]["reliable"]
    md = tune_report.write_report(quiet, tmp_path, "q").read_text()
    assert "Fastest over both passes: **ngram-mod 12/4/48**" in md and "Unreliable" not in md
    # a report from before the load check keeps its file's keys (no verdict written)
    old = _tune({"copy": 1.88}, {"copy": 2.2}, None).to_json()
    assert "reliability" not in old and "host_load" not in old
