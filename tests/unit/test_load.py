"""The load test (`llamaspec load`): its plan and refusals, the schedule, outcome
classification, percentiles, the memory slope, the comparison with the reference, one
request against a small fake server (streamed, hung up, refused), and the report written
whole (also a partial one)."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.cli import load as cli
from llamaspec.cli.main import make_parser
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.perf import load, load_plan, load_report
from llamaspec.perf.load_faults import Outage, Stall
from llamaspec.perf.load_plan import LoadPlan, LoadPrompt, Planned, Record

pytestmark = pytest.mark.unit


def parse(*argv: str):
    return make_parser().parse_args(["load", "gemma3-270m-q4-draft", *argv])


# ---------------------------------------------------------------- the plan


def test_the_command_line_defaults_are_the_plans() -> None:
    plan = cli.plan_from(parse())
    assert plan == LoadPlan()
    assert cli.REQUESTS == load_plan.DEFAULT_REQUESTS
    assert cli.DURATION == load_plan.DEFAULT_DURATION
    assert cli.N_PREDICT == load_plan.DEFAULT_N_PREDICT
    assert cli.REQUEST_TIMEOUT == load_plan.DEFAULT_REQUEST_TIMEOUT


def test_the_command_line_reads_clients_faults_and_shares() -> None:
    args = parse(
        "--clients", "1,8", "--clients", "8", "--clients", "4", "--fault", "kill@12.5",
        "--fault", "stall", "--fault", "overflow", "--cancel-share", "0.5", "--no-exact",
        "--ctx", "256", "-t", "1", "--requests", "5", "--duration", "30",
    )  # fmt: skip
    plan = cli.plan_from(args)
    assert plan.clients == (1, 8, 4)
    assert [str(f) for f in plan.faults] == ["kill@12.5", "stall", "overflow"]
    assert plan.fault("kill").at == 12.5 and plan.fault("stall") is not None
    assert plan.cancel_share == 0.5 and plan.exact is False
    assert (plan.ctx, plan.threads, plan.requests, plan.duration) == (256, 1, 5, 30.0)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--clients", "0"), "--clients 0"),
        (("--clients", "10000"), "--clients 10000"),
        (("--clients", "many"), "many"),
        (("--clients", ","), "names no client count"),
        (("--duration", "0"), "--duration 0"),
        (("--duration", "inf"), "--duration inf"),
        (("--requests", "0"), "--requests 0"),
        (("--stream-share", "1.5"), "--stream-share 1.5"),
        (("--cancel-share", "-0.1"), "--cancel-share -0.1"),
        (("--fault", "explode"), "'explode'"),
        (("--fault", "kill"), "kill@20"),
        (("--fault", "kill@0"), "kill@0"),
        (("--fault", "stall@3"), "takes no time"),
        (("--fault", "kill@1", "--fault", "kill@2"), "once"),
        (("--n-predict", "2"), "--n-predict 2"),
        (("--ctx", "16"), "--ctx 16"),
        (("--request-timeout", "0"), "--request-timeout 0"),
    ],
)
def test_bad_plans_are_one_paragraph_each(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(LlamaspecError) as caught:
        cli.plan_from(parse(*argv))
    assert named in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_unknown_recipe_is_refused_before_the_artifact_is_read(tmp_path: Path) -> None:
    args = make_parser().parse_args(["load", "no-such-recipe", "--dist", str(tmp_path)])
    with pytest.raises(LlamaspecError, match="no-such-recipe"):
        cli.cmd_load(args, Console(quiet=True))


# ---------------------------------------------------------------- schedule and outcomes


def prompts() -> list[LoadPrompt]:
    return [
        LoadPrompt("a", "workload", "text a", 3, 8),
        LoadPrompt("b", "workload", "text b", 3, 8),
        LoadPrompt("over-context", "over-context", (1, 2, 3), 300, 8),
    ]


def test_the_schedule_takes_the_prompts_in_turn_and_is_seeded() -> None:
    one = load_plan.schedule(prompts(), 30, 0.5, 0.5, seed=3)
    assert [p.prompt.name for p in one[:4]] == ["a", "b", "over-context", "a"]
    assert one == load_plan.schedule(prompts(), 30, 0.5, 0.5, seed=3)
    assert any(p.stream for p in one) and any(not p.stream for p in one)
    assert all(p.stream for p in one if p.cancel) and any(p.cancel for p in one)
    assert not any(p.stream for p in load_plan.schedule(prompts(), 20, 0.0, 1.0, 0))
    assert not any(p.cancel for p in load_plan.schedule(prompts(), 20, 1.0, 0.0, 0))
    assert load_plan.schedule([], 5, 0.5, 0.5, 0) == []


def test_replies_are_classified_with_the_servers_reason() -> None:
    assert load_plan.classify_reply(200, {"tokens": [1]}) == ("ok", "")
    outcome, reason = load_plan.classify_reply(
        200, {"truncated": True, "stop_type": "limit", "tokens_predicted": 8}
    )
    assert outcome == "truncated" and "'limit'" in reason
    over = {
        "error": {
            "code": 400,
            "message": "request (902 tokens) exceeds the available context size (512 tokens)",
            "type": "exceed_context_size_error",
        }
    }
    assert load_plan.classify_reply(400, over)[0] == "error: over context"
    assert "902 tokens" in load_plan.classify_reply(400, over)[1]
    assert load_plan.classify_reply(503, {"error": {"message": "busy"}}) == (
        "error: http 503",
        "busy",
    )
    assert load_plan.classify_reply(500, None)[0] == "error: http 500"


def test_transport_failures_are_placed_against_the_outages() -> None:
    outages = [(10.0, 15.0)]
    assert load_plan.classify_transport(8.0, 10.5, outages) == load_plan.KILLED
    assert load_plan.classify_transport(11.0, 11.1, outages) == load_plan.DOWN
    assert load_plan.classify_transport(16.0, 16.5, outages) == load_plan.CONNECTION
    assert load_plan.classify_transport(12.0, 12.1, [(10.0, None)]) == load_plan.DOWN
    assert load_plan.classify_transport(1.0, 2.0, []) == load_plan.CONNECTION


def test_outcomes_are_counted_ok_first() -> None:
    got = load_plan.count(["error: x", "ok", "cancelled", "ok", "truncated"])
    assert list(got) == ["ok", "truncated", "cancelled", "error: x"]
    assert got["ok"] == 2


# ---------------------------------------------------------------- statistics


def test_percentiles_interpolate_like_numpy() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert load_plan.percentile(xs, 50) == pytest.approx(50.5)
    assert load_plan.percentile(xs, 95) == pytest.approx(95.05)
    assert load_plan.percentile(xs, 99) == pytest.approx(99.01)
    assert load_plan.percentile([7.0], 99) == 7.0
    assert load_plan.percentile([], 50) is None
    assert load_plan.percentiles([]) == {"n": 0, "p50": None, "p95": None, "p99": None}
    with pytest.raises(ValueError):
        load_plan.percentile(xs, 101)


def test_the_memory_slope_is_least_squares_per_minute() -> None:
    line = [(t, 100.0 + 0.5 * t) for t in range(0, 60, 2)]
    assert load_plan.slope_per_minute(line) == pytest.approx(30.0)
    flat = [(0.0, 5.0), (1.0, 7.0), (2.0, 5.0), (3.0, 7.0)]
    assert load_plan.slope_per_minute(flat) == pytest.approx(24.0)  # 0.4 MB/s
    assert load_plan.slope_per_minute([(1.0, 5.0), (1.0, 9.0)]) is None
    assert load_plan.slope_per_minute([]) is None


def test_first_difference() -> None:
    assert load_plan.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert load_plan.first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert load_plan.first_difference([1, 2], [1, 2, 3]) == 2
    assert load_plan.first_difference([], []) is None


# ---------------------------------------------------------------- one request, a fake server


class Fake(BaseHTTPRequestHandler):
    """/completion: tokens 1..n_predict; a prompt of over 100 tokens is refused as the
    engine refuses it; streamed as `data:` lines."""

    def log_message(self, *args) -> None:
        return None

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if isinstance(req["prompt"], list) and len(req["prompt"]) > 100:
            self._send(400, {"error": {"message": "exceeds the available context size",
                                       "type": "exceed_context_size_error"}})  # fmt: skip
            return
        n = req["n_predict"]
        if not req["stream"]:
            self._send(200, {"tokens": list(range(1, n + 1)), "stop": True})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for i in range(1, n + 1):
                self.wfile.write(f"data: {json.dumps({'tokens': [i], 'stop': False})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b'data: {"tokens": [], "stop": true}\n\n')
        except OSError:
            pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    ("stream", "cancel", "prompt", "outcome", "tokens"),
    [
        (False, False, "hello", "ok", 8),
        (True, False, "hello", "ok", 8),
        (True, True, "hello", "cancelled", load_plan.CANCEL_AFTER),
        (False, False, tuple(range(200)), "error: over context", 0),
        (True, False, tuple(range(200)), "error: over context", 0),
    ],
)
def test_one_request(fake_url, stream, cancel, prompt, outcome, tokens) -> None:
    p = LoadPrompt("p", "workload", prompt, 5, 8)
    rec = Record("plain", 0, "p", "workload", stream, cancel)
    load.one_request(fake_url, Planned(0, p, stream, cancel), rec, lambda: 1.0, 10.0)
    assert rec.outcome == outcome, rec.reason
    assert rec.n_tokens == tokens
    if stream and outcome == "ok":
        assert rec.tokens == list(range(1, 9)) and rec.ttft_ms is not None
        assert len(rec.itl_ms) == 7


def test_a_refused_connection_leaves_the_outcome_to_the_outages() -> None:
    p = LoadPrompt("p", "workload", "x", 1, 8)
    rec = Record("spec", 0, "p", "workload", False, False)
    load.one_request("http://127.0.0.1:9", Planned(0, p, False, False), rec, lambda: 3.0, 2.0)
    assert rec.outcome == "" and "ConnectError" in rec.reason


def test_server_args_set_slots_context_threads_and_metrics() -> None:
    from llamaspec.perf.bench import BenchPlan

    p = BenchPlan("r", ("-m", "t.gguf", "-c", "4096", "-np", "1"), ("--spec-type", "x"), (),
                  Path("t.gguf"), None, 9)  # fmt: skip
    plan = LoadPlan(threads=1)
    args = load.server_args(p, plan, 256, 8, True, {"--metrics"})
    assert args[args.index("-c") + 1] == str(256 * 8) and args[args.index("-np") + 1] == "8"
    assert "--spec-type" in args and args[-1] == "--metrics" and "-t" in args
    plain = load.server_args(p, plan, 256, 8, False, set())
    assert "--spec-type" not in plain and "--metrics" not in plain
    assert load.recipe_ctx(p) == 4096


# ---------------------------------------------------------------- the report


def fake_run(complete: bool = True) -> load.LoadRun:
    plan = LoadPlan(clients=(2,), requests=4, faults=(load_plan.parse_fault("kill@1"),))
    run = load.LoadRun("r", plan, True, 256)
    run.prompts = prompts()
    run.reference = {"a": [1, 2, 3], "b": [4, 5, 6]}
    spec = load.PhaseRun(0, "spec", 2, "speculative, 2 slot(s)", 1.0, 11.0)
    spec.records = [
        Record("spec", 0, "a", "workload", True, False, 1, 2, "ok", "", 50.0, [10.0, 12.0],
               [1, 2, 3], 3),
        Record("spec", 0, "b", "workload", False, False, 1, 3, "ok", "", None, [], [4, 5, 7], 3),
        Record("spec", 0, "over-context", "over-context", False, False, 2, 3,
               "error: over context", "too long"),
        Record("spec", 0, "a", "workload", True, True, 3, 4, "cancelled", "hung up", 40.0, [9.0],
               [1, 2, 3], 3),
        Record("spec", 0, "a", "workload", False, False, 4, 5, load_plan.KILLED, "ReadError"),
    ]  # fmt: skip
    spec.rss = [(2.0, 100.0), (3.0, 101.0), (4.0, 102.0)]
    spec.spec = {"drafts": 2.0, "drafted": 10.0, "accepted": 8.0}
    spec.counters_available = True
    plain = load.PhaseRun(1, "plain", 2, "plain, 2 slot(s)", 12.0, 20.0)
    plain.records = [Record("plain", 1, "a", "workload", False, False, 13, 14, "ok", "", None,
                            [], [1, 2, 3], 3)]  # fmt: skip
    run.phases = [spec, plain]
    run.outages = [Outage(0, "spec", 4.5, 1, 7.0)]
    run.stalls = [Stall(0, "spec", 8.0, 9.5, None, 1, "freed by the server")]
    return run


def artifact(tmp_path: Path) -> Artifact:
    manifest = {"engine": "llama.cpp", "commit": "0" * 40, "backend": "cpu"}
    return Artifact("llamacpp-cpu-x", tmp_path, manifest, reused=False)


def test_the_report_counts_compares_and_lists_faults(tmp_path: Path) -> None:
    report = load_report.to_json(fake_run(), artifact(tmp_path), None, wall=30.0)
    assert report["complete"] is True and report["speculative"] is True
    assert report["outcomes"]["ok"] == 3 and report["cancelled"] == 1
    assert report["unexpected_errors"] == 0  # the over-context refusal and the kill expected
    e = report["exactness"]
    assert (e["compared"], e["identical"]) == (3, 2)
    assert e["differences"] == [{"prompt": "b", "mode": "spec", "clients": 2, "position": 2}]
    spec = report["by_mode"]["spec"]
    assert spec["acceptance"]["rate"] == 0.8
    assert spec["ttft_ms"]["n"] == 2 and spec["itl_ms"]["n"] == 3
    assert spec["tokens_per_second"] == pytest.approx(0.9)
    assert report["phases"][0]["rss_mb"]["slope_mb_per_min"] == pytest.approx(60.0)
    kill = report["faults"]["kill"][0]
    assert kill["time_to_healthy_s"] == 2.5 and kill["lost_in_flight"] == 1
    assert report["faults"]["stall"][0]["slot_back_after_s"] == 1.5


def test_the_report_is_written_whole_and_a_partial_one_says_so(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    report = load_report.to_json(fake_run(), artifact(tmp_path), "interrupted (Ctrl-C)")
    stem = load_report.write(report, out, "load-r-x.y", Console(quiet=True))
    assert stem.name == "load-r-x.y"
    names = sorted(p.name for p in out.iterdir())
    assert "load-r-x.y.json" in names and "load-r-x.y.md" in names
    assert not [n for n in names if ".tmp" in n]  # nothing half-written left behind
    back = json.loads((out / "load-r-x.y.json").read_text())
    assert back["complete"] is False and back["stopped"] == "interrupted (Ctrl-C)"
    md = (out / "load-r-x.y.md").read_text()
    assert "**partial**" in md and "SIGKILLed" in md and "differs at token 2" in md


def test_a_plain_only_recipe_says_so(tmp_path: Path) -> None:
    run = fake_run()
    run.speculative = False
    run.phases = run.phases[1:]
    report = load_report.to_json(run, artifact(tmp_path), None)
    assert "plain phases only" in report["arrangement"] and list(report["by_mode"]) == ["plain"]
    assert "plain phases only" in load_report.markdown(report)


def test_a_server_that_never_becomes_healthy_is_one_error_with_its_log(tmp_path: Path) -> None:
    """A bounded wait: the error names the wait and carries the log's last lines."""
    bin_dir = tmp_path / "art" / "bin"
    bin_dir.mkdir(parents=True)
    server = bin_dir / "llama-server"
    server.write_text("#!/bin/sh\necho 'loading the model, slowly'\nexec sleep 30\n")
    server.chmod(0o755)
    art = Artifact("llamacpp-cpu-x", tmp_path / "art", {"engine": "llama.cpp"}, reused=False)
    holder = load.Holder(art, ["-m", "x.gguf"], tmp_path / "logs" / "s.log", ready=1.0)
    try:
        with pytest.raises(LlamaspecError) as caught:
            holder.start()
    finally:
        holder.close()
    assert "not healthy after 1s" in caught.value.message
    assert "loading the model, slowly" in str(caught.value.details)


