"""HTTP to the servers llamaspec starts on loopback: never through a proxy.

httpx reads HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY from the environment by
default, so with a proxy set and no NO_PROXY, a request to 127.0.0.1 (a prompt, a
completion, /health, /metrics) would leave the machine for the proxy. Every client of
llamaspec's own servers comes from here: `trust_env=False` (no proxy, no netrc, no
certificate settings from the environment; loopback is plain HTTP) and explicit time
limits. Requests to the network (downloads) keep the environment's proxy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx

CONNECT_S = 10.0  # a server on loopback accepts at once or not at all

Limit = float | httpx.Timeout


def limits(timeout: Limit, connect: float = CONNECT_S) -> httpx.Timeout:
    """`timeout` seconds to read, write and wait for a pooled connection; at most
    `connect` seconds to connect (an httpx.Timeout is taken as it is)."""
    if isinstance(timeout, httpx.Timeout):
        return timeout
    return httpx.Timeout(timeout, connect=min(connect, timeout))


def client(timeout: Limit = 10.0) -> httpx.Client:
    """A client that ignores proxy settings from the environment (close it, or use `with`)."""
    return httpx.Client(trust_env=False, timeout=limits(timeout), verify=False)


def get(url: str, timeout: Limit = 10.0) -> httpx.Response:
    """GET `url` on a loopback server (the reply is read in full)."""
    with client(timeout) as c:
        return c.get(url)


def post(url: str, json: object, timeout: Limit = 600.0) -> httpx.Response:
    """POST JSON to `url` on a loopback server (the reply is read in full)."""
    with client(timeout) as c:
        return c.post(url, json=json)


@contextlib.contextmanager
def stream(method: str, url: str, json: object, timeout: Limit) -> Iterator[httpx.Response]:
    """A streamed request to a loopback server; leaving the block closes the connection."""
    with client(timeout) as c, c.stream(method, url, json=json) as reply:
        yield reply
