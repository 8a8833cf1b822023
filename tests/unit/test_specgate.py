"""The speculation gate (issue 43): the /metrics reader, the verdict on a loaded draft that
drafts nothing, the smoke's use of it, and the recipes refused when rendered."""

from __future__ import annotations

import contextlib
import http.server
import io
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaspec import config
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects, recipes
from llamaspec.proof import smoke
from llamaspec.runtime import metrics, serve, specgate
from llamaspec.runtime.client import Completion

pytestmark = pytest.mark.unit

# /metrics of upstream llama-server at the default pin after 24 tokens with `-md` alone
IDLE_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 8
llamacpp:tokens_predicted_total 24
llamacpp:n_decode_total 25
llamacpp:spec_decode_num_draft_tokens_total 0
llamacpp:spec_decode_num_accepted_tokens_total 0
llamacpp:spec_decode_num_drafts_total 0
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 29.2834
llamacpp:n_busy_slots_per_decode 1
"""
DRAFTING_PAGE = """\
llamacpp:tokens_predicted_total 1.2e+02
llamacpp:spec_decode_num_draft_tokens_total 80
llamacpp:spec_decode_num_accepted_tokens_total 60
llamacpp:spec_decode_num_drafts_total 10
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 5
"""
IK_PAGE = "llamacpp:tokens_predicted_total 24\nllamacpp:kv_cache_tokens 40\n"


def counters(text: str) -> metrics.SpecCounters:
    return metrics.spec_counters(metrics.parse(text))


def test_the_parser_reads_the_text_format_strictly() -> None:
    page = metrics.parse(
        '# a comment\n\nx_total{a="1",b="q\\"uote"} 3 1700000000\ny NaN\nz +Inf\nw -4.5e-1\n'
    )
    assert page["x_total"] == {(("a", "1"), ("b", 'q"uote')): 3.0}
    assert math.isnan(page["y"][()]) and page["z"][()] == math.inf and page["w"][()] == -0.45
    for bad in ("llamacpp:x", "llamacpp:x twelve", "x{a=1} 2", "9x 1", 'x{a="1" 2'):
        with pytest.raises(metrics.MetricsFormatError, match="unreadable"):
            metrics.parse(bad + "\n")


def test_speculation_counters_of_upstream_and_ik_pages() -> None:
    idle = counters(IDLE_PAGE)
    assert (idle.drafts, idle.drafted, idle.accepted, idle.predicted) == (0, 0, 0, 24)
    assert idle.available and idle.per_pos == ()
    busy = counters(DRAFTING_PAGE)
    assert (busy.drafts, busy.drafted, busy.accepted, busy.predicted) == (10, 80, 60, 120)
    assert busy.per_pos == (9, 0, 5)
    delta = busy - idle
    assert (delta.drafted, delta.predicted, delta.available) == (80, 96, True)
    assert not counters(IK_PAGE).available  # ik_llama.cpp exports no speculation counters
    assert "no speculation counters" in counters(IK_PAGE).describe()


def test_what_a_command_line_loads() -> None:
    md = specgate.loaded(["-m", "t.gguf", "-md", "d.gguf", "--spec-draft-n-max", "0"])
    assert (md.draft_model, md.draft_flag, md.types, md.n_max, md.drafts) == (
        "d.gguf",
        "-md",
        (),
        "0",
        True,
    )
    typed = specgate.loaded(["--spec-draft-model=d.gguf", "--spec-type", "draft-simple,ngram-mod"])
    assert typed.model_types == ("draft-simple",) and typed.draft_flag == "--spec-draft-model"
    assert specgate.loaded(["--spec-type", "draft-mtp"]).mtp == "--spec-type draft-mtp"
    assert specgate.loaded(["-mtp"]).mtp == "-mtp"
    assert specgate.loaded(["-mtp", "-no-mtp"]).mtp is None
    ik = specgate.loaded(["--spec-type", "mtp:n_max=2", "--spec-type", "ngram-mod:n_max=8"])
    assert ik.types == ("mtp", "ngram-mod") and ik.mtp == "--spec-type mtp"
    assert not specgate.loaded(["--spec-type", "ngram-mod"]).drafts
    env = specgate.loaded(["-m", "t"], {"LLAMA_ARG_SPEC_DRAFT_MODEL": "d.gguf"})
    assert (env.draft_model, env.draft_flag) == ("d.gguf", "LLAMA_ARG_SPEC_DRAFT_MODEL")


def test_a_loaded_draft_that_drafts_nothing_is_one_loud_paragraph() -> None:
    argv = ["llama-server", "-m", "t.gguf", "-md", "d.gguf", "--metrics"]
    v = specgate.judge(argv, metrics.SpecCounters(available=True), counters(IDLE_PAGE))
    assert v.kind == "idle" and v.failed
    assert "\n" not in v.message and v.message.startswith("SPECULATION GATE")
    for part in ("d.gguf (-md)", "24 generated tokens", "0 draft tokens", "#23988", "#25345"):
        assert part in v.message, part
    assert "Fix: add `--spec-type draft-simple`" in v.message
    assert v.to_json()["source"] == "/metrics (llamacpp:spec_decode_*)"
    # the ik spelling of the fix, and older pins where -md alone drafts: another cause
    ik = specgate.judge(argv, None, counters(IDLE_PAGE), dialect="ik-spec-type")
    assert "--spec-type draft`" in ik.message
    legacy = specgate.judge(
        [*argv, "--draft-max", "0"], None, counters(IDLE_PAGE), dialect="upstream-legacy"
    )
    assert "#25345" not in legacy.message and "draft length is 0" in legacy.message


@pytest.mark.parametrize(
    ("argv", "page", "kind"),
    [
        (["-md", "d", "--spec-type", "draft-simple"], DRAFTING_PAGE, "drafting"),
        (["--spec-type", "ngram-mod"], IDLE_PAGE, "none"),
        ([], IDLE_PAGE, "none"),
        (["-md", "d"], IK_PAGE, "unknown"),  # no counters to read
        (["-md", "d"], "llamacpp:spec_decode_num_drafts_total 0\n", "unknown"),  # no tokens yet
        (["--spec-type", "draft-mtp"], IDLE_PAGE, "idle"),
    ],
)
def test_verdicts(argv: list[str], page: str, kind: str) -> None:
    assert specgate.judge(argv, None, counters(page)).kind == kind


def test_mtp_that_drafts_nothing_names_the_missing_head() -> None:
    v = specgate.judge(["-mtp"], None, counters(IDLE_PAGE), dialect="ik-legacy")
    assert v.failed and "MTP head" in v.message


def completion(draft_n: int | None, source: str | None) -> Completion:
    return Completion((1, 2, 3), "abc", 10.0, draft_n, draft_n, 3, source)


def test_the_smoke_falls_back_to_the_replies_where_no_counters_are_exported() -> None:
    argv = ["-m", "t", "-md", "d"]
    v = specgate.judge_replies(argv, None, None, [completion(None, None)], "ik-legacy", (5, 4))
    assert v.kind == "drafting" and v.source == "timings"
    v = specgate.judge_replies(argv, None, counters(IK_PAGE), [completion(6, "log")], "ik-legacy")
    assert v.kind == "drafting" and "server log" in v.message
    v = specgate.judge_replies(argv, None, None, [completion(0, "timings")], "ik-spec-type")
    assert v.failed and "timings.draft_n" in v.message
    # nothing reported drafts at all: the gate cannot tell (the smoke's own check still gates)
    assert (
        specgate.judge_replies(argv, None, None, [completion(None, None)], None).kind == "unknown"
    )
    report = smoke.SmokeReport("a", "custom", tuple(argv), gate=v)
    assert not report.passed and smoke._why(report) == v.message
    assert report.to_json()["gate"]["kind"] == "idle"


def test_metrics_flag_only_where_the_binary_has_it() -> None:
    assert metrics.flag(["-md", "d"], {"--metrics"}) == ["--metrics"]
    assert metrics.flag(["--metrics"], {"--metrics"}) == []
    assert metrics.flag([], {"--port"}) == []


# --- recipes refused when rendered --------------------------------------------------------

UPSTREAM_HELP = (
    "-m, --model FNAME   model\n--host HOST   host\n--port PORT   port\n"
    "--spec-draft-model, -md, --model-draft FNAME   draft\n"
    "--spec-type none,draft-simple,draft-mtp,ngram-mod\n"
    "--spec-draft-n-max N   n\n--spec-draft-n-min N   n\n--spec-draft-p-min P   p\n"
)


def recipe(types: list[str], extra: tuple[str, ...] = (), **engines) -> config.Recipe:
    return config.Recipe(
        name="mine",
        pair="p",
        description="d",
        spec=config.SpecSettings(types=tuple(types)),
        server=config.ServerSettings(extra=extra),
        engines=engines,
    )


@pytest.mark.parametrize("flag", ["-md", "--model-draft", "--spec-draft-model"])
def test_a_draft_model_in_extra_without_a_draft_type_is_refused(flag: str) -> None:
    r = recipe(["ngram-mod"], (flag, "/m/draft.gguf"))
    with pytest.raises(LlamaspecError) as err:
        recipes.render(r, "llama.cpp", "upstream", "t.gguf", None)
    text = str(err.value)
    assert "'mine'" in text and flag in text and "#25345" in text and "spec: types:" in text
    # where -md alone drafts (older pins), the same recipe drafts: rendered
    cmd = recipes.render(r, "llama.cpp", "upstream-legacy", "t.gguf", None)
    assert flag in cmd.argv
    # with a type that drafts with it, rendered
    assert recipes.render(recipe(["draft"], (flag, "x")), "llama.cpp", "upstream", "t", "d").argv


def test_the_engine_override_decides_whether_the_draft_drafts() -> None:
    r = recipe(["ngram-mod"], ("-md", "x"), **{"ik_llama.cpp": {"types": ["draft"]}})
    assert recipes.render(r, "ik_llama.cpp", "ik-spec-type", "t", "d").argv
    with pytest.raises(LlamaspecError, match="engines: llama.cpp"):
        recipes.render(r, "llama.cpp", "upstream", "t", "d")


def test_a_spec_type_the_builds_help_lacks_is_refused_naming_the_recipe() -> None:
    r = recipe(["dspark"])
    cmd = recipes.render(r, "llama.cpp", "upstream", "t.gguf", "d.gguf")
    with pytest.raises(LlamaspecError) as err:
        recipes.check_spec_types(cmd, r, UPSTREAM_HELP, "build llamacpp-cpu-x")
    text = str(err.value)
    assert "Recipe 'mine' asks for spec type dspark (--spec-type draft-dspark)" in text
    assert "build llamacpp-cpu-x" in text and "draft, mtp, ngram-mod" in text
    assert "\n" not in text
    ok = recipes.render(recipe(["draft"]), "llama.cpp", "upstream", "t.gguf", "d.gguf")
    recipes.check_spec_types(ok, recipe(["draft"]), UPSTREAM_HELP, "b")
    recipes.check_spec_types(cmd, r, "--port N\n", "b")  # no list in the help: not judged


def test_the_draft_model_flags_cover_every_dialect() -> None:
    for d in dialects.DIALECTS.values():
        if "draft_model" in d.flags:
            assert d.flags["draft_model"] in dialects.DRAFT_MODEL_FLAGS
    assert specgate.DRAFT_MODEL_FLAGS is dialects.DRAFT_MODEL_FLAGS


# --- serve: the watcher -------------------------------------------------------------------


@contextlib.contextmanager
def metrics_server(page: str) -> Iterator[int]:
    """A loopback HTTP server whose /metrics is `page`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_serve_watcher_says_once_when_the_draft_drafts_nothing() -> None:
    said: list[str] = []
    argv = ["llama-server", "-m", "t", "-md", "d", "--metrics"]
    with metrics_server(IDLE_PAGE) as port:
        kind = serve.watch(argv, "0.0.0.0", port, "upstream", os.getpid(), said.append, 0.01, 16)
    assert kind == "idle" and len(said) == 1 and said[0].startswith("SPECULATION GATE")
    said.clear()
    with metrics_server(DRAFTING_PAGE) as port:
        assert serve.watch(argv, "127.0.0.1", port, "upstream", os.getpid(), said.append, 0.01)
    assert said == []  # drafting: quiet
    with metrics_server(IK_PAGE) as port:
        kind = serve.watch(argv, "127.0.0.1", port, "ik-legacy", os.getpid(), said.append, 0.01)
    assert kind == "unknown" and "exports no speculation counters" in said[0]