def test_the_edge_prompts_come_early_in_the_rotation() -> None:
    w = [LoadPrompt(f"w{i}", "workload", "x", 1, 8) for i in range(4)]
    e = [LoadPrompt(k, k, (1,), 1, 8) for k in ("near-limit", "over-context", "overflow")]
    got = [p.name for p in load.interleave(w, e)]
    assert got == ["w0", "near-limit", "w1", "over-context", "w2", "overflow", "w3"]
    assert [p.name for p in load.interleave(w[:1], e)] == [
        "w0", "near-limit", "over-context", "overflow"
    ]  # fmt: skip
    assert load.interleave([], e) == e


def test_acceptance_over_time_and_the_slope_after_warm_up() -> None:
    """A soak is judged by acceptance in equal spans of time and the memory slope once the
    server has warmed up: a fall in acceptance shows in its span, start-up growth does not
    count as a leak."""
    # 60 s of cumulative counters: 10 drafted a second, 8 accepted until 40 s, then 2
    samples = [(float(t), 10.0 * t, 8.0 * min(t, 40) + 2.0 * max(t - 40, 0)) for t in range(61)]
    win = load_plan.acceptance_windows(samples, windows=6)
    assert [w["rate"] for w in win] == [0.8, 0.8, 0.8, 0.8, 0.2, 0.2]
    assert win[0]["from_s"] == 0.0 and win[-1]["to_s"] == 60.0 and win[0]["drafted"] == 100
    nothing = [(float(t), 0.0, 0.0) for t in range(5)]
    assert all(w["rate"] is None for w in load_plan.acceptance_windows(nothing))
    assert load_plan.acceptance_windows(samples[:1]) == []
    # memory: +100 MB over the first 10 s (loading), flat after
    rss = [(float(t), 100.0 + 10.0 * min(t, 10)) for t in range(60)]
    assert load_plan.slope_per_minute(rss) > 10
    assert load_plan.slope_after_warmup(rss) == pytest.approx(0.0)
    assert load_plan.slope_after_warmup([]) is None


