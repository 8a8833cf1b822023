"""Every child process llamaspec starts: its own process group, a time limit, no orphans.

`run` runs a command to completion and returns its output; `popen` streams a long
command's output line by line (build progress). Each child starts in a new session, so
it and everything it spawns share one process group; when the command times out, when
the user presses Ctrl-C, or when llamaspec gets SIGTERM/SIGHUP (after
`install_signal_handlers`), the whole group is stopped — SIGTERM, then SIGKILL after a
grace period — and the failure reaches the user as one paragraph, not a traceback.

Servers (`spawn`) are started by one thread that lives as long as llamaspec, with Linux's
parent-death signal: when llamaspec dies without a chance to clean up (SIGKILL, the OOM
killer), the kernel sends each of them SIGTERM, so none is left holding its port and memory.
The kernel counts the thread that started a child as its parent, so a server started from a
short-lived worker thread would get the signal when that thread ends: hence the one thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from llamaspec.errors import LlamaspecError

GRACE_S = 5.0  # between SIGTERM and SIGKILL
TAIL_LINES = 20  # output lines quoted in an error

Cmd = Sequence[str | os.PathLike[str]]


class Terminated(KeyboardInterrupt):
    """llamaspec got SIGTERM or SIGHUP: unwinds like Ctrl-C so `with` blocks clean up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_terminating = False


def _on_signal(signum: int, frame: object) -> None:
    global _terminating
    if _terminating:  # already unwinding: let the cleanup finish
        return
    _terminating = True
    raise Terminated(signum)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()  # loaded here, in the parent: the child only calls it
# (the pid that made it, the thread, that thread's network namespace)
_spawner: tuple[int, ThreadPoolExecutor, str | None] | None = None
_spawner_lock = threading.Lock()


def _netns() -> str | None:
    """The calling thread's network namespace (Linux), None where it cannot tell."""
    try:
        return os.readlink("/proc/thread-self/ns/net")
    except OSError:
        return None


def _spawning_thread() -> tuple[ThreadPoolExecutor, str | None]:
    """The one thread that starts servers, and its network namespace; made on first use
    (again in a forked child)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():
            thread = ThreadPoolExecutor(1, thread_name_prefix="spawner")
            _spawner = (os.getpid(), thread, thread.submit(_netns).result())
        return _spawner[1], _spawner[2]


def spawn(argv: Sequence[str], **popen: object) -> subprocess.Popen:
    """`subprocess.Popen(argv, **popen)` for a server: started by the spawning thread with
    the parent-death signal (SIGTERM; llama-server and rpc-server stop at once on it), so
    it dies with llamaspec however llamaspec dies. Plain Popen, in the calling thread, where
    the system has no such signal or the caller is in another network namespace."""
    prctl = _prctl
    thread, its_netns = _spawning_thread() if prctl is not None else (None, None)
    if thread is None or _netns() != its_netns:
        # a thread that entered a network namespace (the RPC lab's hosts) starts its server
        # itself: namespaces belong to threads, and the spawning thread is not in that one
        return subprocess.Popen(argv, **popen)  # type: ignore[call-overload]
    parent = os.getpid()

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # llamaspec died before the line above
            os._exit(1)

    start = thread.submit(subprocess.Popen, argv, preexec_fn=child, **popen)
    return start.result()


def install_signal_handlers() -> None:
    """Turn SIGTERM and SIGHUP into `Terminated` (a KeyboardInterrupt) in the main thread.

    A closed terminal or a cancelled CI job then unwinds the stack like Ctrl-C: running
    children are stopped with their process groups and temporary directories are removed.
    A signal that is ignored (`nohup` ignores SIGHUP) stays ignored.
    """
    global _terminating
    if threading.current_thread() is not threading.main_thread():
        return
    _terminating = False
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _on_signal)


def exit_status(exc: KeyboardInterrupt) -> int:
    """The conventional exit status for an interrupt: 128 + the signal number."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid` (Linux /proc; else a probe)."""
    proc_dir = Path("/proc")
    if not (proc_dir / "self" / "stat").is_file():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ..." — comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in "ZX":
            members.append(int(entry.name))
    return members


def kill_group(proc: subprocess.Popen, grace: float = GRACE_S) -> None:
    """Stop `proc` and everything in its process group: SIGTERM, then SIGKILL after `grace`."""
    pgid = proc.pid  # start_new_session=True: the child leads its own group
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        proc.poll()
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader so it does not count as a member
        if not group_members(pgid):
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


def _argv(cmd: Cmd) -> list[str]:
    argv = [os.fspath(c) for c in cmd]
    if not argv:
        raise LlamaspecError("Internal error: an empty command line was given to run.")
    return argv


def _start_error(
    exc: OSError, argv: list[str], what: str, cwd: str | os.PathLike[str] | None, hint: str | None
) -> LlamaspecError:
    if cwd is not None and not Path(cwd).is_dir():
        return LlamaspecError(
            f"Cannot run {what}: its working directory {os.fspath(cwd)} does not exist "
            "(it may have been removed while llamaspec ran); run the command again."
        )
    if isinstance(exc, FileNotFoundError):
        return LlamaspecError(
            f"Cannot run {what}: the program {argv[0]!r} was not found on PATH."
            + (f" {hint}" if hint else " Install it, or put it on PATH, and run again.")
        )
    return LlamaspecError(
        f"Cannot run {what} ({argv[0]}): {exc.strerror or exc}."
        + (f" {hint}" if hint else " Check that the program is executable.")
    )


