"""Waiting for llama-server to start (issue 42): health checks that fail with an error
waiting cannot heal (Network is unreachable: loopback down, as in a fresh network
namespace) end the wait at once with the cause and the fix; a refused connection is a
server still loading, waited on while its process lives. Real sockets, real processes."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llamaspec.errors import LlamaspecError
from llamaspec.runtime import client

# Linux refuses a TCP connection to the limited broadcast address with ENETUNREACH
# (tcp_v4_connect), the error a health check gets when loopback is down: reachable
# without root or a network namespace.
UNREACHABLE = "255.255.255.255"


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _connect_error(host: str, port: int) -> httpx.HTTPError:
    try:
        httpx.get(f"http://{host}:{port}/health", timeout=1)
    except httpx.HTTPError as exc:
        return exc
    raise AssertionError("connected")


def test_unreachable_network_is_unhealable_and_refused_is_not() -> None:
    cause = client.unhealable(_connect_error(UNREACHABLE, 9))
    assert cause is not None and cause.errno == errno.ENETUNREACH
    assert client.unhealable(_connect_error("127.0.0.1", _closed_port())) is None


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx honours proxy variables; these checks are about this machine's own stack."""
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def alive():
    """A real process that stays up, standing in for a server still loading its model."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _server(proc: subprocess.Popen, tmp_path: Path, host: str, port: int) -> client.Server:
    log = tmp_path / "server.log"
    log.write_text("loading model\n")
    return client.Server(["llama-server"], port, log, proc, host=host)


def test_a_start_that_cannot_reach_the_server_fails_fast_with_the_cause(
    alive, tmp_path: Path
) -> None:
    server = _server(alive, tmp_path, UNREACHABLE, 9)
    t0 = time.monotonic()
    with pytest.raises(LlamaspecError) as exc:
        client._wait_ready(server, 60)
    assert time.monotonic() - t0 < 10  # not the whole start-up limit
    text = str(exc.value)
    assert "Network is unreachable" in text and "ENETUNREACH" in text
    assert "ip link set lo up" in text


def test_a_refused_connection_is_waited_on_and_named_at_the_end(alive, tmp_path: Path) -> None:
    server = _server(alive, tmp_path, "127.0.0.1", _closed_port())
    t0 = time.monotonic()
    with pytest.raises(LlamaspecError) as exc:
        client._wait_ready(server, 1.5)
    assert time.monotonic() - t0 >= 1.5
    assert "not healthy after 2s" in str(exc.value) and "Connection refused" in str(exc.value)
