"""No orphaned servers (issue 54): `llamaspec load` is SIGKILLed while its llama-server
serves; within a few seconds the server is gone and its port is free. SIGKILL leaves
llamaspec no handler: only the kernel's parent-death signal can stop the server (that a
server outlives the worker thread that started it is tests/unit/test_procs.py's)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamaspec import procs

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _servers_of(pid: int) -> list[tuple[int, int]]:
    """(pid, port) of each llama-server whose parent is `pid`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")), "")
        if ppid == str(pid) and argv and argv[0].endswith(b"llama-server") and b"--port" in argv:
            found.append((int(d.name), int(argv[argv.index(b"--port") + 1])))
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # as llama-server binds (SO_REUSEADDR): its clients' closed connections may linger
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_llamaspec_leaves_no_server_behind(upstream_artifact, tmp_path) -> None:
    argv = [sys.executable, "-m", "llamaspec.cli", "load", "gemma3-270m-ngram-tuned"]
    argv += ["--artifact", upstream_artifact.id, "--dist", str(upstream_artifact.path.parent)]
    argv += ["--clients", "2", "--reports", str(tmp_path)]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    servers: list[tuple[int, int]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            servers = [(p, port) for p, port in _servers_of(proc.pid) if procs.alive(p)]
            if servers:
                proc.kill()  # at once, while they serve (load stops each after its phase)
                break
        assert servers, "load started no llama-server within 2 minutes"
        proc.wait()
        deadline = time.monotonic() + 10  # SIGTERM: the server's threads shut down first

        def gone() -> bool:
            alive = any(procs.alive(pid) for pid, _ in servers)
            return not alive and all(_port_free(port) for _, port in servers)

        while not gone() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid, _ in servers if procs.alive(pid)], "a server outlived llamaspec"
        assert all(_port_free(port) for _, port in servers), "a port is still held"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid, _ in servers:  # never left behind by the test itself
            if procs.alive(pid):
                subprocess.run(["kill", "-9", str(pid)], check=False)
