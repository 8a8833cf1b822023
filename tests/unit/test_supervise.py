"""`serve --restart`'s supervisor (runtime/supervise.py) against real processes: a supervisor
process (this package, run by `python -c`) over a tiny Python HTTP server that answers
/health, killed with real signals. The supervisor runs as a process of its own because it
installs signal handlers, as it does under `llamaspec serve --restart`."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaspec import procs
from llamaspec.runtime import supervise
from llamaspec.runtime.client import free_port

pytestmark = pytest.mark.unit
SRC = Path(__file__).resolve().parents[2] / "src"

# The fake llama-server: `fake.py PORT MODE`; MODE serve (answers GET /health 200 after
# FAKE_DELAY s), die (exits 3 at once) or hang (never listens). Each start appends
# "start PID TIME" to FAKE_LOG, each stop signal "SIGNAME PID"; it exits FAKE_STATUS on one
# (FAKE_HANDLERS=none: no handlers, the signal kills it).
FAKE = textwrap.dedent(
    """
    import http.server, os, signal, sys, time
    port, mode, log = int(sys.argv[1]), sys.argv[2], os.environ["FAKE_LOG"]
    def note(text):
        with open(log, "a") as f:
            f.write(text + "\\n")
    note(f"start {os.getpid()} {time.monotonic()}")
    def stop(signum, frame):
        note(f"{signal.Signals(signum).name} {os.getpid()}")
        os._exit(int(os.environ.get("FAKE_STATUS", "0")))
    if os.environ.get("FAKE_HANDLERS") != "none":
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop)
    if mode == "die":
        sys.exit(3)
    if mode == "hang":
        while True:
            time.sleep(1)
    time.sleep(float(os.environ.get("FAKE_DELAY", "0")))
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
    """
)

# The supervisor process: policy fields as JSON; a give-up prints `error: ...` and exits 2.
DRIVER = textwrap.dedent(
    """
    import json, sys
    from llamaspec.errors import LlamaspecError
    from llamaspec.runtime import supervise
    argv, url, fields = json.loads(sys.argv[1])
    try:
        sys.exit(supervise.supervise(argv, url, supervise.Policy(**fields)))
    except LlamaspecError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    """
)

FAST = {"backoff_s": 0.05, "backoff_max_s": 0.2, "poll_s": 0.05, "grace_s": 2.0}


class Run:
    """A supervisor process over the fake server, its stderr collected line by line."""

    def __init__(self, tmp: Path, mode: str = "serve", env: dict | None = None, **policy):
        self.port = free_port()
        self.log = tmp / "fake.log"
        fake = tmp / "fake.py"
        fake.write_text(FAKE)
        argv = [sys.executable, str(fake), str(self.port), mode]
        spec = json.dumps([argv, f"http://127.0.0.1:{self.port}", {**FAST, **policy}])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, spec],
            env={**os.environ, "PYTHONPATH": str(SRC), "FAKE_LOG": str(self.log), **(env or {})},
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                for line in self.lines:
                    if m := re.search(pattern, line):
                        return m
                pytest.fail(f"the supervisor exited before /{pattern}/: {self.lines}")
            time.sleep(0.02)
        pytest.fail(f"no /{pattern}/ within {timeout} s: {self.lines}")

    def wait_count(self, text: str, count: int, timeout: float = 30) -> None:
        """Until `count` of the supervisor's lines hold `text`."""
        deadline = time.monotonic() + timeout
        while sum(text in line for line in list(self.lines)) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"fewer than {count} lines with {text!r}: {self.lines}")
            time.sleep(0.02)

    def wait_log(self, word: str, count: int = 1, timeout: float = 30) -> list[list[str]]:
        """The fake's log lines starting with `word`, once there are `count` of them."""
        deadline = time.monotonic() + timeout
        while True:
            rows = [ln.split() for ln in self.read_log() if ln.startswith(word + " ")]
            if len(rows) >= count:
                return rows
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        pytest.fail(f"fewer than {count} {word!r} lines in the fake's log: {self.read_log()}")

    def read_log(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def finish(self, timeout: float = 30) -> int:
        status = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return status

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for row in self.wait_log("start", 0, 0):  # no fake outlives its test
            pid = int(row[1])
            if procs.alive(pid):
                os.kill(pid, signal.SIGKILL)


def _gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not procs.alive(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    for run in made:
        run.close()


def _run(runs: list[Run], tmp: Path, *args, **kwargs) -> Run:
    run = Run(tmp, *args, **kwargs)
    runs.append(run)
    return run


def test_a_killed_server_comes_back_healthy_on_the_same_port(tmp_path, runs) -> None:
    run = _run(runs, tmp_path)
    run.wait_for(r"llama-server \(pid \d+\) healthy in [\d.]+ s")
    first = int(run.wait_log("start")[0][1])
    os.kill(first, signal.SIGKILL)
    died = run.wait_for(rf"llama-server \(pid {first}\) ended \(SIGKILL\) after [\d.]+ s up")
    assert "restarting it in 0.05 s (restart 1 of at most 5 in a row)" in died.string
    back = run.wait_for(r"restarted after SIGKILL: healthy again in ([\d.]+) s \(([\d.]+) s after")
    assert float(back[1]) > 0 and float(back[2]) >= float(back[1])
    second = int(run.wait_log("start", 2)[1][1])
    assert second != first and _gone(first)
    assert supervise.healthy(f"http://127.0.0.1:{run.port}")  # the same port, answering
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 0  # the server's own status: it exits 0 on SIGTERM
    assert f"SIGTERM {second}" in run.read_log()  # forwarded, once, to the live server
    assert _gone(second)
    assert len(run.wait_log("start")) == 2  # nothing restarted after the stop


@pytest.mark.parametrize(
    ("sig", "status"), [(signal.SIGINT, 7), (signal.SIGHUP, 0), (signal.SIGTERM, None)]
)
def test_a_stop_signal_is_forwarded_and_the_servers_status_returned(
    tmp_path, runs, sig: signal.Signals, status: int | None
) -> None:
    """The supervisor exits with the server's own status: the status it exits with on the
    signal, or 128 + N when the signal (here without a handler) kills it."""
    env = {"FAKE_STATUS": str(status)} if status is not None else {"FAKE_HANDLERS": "none"}
    run = _run(runs, tmp_path, env=env)
    run.wait_for("healthy in")
    pid = int(run.wait_log("start")[0][1])
    os.kill(run.proc.pid, sig)
    assert run.finish() == (status if status is not None else 128 + sig)
    assert _gone(pid)
    if status is not None:
        assert f"{sig.name} {pid}" in run.read_log()  # it got the very signal
    assert len(run.wait_log("start")) == 1


def test_quick_deaths_back_off_doubling_to_the_cap_then_give_up(tmp_path, runs) -> None:
    run = _run(runs, tmp_path, mode="die", max_restarts=4, backoff_s=0.05, backoff_max_s=0.15)
    assert run.finish() == 2
    waits = [float(m) for m in re.findall(r"restarting it in ([\d.]+) s", "\n".join(run.lines))]
    assert waits == [0.05, 0.1, 0.15, 0.15]  # doubling, capped
    starts = [float(row[2]) for row in run.wait_log("start", 5)]
    assert len(starts) == 5  # the first start and 4 restarts, then no more
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= wait for gap, wait in zip(gaps, waits, strict=True)), (gaps, waits)
    first = next(i for i, ln in enumerate(run.lines) if ln.startswith("error:"))
    error = "\n".join(run.lines[first:])
    assert "\n\n" not in error  # one paragraph
    flat = " ".join(error.split())
    assert "llama-server died 5 times in a row without staying healthy for 60 s" in flat
    assert "(the last: exit status 3 after" in flat and "never healthy)" in flat
    assert "--max-restarts N (now 4)" in flat


def test_a_server_that_stays_healthy_starts_a_new_row(tmp_path, runs) -> None:
    """Deaths count towards giving up only in a row: one that comes after the server stayed
    healthy for stable_s is restart 1 again."""
    run = _run(runs, tmp_path, max_restarts=1, stable_s=0.3)
    for n in (1, 2, 3):
        run.wait_count("healthy in" if n == 1 else "healthy again", 1 if n == 1 else n - 1)
        rows = run.wait_log("start", n)
        time.sleep(0.5)  # healthy for longer than stable_s
        os.kill(int(rows[-1][1]), signal.SIGKILL)
        run.wait_log("start", n + 1)
    assert run.proc.poll() is None
    said = "\n".join(run.lines)
    assert said.count("restart 1 of at most 1 in a row") == 3
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 0


def test_a_server_not_healthy_by_the_deadline_is_stopped_and_counted(tmp_path, runs) -> None:
    run = _run(runs, tmp_path, mode="hang", max_restarts=1, health_timeout_s=0.4)
    assert run.finish() == 2
    said = "\n".join(run.lines)
    assert said.count("not healthy within 0.4 s of starting; stopping it") == 2
    assert "ended (no health within 0.4 s)" in said
    rows = run.wait_log("start", 2)
    for row in rows:  # each was asked to stop (SIGTERM) and is gone
        assert f"SIGTERM {row[1]}" in run.read_log() and _gone(int(row[1]))
    assert "(the last: no health within 0.4 s after" in " ".join(said.split())


def test_a_stop_during_the_backoff_starts_nothing_more(tmp_path, runs) -> None:
    run = _run(runs, tmp_path, mode="die", backoff_s=30, backoff_max_s=30)
    run.wait_for("restarting it in 30 s")
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish(timeout=10) == 0
    assert len(run.wait_log("start")) == 1


def test_the_server_goes_when_the_supervisor_is_killed(tmp_path, runs) -> None:
    """SIGKILL leaves the supervisor no handler: the kernel's parent-death signal stops the
    server, so nothing is left holding the port."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    run = _run(runs, tmp_path)
    run.wait_for("healthy in")
    pid = int(run.wait_log("start")[0][1])
    os.kill(run.proc.pid, signal.SIGKILL)
    run.finish()
    assert _gone(pid)
    assert f"SIGTERM {pid}" in run.read_log()


def test_a_server_that_cannot_start_is_one_paragraph(tmp_path: Path) -> None:
    from llamaspec.errors import LlamaspecError

    missing = tmp_path / "no-such-server"
    with pytest.raises(LlamaspecError, match="could not start .*no-such-server") as err:
        supervise.Supervisor([missing], "http://127.0.0.1:1")._start()
    assert "\n" not in str(err.value)


def test_backoff_and_how_a_server_ended() -> None:
    policy = supervise.Policy()
    assert [supervise.backoff(policy, n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert supervise.how_it_ended(-signal.SIGKILL) == "SIGKILL"
    assert supervise.how_it_ended(1) == "exit status 1"
    assert supervise.shell_status(-signal.SIGTERM) == 143 and supervise.shell_status(3) == 3


def test_a_hung_server_is_a_dead_one_and_a_stop_escalates_to_sigkill(tmp_path, runs) -> None:
    """Issue 54: a server that was healthy and stops answering (SIGSTOP) is stopped (SIGTERM,
    then SIGKILL: a stopped process acts on nothing else) and restarted; and a server that
    does not go on the forwarded stop signal is killed `grace_s` after it."""
    run = _run(runs, tmp_path, hang_s=0.5, check_s=0.1, grace_s=0.5)
    run.wait_for("healthy in")
    first = int(run.wait_log("start")[0][1])
    os.kill(first, signal.SIGSTOP)
    run.wait_for(rf"llama-server \(pid {first}\) has not answered GET /health for \d+ s \(hung\)")
    run.wait_for(r"ended \(hung: no answer to GET /health for 0.5 s\)")
    run.wait_for("restarted after hung")
    assert _gone(first)
    second = int(run.wait_log("start", 2)[1][1])
    os.kill(second, signal.SIGSTOP)  # hung again: the stop signal cannot reach it
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGKILL
    assert any("still running 0.5 s after the stop signal; killing it" in ln for ln in run.lines)
    assert _gone(second)


def test_an_address_this_machine_cannot_reach_is_refused_before_any_start(
    tmp_path: Path,
) -> None:
    """Loopback down (or an address not on this machine): every health check would fail,
    each start would wait out its deadline; refused at once instead, nothing started."""
    from llamaspec.errors import LlamaspecError

    sup = supervise.Supervisor([tmp_path / "never-started"], "http://192.0.2.1:8080")
    with pytest.raises(LlamaspecError, match=r"cannot reach 192\.0\.2\.1 on this machine"):
        sup.run()
