"""`serve --restart`: llamaspec stays as llama-server's parent and brings it back when it dies.

Without `--restart`, `serve` execs the server (it becomes llama-server: its PID, signals and
exit status, which is what systemd, containers and llama-swap restart by themselves). With it,
`supervise` starts the server as its child in a session of its own and:

- forwards SIGTERM, SIGINT and SIGHUP to it (a second one is forwarded again: llama-server
  stops at once on a second interrupt), waits for it to exit and returns its exit status
  (128 + N for a server killed by signal N), restarting nothing once asked to stop;
- when the server dies on its own (a crash, SIGKILL, the OOM killer), logs one line (how it
  died, how long it had run), waits a backoff (1 s, doubling to 30 s), starts it again with
  the same command line (the same port: the old process is gone, and llama-server binds with
  SO_REUSEADDR), polls GET /health until 200 and logs the time it took to be healthy;
- stops a (re)started server that is not healthy within the deadline, and a healthy one that
  stops answering GET /health for `hang_s` (hung: SIGSTOP, a deadlock), and counts that as a
  death (SIGTERM, then SIGKILL after `grace_s`); a server asked to stop that is still there
  `grace_s` after the signal is killed (SIGKILL); gives up, with one paragraph, at the death
  that follows `max_restarts` restarts in a row, a row being deaths of servers that did not
  stay healthy for `stable_s` (a server that dies that soon is not saved by restarting it).

If llamaspec itself is killed, the kernel sends the server SIGTERM (PR_SET_PDEATHSIG on
Linux), so no server is left holding the port with nobody to restart it. Nothing is written
to disk. The speculation gate's watcher (serve.py) follows this process's PID, which stays
the same across restarts: a /metrics read that fails while the server restarts is skipped.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamaspec import procs
from llamaspec.errors import LlamaspecError

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Policy:
    """How `supervise` restarts: the CLI sets the first two, tests shorten the rest."""

    max_restarts: int = 5  # restarts in a row that did not stay healthy for stable_s
    health_timeout_s: float = 600.0  # a (re)start must answer GET /health 200 within this
    backoff_s: float = 1.0  # before the first restart in a row; doubles for each next one
    backoff_max_s: float = 30.0
    stable_s: float = 60.0  # healthy this long: the next death starts a new row
    poll_s: float = 0.2  # GET /health every poll_s until 200
    grace_s: float = 10.0  # SIGTERM to SIGKILL: a server stopped for its health, or asked to
    hang_s: float = 60.0  # once healthy, no answer to GET /health this long: hung, restarted
    check_s: float = 5.0  # GET /health this often once healthy


def backoff(policy: Policy, row: int) -> float:
    """The wait before the `row`-th restart in a row (1, 2, …): backoff_s doubling, capped."""
    return min(policy.backoff_s * 2 ** max(row - 1, 0), policy.backoff_max_s)


def how_it_ended(returncode: int) -> str:
    """`exit status 3` or `SIGKILL` (a Popen returncode: negative for a signal)."""
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def shell_status(returncode: int) -> int:
    """The exit status a shell gives for a Popen returncode (128 + N for signal N)."""
    return returncode if returncode >= 0 else 128 - returncode


def healthy(url: str, timeout: float = 2.0) -> bool:
    """Whether GET url/health answers 200 (http.client: no proxy from the environment)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _say(text: str) -> None:
    print(f"llamaspec serve: {text}", file=sys.stderr, flush=True)


