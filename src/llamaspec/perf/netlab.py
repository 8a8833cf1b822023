"""Two hosts on one machine: network namespaces joined by a veth pair, a bandwidth cap (`tc`
`tbf`) and a delaying TCP relay, for testing and measuring llama.cpp's RPC backend.

Linux, root only. The namespaces get addresses of their own (10.231.0.0/30 by default) and
nothing outside them is addressed. `TwoHosts.inside()` moves the calling thread into the
client namespace, so servers started there (and HTTP clients) live in it. Kernels without
`netem` cannot delay packets, so round-trip delay comes from `relay`: it forwards every byte
after `delay` seconds in each direction (one-way = RTT / 2), in order, never reordering.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llamaspec.errors import LlamaspecError
from llamaspec.netaddr import parse_endpoint

CLONE_NEWNET = 0x40000000
SUBNET = "10.231.0"


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LlamaspecError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


def available() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns add)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    return None


def has_netem() -> bool:
    """Whether this kernel offers the netem qdisc (tried on a throwaway namespace's lo)."""
    name = f"lsp-probe-{os.getpid()}"
    _ip("netns", "add", name)
    try:
        proc = subprocess.run(
            ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "netem"],
            capture_output=True,
            check=False,
        )
        return proc.returncode == 0
    finally:
        _ip("netns", "del", name)