def test_a_soak_report_shows_acceptance_over_time_and_says_it_ran_no_plain_phase(
    tmp_path: Path,
) -> None:
    run = fake_run()
    run.plan = dataclasses.replace(run.plan, speculative_only=True)
    run.phases = run.phases[:1]
    run.phases[0].accept = [(2.0, 0.0, 0.0), (6.0, 10.0, 9.0), (10.0, 20.0, 14.0)]
    report = load_report.to_json(run, artifact(tmp_path), None)
    assert "speculative phases only (--speculative-only" in report["arrangement"]
    rates = [w["rate"] for w in report["phases"][0]["acceptance_over_time"]]
    assert rates == [0.9, 0.5]  # spans without a sample are left out
    md = load_report.markdown(report)
    assert "acceptance over time (2 equal spans that drafted): 90.0%, 50.0% (min 50.0%" in md
    assert "MB/min after its first 20%" in md


def test_speculative_only_on_a_recipe_without_speculation_is_refused(tmp_path: Path) -> None:
    run = fake_run()
    run.speculative = False
    run.plan = dataclasses.replace(run.plan, speculative_only=True)
    with pytest.raises(LlamaspecError) as caught:
        load.execute(artifact(tmp_path), None, run, None, tmp_path, Console(quiet=True))
    assert "has no speculation" in caught.value.message
    assert "leave the option out" in caught.value.message