def _tail(*texts: str | bytes | None, lines: int = TAIL_LINES) -> str:
    joined = "\n".join(
        t.decode(errors="replace") if isinstance(t, bytes) else t for t in texts if t
    )
    return "\n".join(joined.strip().splitlines()[-lines:])


def _status(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _shown(argv: list[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= 300 else text[:297] + "..."


def run(
    cmd: Cmd,
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    check: bool = True,
    what: str | None = None,
    install_hint: str | None = None,
    capture: bool = True,
    text: bool = True,
    errors: str = "replace",
) -> subprocess.CompletedProcess:
    """Run `cmd` to completion in its own process group; raise LlamaspecError on trouble.

    `what` names the step for the user ("git fetch", "pip download"); `install_hint` says
    how to get the program when it is missing. On timeout or interrupt the whole process
    group is stopped; with `check`, a non-zero exit is an error quoting the output's tail.
    `errors`: how undecodable output is read (`surrogateescape` keeps the exact bytes).
    """
    argv = _argv(cmd)
    what = what or Path(argv[0]).name
    pipe = subprocess.PIPE if capture else None
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=pipe,
            stderr=pipe,
            text=text,
            errors=errors if text else None,
            start_new_session=True,
        )
    except OSError as exc:
        raise _start_error(exc, argv, what, cwd, install_hint) from None
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        try:
            out, err = proc.communicate(timeout=GRACE_S)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            out, err = None, None
        tail = _tail(out, err)
        raise LlamaspecError(
            f"{what} did not finish within {timeout:g} s and was stopped, together with every "
            f"process it started (`{_shown(argv)}`). Check the network or the machine's load "
            "and run again." + (" Its last output:" if tail else " It printed nothing."),
            details=tail or None,
        ) from None
    except BaseException:
        kill_group(proc)
        raise
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check and proc.returncode != 0:
        tail = _tail(out, err)
        raise LlamaspecError(
            f"{what} failed: `{_shown(argv)}` {_status(proc.returncode)}."
            + (" Its last output:" if tail else " It printed nothing."),
            details=tail or None,
        )
    return result


class Stream:
    """A running command whose merged stdout/stderr is read line by line."""

    def __init__(self, proc: subprocess.Popen, argv: list[str], what: str) -> None:
        self.proc, self.argv, self.what = proc, argv, what
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.timed_out = False

    def lines(self) -> Iterator[str]:
        """The output, a line at a time (with its newline), as the command prints it."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line.rstrip("\n"))
            yield line

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


@contextlib.contextmanager
def popen(
    cmd: Cmd,
    *,
    timeout: float | None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    what: str | None = None,
    install_hint: str | None = None,
) -> Iterator[Stream]:
    """Start `cmd` in its own process group and yield a `Stream` of its output.

    Leaving the block waits for the command (reading what is left of its output). On
    timeout (`timeout` seconds from the start; None: no limit) or on any exception or
    interrupt inside the block, the whole process group is stopped. After the block,
    `stream.returncode` is set; with `check`, a non-zero exit raises LlamaspecError.
    """
    argv = _argv(cmd)
    what = what or Path(argv[0]).name
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
    except OSError as exc:
        raise _start_error(exc, argv, what, cwd, install_hint) from None
    stream = Stream(proc, argv, what)
    timer = None
    if timeout is not None:

        def expire() -> None:
            stream.timed_out = True
            kill_group(proc)

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
    try:
        yield stream
        for _ in stream.lines():  # drain what the block did not read
            pass
        proc.wait()
    except BaseException:
        if timer is not None:
            timer.cancel()
        kill_group(proc)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if proc.stdout is not None:
            proc.stdout.close()
    tail = "\n".join(stream.tail)
    if stream.timed_out:
        raise LlamaspecError(
            f"{what} did not finish within {timeout:g} s and was stopped, together with every "
            f"process it started (`{_shown(argv)}`)." + (" Its last output:" if tail else ""),
            details=tail or None,
        )
    if check and proc.returncode != 0:
        raise LlamaspecError(
            f"{what} failed: `{_shown(argv)}` {_status(proc.returncode)}."
            + (" Its last output:" if tail else " It printed nothing."),
            details=tail or None,
        )


def alive(pid: int) -> bool:
    """Whether a process with this id runs (one of another user's counts as running; a
    zombie, dead but not yet reaped, does not: for a multithreaded server that is its main
    thread ended, while its other threads may still be closing its sockets)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux: the state after the command name; Z (zombie) and X (dead) are gone
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def remove_stale(parent: Path, pattern: str) -> None:
    """Remove the working directories `parent/pattern` that killed runs left behind: each
    name ends in `-<pid>` of the process that made it, and that process no longer runs."""
    import shutil

    for entry in parent.glob(pattern):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
