"""The process-group runner: real children, real grandchildren, nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llamaspec import procs
from llamaspec.errors import LlamaspecError

pytestmark = pytest.mark.unit

PY = sys.executable
# A child that starts a long-lived grandchild (same process group), writes both pids, waits.
SPAWNER = textwrap.dedent(
    """
    import subprocess, sys, time, os
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(f"{os.getpid()} {g.pid}")
    print("started", flush=True)
    time.sleep(600)
    """
)


def _gone(*pids: int, seconds: float = 5) -> bool:
    """Whether every pid is dead within `seconds` (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + seconds
    while any(procs.alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _wait_for(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_run_returns_output() -> None:
    proc = procs.run([PY, "-c", "print('hi'); import sys; print('e', file=sys.stderr)"], timeout=30)
    assert proc.returncode == 0 and proc.stdout == "hi\n" and proc.stderr == "e\n"


def test_run_passes_input_and_env(tmp_path: Path) -> None:
    proc = procs.run(
        [PY, "-c", "import os, sys; print(sys.stdin.read() + os.environ['X'])"],
        timeout=30,
        input="abc",
        env={**os.environ, "X": "def"},
        cwd=tmp_path,
    )
    assert proc.stdout.strip() == "abcdef"


def test_nonzero_exit_is_one_paragraph_with_the_tail() -> None:
    with pytest.raises(LlamaspecError) as err:
        procs.run(
            [PY, "-c", "import sys; print('boom here'); sys.exit(3)"], timeout=30, what="the step"
        )
    assert "the step failed" in err.value.message and "status 3" in err.value.message
    assert "boom here" in str(err.value)
    assert procs.run([PY, "-c", "raise SystemExit(4)"], timeout=30, check=False).returncode == 4


def test_missing_program_names_it_and_the_hint() -> None:
    with pytest.raises(LlamaspecError) as err:
        procs.run(["no-such-tool-xyz", "--version"], timeout=5, install_hint="apt install xyz.")
    assert "'no-such-tool-xyz'" in str(err.value) and "apt install xyz." in str(err.value)
    with pytest.raises(LlamaspecError, match="working directory"):
        procs.run([PY, "-V"], timeout=5, cwd="/nonexistent/dir")


def test_timeout_kills_child_and_grandchild(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    t0 = time.monotonic()
    with pytest.raises(LlamaspecError) as err:
        procs.run([PY, "-c", SPAWNER, str(pids)], timeout=2, what="the spawner")
    assert time.monotonic() - t0 < 15
    assert "did not finish within 2 s" in err.value.message and "started" in str(err.value)
    child, grandchild = map(int, pids.read_text().split())
    assert _gone(child, grandchild)
    assert procs.group_members(child) == []


def test_grace_then_sigkill_for_a_child_that_ignores_sigterm(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = (
        "import signal, time, os, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    )
    proc = subprocess.Popen([PY, "-c", code, str(pids)], start_new_session=True)
    pid = int(_wait_for(pids))
    t0 = time.monotonic()
    procs.kill_group(proc, grace=1)
    assert 0.9 < time.monotonic() - t0 < 10
    assert proc.returncode == -signal.SIGKILL and not procs.alive(pid)


def test_popen_streams_lines_and_checks_status() -> None:
    code = "import sys\nfor i in range(3): print(i, flush=True)\nsys.exit(2)"
    with (
        pytest.raises(LlamaspecError, match="status 2") as err,
        procs.popen([PY, "-c", code], timeout=30, what="counting") as stream,
    ):
        seen = [line.strip() for line in stream.lines()]
    assert seen == ["0", "1", "2"] and "counting failed" in err.value.message
    with procs.popen([PY, "-c", code], timeout=30, check=False) as stream:
        pass  # unread output is drained, the exit status kept
    assert stream.returncode == 2 and list(stream.tail) == ["0", "1", "2"]


def test_popen_timeout_and_exceptions_kill_the_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    with (
        pytest.raises(LlamaspecError, match="did not finish within 1 s"),
        procs.popen([PY, "-c", SPAWNER, str(pids)], timeout=1) as stream,
    ):
        for _ in stream.lines():
            pass
    child, grandchild = map(int, pids.read_text().split())
    assert _gone(child, grandchild)

    pids.unlink()
    with (
        pytest.raises(RuntimeError),
        procs.popen([PY, "-c", SPAWNER, str(pids)], timeout=None) as stream,
    ):
        next(stream.lines())
        raise RuntimeError("the caller failed")
    child, grandchild = map(int, pids.read_text().split())
    assert _gone(child, grandchild)


# A llamaspec-like parent: signal handlers, a temporary directory, a child running in it.
PARENT = textwrap.dedent(
    """
    import signal, sys, tempfile, time
    from llamaspec import procs
    # as from a terminal, even when the test runs under nohup or in a background job (which
    # start their children with SIGHUP / SIGINT ignored)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    procs.install_signal_handlers()
    try:
        with tempfile.TemporaryDirectory(prefix="procs-test-") as tmp:
            open(sys.argv[2], "w").write(tmp)
            procs.run([sys.executable, "-c", sys.argv[3], sys.argv[1]], timeout=600)
    except KeyboardInterrupt as exc:
        print("interrupted", type(exc).__name__, flush=True)
        sys.exit(procs.exit_status(exc))
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_signal_to_parent_leaves_no_orphans_and_no_tempdir(tmp_path: Path, sig: int) -> None:
    pids, tmpfile = tmp_path / "pids", tmp_path / "tmpdir"
    parent = subprocess.Popen(
        [PY, "-c", PARENT, str(pids), str(tmpfile), SPAWNER],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        child, grandchild = map(int, _wait_for(pids).split())
        tmp = Path(_wait_for(tmpfile))
        assert tmp.is_dir() and procs.alive(grandchild)
        parent.send_signal(sig)
        out, _ = parent.communicate(timeout=30)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 128 + sig
    assert "interrupted" in out
    assert not tmp.exists()
    assert _gone(child, grandchild)


def test_an_ignored_sighup_stays_ignored(tmp_path: Path) -> None:
    code = (
        "import signal, os, time\n"
        "from llamaspec import procs\n"
        "procs.install_signal_handlers()\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "time.sleep(0.2)\n"
        "print('survived', signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL)\n"
    )
    # like `nohup llamaspec …`: SIGHUP ignored by the parent, inherited by the child
    proc = subprocess.run(
        [PY, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "survived True", proc.stderr


THREAD_SPAWNER = textwrap.dedent(
    """
    import sys, threading, time
    from llamaspec import procs
    pids = []
    def start():  # a short-lived worker thread, as `load` starts its servers
        pids.append(procs.spawn(["sleep", "60"], start_new_session=True).pid)
    t = threading.Thread(target=start)
    t.start()
    t.join()  # the thread that asked is gone; the server must not go with it
    print(pids[0], flush=True)
    time.sleep(60)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_spawned_server_outlives_its_thread_and_dies_with_llamaspec(tmp_path: Path) -> None:
    """No orphans (issue 54): a server started from a worker thread that then ends keeps
    running (the parent-death signal is tied to the spawning thread, which lives as long as
    the process), and when the process is SIGKILLed the kernel stops it."""
    src = Path(procs.__file__).resolve().parents[1]
    parent = subprocess.Popen(
        [sys.executable, "-c", THREAD_SPAWNER],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        time.sleep(1.0)
        assert procs.alive(child), "the server died with the thread that started it"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while procs.alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs.alive(child), "the server outlived a SIGKILLed llamaspec"
    finally:
        if parent.poll() is None:
            parent.kill()
