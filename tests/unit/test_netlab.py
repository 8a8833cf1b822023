"""The delaying relay on loopback (no namespaces, no root): bytes arrive intact, in order,
and no earlier than the round trip it adds."""

from __future__ import annotations

import socket
import threading
import time

from llamaspec.perf import netlab


def _echo() -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv


def _free_port() -> int:
    """A loopback port nothing listens on (for the relay to bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_relay_keeps_bytes_and_adds_the_round_trip() -> None:
    port = _free_port()
    with _echo() as echo:
        target = f"127.0.0.1:{echo.getsockname()[1]}"
        with (
            netlab.relay(f"127.0.0.1:{port}", target, 40.0),
            socket.create_connection(("127.0.0.1", port), 5) as c,
        ):
            payload = bytes(range(256)) * 400
            t0 = time.monotonic()
            c.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += c.recv(65536)
            elapsed = time.monotonic() - t0
    assert got == payload
    assert elapsed >= 0.040  # a lower bound: the relay never delivers early


def test_relay_counts_bytes_and_turns(tmp_path) -> None:
    port = _free_port()
    with _echo() as echo:
        target = f"127.0.0.1:{echo.getsockname()[1]}"
        with (
            netlab.relay(f"127.0.0.1:{port}", target, 0.0, tmp_path / "stats.json") as relay,
            socket.create_connection(("127.0.0.1", port), 5) as c,
        ):
            for _ in range(3):  # three request → reply turns of 100 bytes
                c.sendall(b"x" * 100)
                got = b""
                while len(got) < 100:
                    got += c.recv(100)
            counts = relay.counts()
    assert counts == {"up_bytes": 300, "down_bytes": 300, "turns": 3}
