"""`llamaspec serve --restart` with the suite's upstream build and the embedded model: the
llama-server child killed with SIGKILL comes back healthy on the same port, the supervisor
logs the measured time to healthy, and SIGTERM stops both."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from llamaspec.engine.artifact import Artifact
from llamaspec.runtime.client import free_port

from helpers import ROOT

pytestmark = pytest.mark.integration
BACK = r"restarted after SIGKILL: healthy again in ([\d.]+) s"


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid and fields[0] not in "ZX":
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def test_a_killed_server_comes_back_healthy_on_the_same_port(upstream_artifact: Artifact) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llamaspec.cli",
            "serve",
            "gemma3-270m-ngram",  # the embedded model, no draft model: no gate watcher
            "--artifact",
            upstream_artifact.id,
            "--dist",
            str(upstream_artifact.path.parent),
            "--port",
            str(port),
            "--restart",
        ],
        cwd=ROOT,
        env={**os.environ, "LLAMA_ARG_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()

    def wait_for(pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(lines):
                if m := re.search(pattern, line):
                    return m
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.1)
        pytest.fail(f"no /{pattern}/ within {timeout} s:\n{''.join(lines)}")

    servers: list[int] = []
    try:
        wait_for(r"llama-server \(pid \d+\) healthy in [\d.]+ s", 120)
        servers = _children(proc.pid)
        assert len(servers) == 1, servers
        os.kill(servers[0], signal.SIGKILL)
        back = wait_for(BACK, 60)
        print(back.group(0))  # the measured time to healthy, for the report
        assert float(back[1]) > 0
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        now = _children(proc.pid)
        assert len(now) == 1 and now[0] != servers[0] and not _alive(servers[0]), now
        servers += now
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, "".join(lines)  # llama-server's own exit status
        reader.join(timeout=5)
        assert not [pid for pid in servers if _alive(pid)]
        assert "Traceback" not in "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for pid in servers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