@dataclass(frozen=True)
class TwoHosts:
    """`client` (where llama-server runs) and `server` (the rpc host), one veth apart."""

    client: str
    server: str
    client_addr: str
    server_addr: str
    client_dev: str
    server_dev: str

    def exec_prefix(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]

    @contextlib.contextmanager
    def inside(self, ns: str | None = None) -> Iterator[None]:
        """Run the calling thread (and what it starts) in namespace `ns` (default: client)."""
        libc = ctypes.CDLL(None, use_errno=True)
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/var/run/netns/{ns or self.client}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise LlamaspecError(f"setns: {os.strerror(ctypes.get_errno())}")
            try:
                yield
            finally:
                if libc.setns(back, CLONE_NEWNET) != 0:
                    raise LlamaspecError(f"setns back: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(there)
            os.close(back)

    def shape(self, mbit: float | None) -> None:
        """Cap both directions of the link at `mbit` Mbit/s with a token bucket (None: uncap)."""
        for ns, dev in ((self.client, self.client_dev), (self.server, self.server_dev)):
            subprocess.run(
                [*self.exec_prefix(ns), "tc", "qdisc", "del", "dev", dev, "root"],
                capture_output=True,
                check=False,
            )
            if mbit is None:
                continue
            burst = max(32 * 1024, int(mbit * 1e6 / 8 / 250))  # about 4 ms of tokens
            cmd = [
                *self.exec_prefix(ns),
                *("tc", "qdisc", "add", "dev", dev, "root", "tbf"),
                *("rate", f"{mbit}mbit", "burst", str(burst), "latency", "50ms"),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise LlamaspecError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")


@contextlib.contextmanager
def two_hosts(tag: str | None = None, subnet: str = SUBNET) -> Iterator[TwoHosts]:
    """Make the namespaces and the link; remove them whatever happens."""
    why = available()
    if why:
        raise LlamaspecError(f"Network namespaces cannot be made here: {why}.")
    tag = tag or f"{os.getpid() % 100000}"
    hosts = TwoHosts(
        client=f"lsp-c-{tag}",
        server=f"lsp-s-{tag}",
        client_addr=f"{subnet}.2",
        server_addr=f"{subnet}.1",
        client_dev=f"lspc{tag}"[:15],
        server_dev=f"lsps{tag}"[:15],
    )
    made: list[str] = []
    try:
        for ns in (hosts.client, hosts.server):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", hosts.client_dev, "type", "veth", "peer", "name", hosts.server_dev)
        try:
            _ip("link", "set", hosts.client_dev, "netns", hosts.client)
            _ip("link", "set", hosts.server_dev, "netns", hosts.server)
        except LlamaspecError:
            subprocess.run(["ip", "link", "del", hosts.client_dev], capture_output=True)
            raise
        for ns, dev, addr in (
            (hosts.client, hosts.client_dev, hosts.client_addr),
            (hosts.server, hosts.server_dev, hosts.server_addr),
        ):
            _ip("addr", "add", f"{addr}/30", "dev", dev, ns=ns)
            _ip("link", "set", dev, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
        yield hosts
    finally:
        for ns in reversed(made):  # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


# --- the delaying relay ---------------------------------------------------------------


# What crossed the relay: bytes each way, and turns (a reply after a request: one round
# trip the protocol waited on, when the client waits for each reply).
COUNTS = {"up_bytes": 0, "down_bytes": 0, "turns": 0}
_LAST = {"dir": ""}


def _count(direction: str, n: int) -> None:
    COUNTS[f"{direction}_bytes"] += n
    if direction == "down" and _LAST["dir"] == "up":
        COUNTS["turns"] += 1
    _LAST["dir"] = direction


async def _pipe(reader, writer, delay: float, direction: str) -> None:
    """Forward bytes, each chunk released `delay` s after it arrived (order kept)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump() -> None:
        while True:
            data = await reader.read(1 << 16)
            _count(direction, len(data))
            await queue.put((time.monotonic() + delay, data))
            if not data:
                return

    task = asyncio.create_task(pump())
    try:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    finally:
        task.cancel()
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(
    listen: tuple[str, int], target: tuple[str, int], delay: float, stats: str | None = None
) -> None:
    async def handle(reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*target)
        for w in (writer, up_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            _pipe(reader, up_writer, delay, "up"),
            _pipe(up_reader, writer, delay, "down"),
            return_exceptions=True,
        )

    if stats:
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGUSR1, lambda: Path(stats).write_text(json.dumps(COUNTS))
        )
    server = await asyncio.start_server(handle, *listen)
    print(
        f"relay: {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}, {delay * 1e3:g} ms each way",
        flush=True,
    )
    async with server:
        await server.serve_forever()


@dataclass
class Relay:
    proc: subprocess.Popen
    stats: Path | None

    def counts(self) -> dict[str, int]:
        """The relay's counts so far (bytes up and down, turns)."""
        if self.stats is None:
            raise LlamaspecError("this relay was started without a stats file")
        self.stats.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.stats.is_file() or not self.stats.read_text().endswith("}"):
            if time.monotonic() > deadline:
                raise LlamaspecError("the relay did not write its counts")
            time.sleep(0.01)
        return json.loads(self.stats.read_text())


@contextlib.contextmanager
def relay(listen: str, target: str, rtt_ms: float, stats: Path | None = None) -> Iterator[Relay]:
    """A relay process (in the calling thread's namespace) adding `rtt_ms` of round trip."""
    argv = [sys.executable, "-m", "llamaspec.perf.netlab", listen, target, str(rtt_ms)]
    argv += ["--stats", str(stats)] if stats else []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("relay:"):
            raise LlamaspecError(
                f"the relay did not start: {line}{proc.stdout.read() if proc.stdout else ''}"
            )
        yield Relay(proc, stats)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="a TCP relay that adds round-trip delay")
    p.add_argument("listen", help="HOST:PORT to listen on")
    p.add_argument("target", help="HOST:PORT to forward to")
    p.add_argument("rtt_ms", type=float, help="round trip added, in milliseconds")
    p.add_argument("--stats", help="on SIGUSR1, write the byte and turn counts here (JSON)")
    a = p.parse_args(argv)
    listen = parse_endpoint(a.listen, "listen")
    target = parse_endpoint(a.target, "target")
    asyncio.run(_serve(listen, target, a.rtt_ms / 2000, a.stats))


if __name__ == "__main__":
    main()