def test_the_serve_watcher_ends_with_the_server() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert serve.watch(["-md", "d"], "127.0.0.1", 1, "upstream", gone.pid, print, 0.01) is None


def test_every_rendering_serves_metrics_and_the_gate_watches_only_a_draft(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from llamaspec.models.dialects import ServerCommand

    help_text = "-m, --model FNAME   model path\n--metrics   enable the endpoint\n"
    server = tmp_path / "bin" / "llama-server"
    server.parent.mkdir()
    server.write_text(f"#!/bin/sh\nprintf -- '{help_text}'\n")
    server.chmod(0o755)
    art = Artifact("a", tmp_path, {"engine": "llama.cpp"}, True)
    console = Console(file=io.StringIO())
    monkeypatch.delenv("LLAMA_ARG_ENDPOINT_METRICS", raising=False)
    monkeypatch.delenv(serve.GATE_SWITCH, raising=False)
    plain = ServerCommand(("llama-server", "-m", "t"), "upstream")
    # /metrics on for every recipe (the alert rules read it), once, where the build has it
    assert serve.with_metrics(plain, help_text).argv == (*plain.argv, "--metrics")
    assert serve.with_metrics(plain, None).argv == (*plain.argv, "--metrics")
    on = serve.with_metrics(plain, help_text)
    assert serve.with_metrics(on, help_text) == on
    assert serve.with_metrics(plain, "-m, --model FNAME\n") == plain
    argv = ["llama-server", "-m", "t", "-md", "d", "--metrics"]
    assert serve.gated(argv, art, console)
    assert not serve.gated(["llama-server", "-m", "t", "--metrics"], art, console)
    monkeypatch.setenv(serve.GATE_SWITCH, "off")
    assert not serve.gated(argv, art, console)
    assert serve.loopback_url("::", 80) == "http://[::1]:80"
    assert serve.loopback_url("0.0.0.0", 80) == "http://127.0.0.1:80"


WATCHED = """
import os, sys
from llamaspec.runtime import serve
serve.GATE_POLL_S, serve.GATE_TOKENS = 0.05, 16
port = int(sys.argv[1])
argv = [sys.executable, "-c", SERVER, str(port), "-md", "d.gguf"]
serve.start_watcher(argv, "127.0.0.1", port, "upstream")
os.execv(sys.executable, argv)
"""
# what the process execs into: a /metrics server for three seconds
SERVER = """
import http.server, sys, threading
page = PAGE
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = page.encode(); self.send_response(200)
        self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Timer(3, srv.shutdown).start()
srv.serve_forever()
"""


def test_serve_execs_the_server_and_its_detached_watcher_speaks_on_its_stderr() -> None:
    from llamaspec.runtime.client import free_port

    server = SERVER.replace("PAGE", repr(IDLE_PAGE))
    script = WATCHED.replace("SERVER", repr(server))
    env = {**os.environ, "PYTHONPATH": str(Path(serve.__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    said = [line for line in proc.stderr.splitlines() if "SPECULATION GATE" in line]
    assert len(said) == 1 and said[0].startswith("llamaspec serve: SPECULATION GATE")
    assert "d.gguf (-md)" in said[0]
