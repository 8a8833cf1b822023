"""Run a llama-server on a free loopback port, wait for it, talk to it, stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from llamaspec.errors import LlamaspecError
from llamaspec.models.dialects import server_help

__all__ = ["HOST", "Server", "free_port", "running", "server_help", "tail"]

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class Server:
    """A running llama-server process."""

    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen
    returns_tokens: bool | None = None  # learnt from the first /completion reply

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def failure(self, what: str) -> LlamaspecError:
        return LlamaspecError(
            f"{what}. Command: {' '.join(self.argv)}",
            details=f"Last 40 lines of {self.log}:\n{tail(self.log)}",
        )

    def post(self, path: str, payload: dict, timeout: float = 600) -> dict:
        """POST JSON and return the JSON reply; a dead server or error reply is an error."""
        try:
            r = httpx.post(self.url + path, json=payload, timeout=timeout)
        except httpx.HTTPError as exc:
            if self.proc.poll() is not None:
                raise self.failure(f"llama-server died (exit {self.proc.returncode})") from None
            raise self.failure(f"request to {path} failed: {exc}") from None
        if r.status_code != 200:
            raise self.failure(f"{path} answered HTTP {r.status_code}: {r.text[:500]}")
        return r.json()


@contextlib.contextmanager
def running(
    server_bin: Path,
    args: Sequence[str],
    log: Path,
    ready_timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Start `server_bin args` on a free loopback port; yield once /health says ok; stop it.

    The start-up limit defaults to LLAMASPEC_SERVER_READY_TIMEOUT seconds, else 900."""
    if ready_timeout is None:
        ready_timeout = float(os.environ.get("LLAMASPEC_SERVER_READY_TIMEOUT", "900"))
    port = free_port()
    argv = [str(Path(server_bin).resolve()), *args, "--host", HOST, "--port", str(port)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            argv,
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=log.parent,  # servers that write llama.log leave it beside their log
            start_new_session=True,
        )
    server = Server(argv=argv, port=port, log=log, proc=proc)
    try:
        _wait_ready(server, ready_timeout)
        yield server
    finally:
        _stop(proc)


def _wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise server.failure(
                f"llama-server exited during start-up (exit {server.proc.returncode})"
            )
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise server.failure(f"llama-server was not healthy after {timeout:.0f}s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
