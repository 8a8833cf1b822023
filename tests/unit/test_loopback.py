"""Requests to llamaspec's own servers stay on loopback with a proxy in the environment."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

import llamaspec
from llamaspec.runtime import client, loopback, metrics

pytestmark = pytest.mark.unit

METRICS = "llamacpp:n_drafted_total 6\nllamacpp:n_drafted_accepted_total 4\n"


class Listener:
    """An HTTP server on 127.0.0.1 in a thread that records every request line it gets."""

    def __init__(self, answer: int) -> None:
        self.seen: list[str] = []
        seen, status = self.seen, answer

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                seen.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                body = METRICS if self.path.endswith("/metrics") else json.dumps({"ok": 1})
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _reply

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Listener, Listener]]:
    """(the "llama-server", the proxy), every proxy variable pointed at the proxy."""
    server, proxy = Listener(200), Listener(502)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield server, proxy
    server.close()
    proxy.close()


def test_the_proxy_is_really_in_the_way(pair: tuple[Listener, Listener]) -> None:
    """The control: httpx with the environment's settings sends loopback to the proxy."""
    server, proxy = pair
    assert httpx.get(server.url + "/health", timeout=5).status_code == 502
    assert proxy.seen and not server.seen


def test_loopback_requests_skip_the_proxy(pair: tuple[Listener, Listener]) -> None:
    server, proxy = pair
    assert loopback.get(server.url + "/health", 5).status_code == 200
    assert loopback.post(server.url + "/completion", {"prompt": "x"}, 5).json() == {"ok": 1}
    with loopback.stream("POST", server.url + "/completion", {"stream": True}, 5) as reply:
        assert reply.status_code == 200
    with loopback.client(5) as c:
        assert c.get(server.url + "/slots").status_code == 200
    counters = metrics.read(server.url)
    assert counters is not None
    assert proxy.seen == []
    assert server.seen == [
        "GET /health",
        "POST /completion",
        "POST /completion",
        "GET /slots",
        "GET /metrics",
    ]


def test_the_server_client_skips_the_proxy(pair: tuple[Listener, Listener]) -> None:
    """Server.post, Server.metrics and the start-up health wait of `running`."""
    server, proxy = pair
    port = int(server.url.rsplit(":", 1)[1])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        srv = client.Server(argv=["llama-server"], port=port, log=Path("x.log"), proc=sleeper)
        client._wait_ready(srv, timeout=10)
        assert srv.post("/tokenize", {"content": "a"}) == {"ok": 1}
        srv.metrics()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proxy.seen == []
    assert server.seen == ["GET /health", "POST /tokenize", "GET /metrics"]


def test_no_loopback_caller_builds_its_own_client() -> None:
    """Callers of local servers (runtime/, perf/) go through runtime/loopback.py."""
    package = Path(llamaspec.__file__).parent
    own = re.compile(r"httpx\.(get|post|put|stream|request|Client|AsyncClient)\(")
    found = [
        f"{path.relative_to(package)}:{n}"
        for folder in ("runtime", "perf")
        for path in sorted((package / folder).glob("*.py"))
        if path.name != "loopback.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if own.search(line)
    ]
    assert found == []


# Requests that leave the machine on purpose (GitHub, Hugging Face, PyPI, Khronos): a proxy
# there is the user's choice, so they keep httpx's environment settings.
EXTERNAL = {"engine/vulkan/headers.py", "models/hub.py", "maint/bump.py"}
HTTPX_CALL = re.compile(
    r"\bhttpx\.(get|post|put|patch|delete|head|request|stream|Client|AsyncClient)\("
)


def test_every_request_to_a_local_server_goes_through_loopback() -> None:
    """A new module that talks to llama-server (or rpc-server, or Prometheus) by calling
    httpx directly would follow HTTP_PROXY with the prompts: only loopback.py may, and the
    modules that fetch from the internet on purpose."""
    src = Path(llamaspec.__file__).parent
    calls = {
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if HTTPX_CALL.search(p.read_text(encoding="utf-8"))
    }
    assert calls == {"runtime/loopback.py", *EXTERNAL}, calls - {"runtime/loopback.py", *EXTERNAL}