class Supervisor:
    """One server command, started, watched and restarted; `run` returns the exit status."""

    def __init__(
        self,
        argv: Sequence[str],
        url: str,
        policy: Policy | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.url = url
        self.policy = policy or Policy()
        self.say = say or _say
        self.proc: subprocess.Popen | None = None
        self.stop_signal: int | None = None  # the signal that asked us to stop
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)

    # --- signals ------------------------------------------------------------------------------

    def _on_stop(self, signum: int, frame: object) -> None:
        self.stop_signal = signum
        proc = self.proc
        if proc is not None and proc.returncode is None:  # not reaped: the pid is still its
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)
        self._wake()

    def _on_child(self, signum: int, frame: object) -> None:
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _sleep(self, seconds: float | None) -> None:
        """Sleep until a signal (a stop, a child's death) or `seconds` pass."""
        if seconds is not None and seconds <= 0:
            return
        select.select([self._wake_r], [], [], seconds)
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._wake_r, 512):
                pass

    # --- the child ----------------------------------------------------------------------------

    def _start(self) -> subprocess.Popen:
        try:
            # the parent-death signal from a thread that lives as long as this process
            return procs.spawn(self.argv, start_new_session=True)
        except OSError as exc:
            raise LlamaspecError(
                f"serve --restart could not start {self.argv[0]}: {exc.strerror or exc}. "
                "Nothing is running; check that the build in dist/ is whole (`llamaspec smoke "
                "--artifact ID` runs it) and run serve again."
            ) from None

    def _stopped(self, proc: subprocess.Popen) -> int:
        """Asked to stop: the signal was forwarded; wait for the server (SIGKILL after
        `grace_s`: a hung server does not act on the signal) and return its status."""
        deadline = time.monotonic() + self.policy.grace_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                self.say(
                    f"llama-server (pid {proc.pid}) still running {self.policy.grace_s:g} s "
                    "after the stop signal; killing it (SIGKILL)"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            self._sleep(self.policy.poll_s)
        return shell_status(proc.returncode)

    def _reachable(self) -> None:
        """Refuse at once an address this machine cannot reach at all (loopback down, no
        address): every health check would fail, and each start would wait out its
        deadline before being blamed."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as srv:
                srv.bind((host, 0))
                srv.listen(1)
                with socket.create_connection(srv.getsockname()[:2], timeout=2):
                    pass
        except OSError as exc:
            raise LlamaspecError(
                f"serve --restart cannot reach {host} on this machine ({exc.strerror or exc}), "
                "so it could never see the server answer GET /health. The loopback interface "
                "is down or has no address, as in a fresh network namespace: bring it up "
                "(`ip link set lo up`; `ip addr show lo` should list 127.0.0.1), or run where "
                f"{host} is reachable. Nothing was started."
            ) from None

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        old = {sig: signal.getsignal(sig) for sig in (*FORWARDED, signal.SIGCHLD)}
        for sig in FORWARDED:
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGCHLD, self._on_child)
        try:
            return self._loop()
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
            if self.proc is not None and self.proc.poll() is None:
                procs.kill_group(self.proc, self.policy.grace_s)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _loop(self) -> int:
        p = self.policy
        self._reachable()
        row = 0  # deaths since the server last stayed healthy for stable_s
        cause: str | None = None  # how the previous server ended (None: the first start)
        died_at = 0.0
        while True:
            if self.stop_signal is not None:
                return 0  # asked to stop while no server ran (during a backoff)
            self.proc = proc = self._start()
            started = time.monotonic()
            healthy_at: float | None = None
            timed_out = hung = False
            answered = checked = 0.0
            while proc.poll() is None:
                if self.stop_signal is not None:
                    return self._stopped(proc)
                now = time.monotonic()
                if healthy_at is not None and now - checked >= p.check_s:
                    checked = now
                    if healthy(self.url, min(2.0, p.hang_s)):
                        answered = now
                    elif now - answered > p.hang_s:
                        self.say(
                            f"llama-server (pid {proc.pid}) has not answered GET /health for "
                            f"{now - answered:.0f} s (hung); stopping it (SIGTERM, then "
                            f"SIGKILL after {p.grace_s:g} s)"
                        )
                        hung = True
                        procs.kill_group(proc, p.grace_s)
                        break
                if healthy_at is None and healthy(self.url, min(2.0, p.health_timeout_s)):
                    healthy_at = answered = checked = time.monotonic()
                    took = healthy_at - started
                    if cause is None:
                        self.say(f"llama-server (pid {proc.pid}) healthy in {took:.1f} s")
                    else:
                        self.say(
                            f"restarted after {cause}: healthy again in {took:.1f} s "
                            f"({healthy_at - died_at:.1f} s after it died)"
                        )
                elif healthy_at is None and now - started > p.health_timeout_s:
                    self.say(
                        f"llama-server (pid {proc.pid}) not healthy within "
                        f"{p.health_timeout_s:g} s of starting; stopping it (SIGTERM, then "
                        f"SIGKILL after {p.grace_s:g} s)"
                    )
                    timed_out = True
                    procs.kill_group(proc, p.grace_s)
                    break
                self._sleep(p.poll_s if healthy_at is None else min(max(p.poll_s, 1.0), p.check_s))
            if self.stop_signal is not None:
                return self._stopped(proc)
            died_at = time.monotonic()
            up = died_at - started
            stable = healthy_at is not None and died_at - healthy_at >= p.stable_s
            row = 1 if stable else row + 1
            cause = f"no health within {p.health_timeout_s:g} s" if timed_out else None
            if hung:
                cause = f"hung: no answer to GET /health for {p.hang_s:g} s"
            cause = cause or how_it_ended(proc.returncode)
            state = (
                f"healthy after {healthy_at - started:.1f} s"
                if healthy_at is not None
                else "never healthy"
            )
            if row > p.max_restarts:
                raise LlamaspecError(self._give_up(row, cause, up, state))
            wait = backoff(p, row)
            self.say(
                f"llama-server (pid {proc.pid}) ended ({cause}) after {up:.1f} s up ({state}); "
                f"restarting it in {wait:g} s (restart {row} of at most {p.max_restarts} in a "
                "row)"
            )
            deadline = time.monotonic() + wait
            while self.stop_signal is None and time.monotonic() < deadline:
                self._sleep(deadline - time.monotonic())

    def _give_up(self, row: int, cause: str, up: float, state: str) -> str:
        p = self.policy
        return (
            f"llama-server died {row} times in a row without staying healthy for "
            f"{p.stable_s:g} s (the last: {cause} after {up:.1f} s up, {state}), so serve "
            "--restart gives up rather than restart it forever: a server that dies this soon "
            "does not come back by being restarted. Its own output above says why (a port "
            "another process holds, a model file it cannot open, too little memory for the "
            "context); fix that and run `llamaspec serve` again, or allow more restarts in a "
            f"row with --max-restarts N (now {p.max_restarts})."
        )


def supervise(
    argv: Sequence[str],
    url: str,
    policy: Policy | None = None,
    say: Callable[[str], None] | None = None,
) -> int:
    """Run `argv` (a llama-server listening at `url`) under `policy` until asked to stop;
    return the exit status to leave with. Gives up with a LlamaspecError."""
    return Supervisor(argv, url, policy, say).run()
