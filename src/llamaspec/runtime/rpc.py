"""llama.cpp's RPC backend: the rpc-server command line, and checks of remote rpc hosts.

`serve_argv` renders an `rpc-server` invocation from an artifact's own binary, its options
checked first: the bind address as the engine's `inet_addr` reads it (every interface
refused unless asked), the port, the threads, the device names against the build's own
devices. `probe` speaks the protocol's first message (HELLO: one command byte 14, an 8-byte
little-endian size, 24 capability bytes; the answer is an 8-byte size, then major, minor,
patch, a pad byte and 24 capability bytes — ggml-rpc.cpp at the default pin) to learn a
host's protocol version within one deadline for the whole exchange, and tells a refused or
silent host from one where another program listens. `check_hosts` compares
every host's version with the artifact's own, as the engine's client does (same major, the
server's minor not newer), so a mismatch is refused before llama-server starts.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import netaddr, procs
from llamaspec.engine.artifact import RPC_SERVER_NAMES, Artifact
from llamaspec.errors import LlamaspecError

HELLO = 14
CAPS = 24  # RPC_CONN_CAPS_SIZE (ggml/src/ggml-rpc/transport.h)
DEFAULT_PORT = 50052
PROBE_TIMEOUT = 5.0

WARNING = (
    "warning: the RPC protocol has no authentication and no encryption: anyone who can reach "
    "this port can run computations on this machine and read what is sent. Keep it on "
    "loopback or a private link (an SSH tunnel: docs/guides/rpc.md)."
)

Version = tuple[int, int, int]


def rpc_server_binary(artifact: Artifact) -> Path:
    """The artifact's rpc-server (its name varies by tree); an error says how to get one."""
    for name in RPC_SERVER_NAMES:
        path = artifact.path / "bin" / name
        if path.is_file():
            return path
    variants = ", ".join(artifact.manifest.get("variants") or []) or "none"
    raise LlamaspecError(
        f"Artifact {artifact.id} has no rpc-server (looked for "
        f"bin/{' and bin/'.join(RPC_SERVER_NAMES)}; its variants: {variants}). "
        "Build one with `llamaspec build --variant rpc`."
    )


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of an rpc host as llama.cpp's RPC client reads it: IPv4 or a host
    name, a port of 1-65535 (netaddr: the one reading of every command and recipe)."""
    return netaddr.parse_endpoint(endpoint, "rpc host", ipv6=False)


binds_everywhere = netaddr.binds_everywhere  # read as the engine's inet_addr reads it


def check_bind(host: str, allow_all_interfaces: bool = False) -> str:
    """The address `rpc serve` binds, as the rpc-server reads it (`inet_addr`: IPv4 only, no
    host names, `0`/`0x0`/`0.0` mean 0.0.0.0, reading stops at whitespace). Every interface
    only with `allow_all_interfaces`, and then spelled 0.0.0.0."""
    if binds_everywhere(host):
        if not allow_all_interfaces:
            read = ""
            if netaddr.c_ipv4(host) and host != "0.0.0.0":
                read = f" (its inet_addr reads {host!r} as 0.0.0.0)"
            elif host not in ("0.0.0.0", "::", ""):
                read = f" ({host!r} means every interface)"
            raise LlamaspecError(
                f"--host {host or '(empty)'} would let every network this machine is on reach "
                f"the rpc-server{read}, whose protocol has no authentication or encryption. "
                "Bind the address of the one interface the client uses (or 127.0.0.1 behind "
                "an SSH tunnel, docs/guides/rpc.md); pass --allow-all-interfaces to bind it "
                "anyway."
            )
        if host != "0.0.0.0":
            raise LlamaspecError(
                f"--host {host!r} means every interface; with --allow-all-interfaces write it "
                "as 0.0.0.0 (the rpc-server binds IPv4 only)."
            )
        return host
    netaddr.check_host(host, "--host")
    if netaddr.c_ipv4(host) is None:
        raise LlamaspecError(
            f"--host {host!r}: the rpc-server binds an IPv4 address only (it reads --host "
            "with inet_addr, which resolves no host names and knows no IPv6). Write the "
            "interface's IPv4 address, e.g. 10.0.0.2, or 127.0.0.1 for loopback."
        )
    return host


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    devices: tuple[str, ...] = ()
    threads: int | None = None
    cache: bool = False
    allow_all_interfaces: bool = False


def serve_argv(artifact: Artifact, opts: ServeOptions) -> list[str]:
    """`rpc-server` argv, every option checked first: the bind address (every interface
    refused unless explicitly allowed), the port, the thread count and the device names."""
    check_bind(opts.host, opts.allow_all_interfaces)
    port = netaddr.parse_port(opts.port, "--port")
    if opts.threads is not None and (isinstance(opts.threads, bool) or opts.threads < 1):
        raise LlamaspecError(f"--threads {opts.threads}: give 1 or more CPU threads.")
    binary = rpc_server_binary(artifact)
    devices = check_devices(artifact, opts.devices)
    argv = [str(binary), "-H", opts.host, "-p", str(port)]
    if devices:
        argv += ["-d", ",".join(devices)]
    if opts.threads is not None:
        argv += ["-t", str(opts.threads)]
    if opts.cache:
        argv.append("-c")
    return argv


DEVICE_SPLIT = re.compile(r"[,/]+")  # how rpc-server splits -d (tools/rpc/rpc-server.cpp)
# `--list-devices` prints `Available devices:`, then `  Vulkan0: <name> (<memory>)` lines.
LISTED_DEVICE = re.compile(r"^\s+([^\s:()]+):\s", re.MULTILINE)


def serve(
    artifact: Artifact, opts: ServeOptions, say: Callable[[str], None], dry_run: bool = False
) -> None:
    """`rpc serve`: the WARNING on stderr, the command through `say`, then become the
    rpc-server (foreground); with `dry_run`, only the first two."""
    argv = serve_argv(artifact, opts)
    print(WARNING, file=sys.stderr, flush=True)
    say("rpc serve: " + " ".join(argv))
    if not dry_run:
        sys.stdout.flush()
        os.execv(argv[0], argv)


def rpc_artifact(dist: Path, artifact_id: str | None = None) -> Artifact:
    """The artifact `artifact_id` names in `dist`, else the newest one there built with the
    rpc variant (its rpc-server is what `rpc serve`, `check` and `study` use)."""
    from llamaspec.engine.artifact import load_artifact, newest_artifact

    if artifact_id:
        return load_artifact(dist, artifact_id)
    ids = sorted(
        (p for p in dist.glob("*/manifest.json") if (p.parent / "bin").is_dir()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for manifest in ids:
        artifact = load_artifact(dist, manifest.parent.name)
        if "rpc" in (artifact.manifest.get("variants") or []):
            return artifact
    newest = newest_artifact(dist)  # says what to do when dist/ is empty
    raise LlamaspecError(
        f"No artifact in {dist} has the rpc variant (newest: {newest}); build one with "
        "`llamaspec build --variant rpc`, or name one with --artifact."
    )


def list_devices(artifact: Artifact) -> tuple[str, ...] | None:
    """The devices the artifact's rpc-server can serve: CPU, and those `llama-server
    --list-devices` lists (one build, the same ggml backends; rpc-server itself lists them
    only after refusing a name). None when the listing is not to be had (ik_llama.cpp's
    server has no --list-devices)."""
    from llamaspec.runtime.client import list_devices as server_devices

    printed = server_devices(artifact.server, timeout=120)
    if printed is None:
        return None
    _, found, listing = printed.partition("Available devices:")
    if not found:
        return None
    return ("CPU", *(n for n in LISTED_DEVICE.findall(listing) if n.upper() != "CPU"))


def check_devices(artifact: Artifact, devices: Sequence[str]) -> tuple[str, ...]:
    """The device names as the rpc-server will read them (split at `,` and `/`), each one a
    device of the artifact's build (the engine matches names without case); an unknown one
    is refused with the build's devices before anything starts. The CPU device needs no
    listing; where none is to be had, the rpc-server's own check stays."""
    names = tuple(n for d in devices for n in DEVICE_SPLIT.split(d))
    bad = [n for n in names if not n or n != n.strip() or not n.isprintable()]
    if bad or (devices and not names):
        raise LlamaspecError(
            f"--device {', '.join(map(repr, devices))} names an empty device or one with "
            "spaces; give device names such as CPU or CUDA0 (repeat --device for several)."
        )
    if all(n.upper() == "CPU" for n in names):
        return names
    known = list_devices(artifact)
    if known is None:
        return names
    unknown = [n for n in names if n.lower() not in {k.lower() for k in known}]
    if unknown:
        raise LlamaspecError(
            f"--device {', '.join(unknown)}: artifact {artifact.id} has no such device; its "
            f"devices are {', '.join(known)} (CPU and what `llama-server --list-devices` "
            "lists). Name one of them, or leave --device out: the rpc-server then serves "
            "every GPU it finds, else the CPU."
        )
    return names


def check_timeout(timeout: float, what: str = "--timeout") -> float:
    """A time limit in seconds: a finite number above 0."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (0 < timeout < math.inf)
    ):
        raise LlamaspecError(f"{what} {timeout!r}: give a number of seconds above 0, e.g. 5.")
    return float(timeout)


class _NotRpc(Exception):
    """The peer's bytes are not an answer to HELLO."""


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> Version:
    """The protocol version of the rpc-server at `endpoint`, within one deadline of
    `timeout` seconds for the whole exchange (connect, HELLO, every read of the answer).

    What went wrong is one paragraph naming the host: refused, no answer within the
    deadline, or an answer that is not the RPC protocol (its first bytes quoted: another
    program listens there)."""
    host, port = split_endpoint(endpoint)
    timeout = check_timeout(timeout)
    deadline = time.monotonic() + timeout
    got = bytearray()
    try:
        sock = socket.create_connection((host, port), timeout=_left(deadline))
    except TimeoutError:
        raise _unreachable(
            endpoint,
            port,
            f"did not accept a connection within {timeout:g} s (a host that is down, a wrong "
            "address, or a firewall that drops the packets)",
        ) from None
    except ConnectionRefusedError:
        why = "refused the connection (nothing listens on that port)"
        raise _unreachable(endpoint, port, why) from None
    except socket.gaierror as exc:
        raise _unreachable(endpoint, port, f"could not be resolved ({exc.strerror})") from None
    except OSError as exc:
        why = f"could not be reached ({exc.strerror or exc})"
        raise _unreachable(endpoint, port, why) from None
    with sock:
        try:
            sock.settimeout(_left(deadline))
            sock.sendall(bytes([HELLO]) + struct.pack("<Q", CAPS) + bytes(CAPS))
            size = struct.unpack("<Q", _recv(sock, 8, deadline, got))[0]
            if size < 3 or size > 4096:
                _more(sock, got)
                raise _NotRpc
            major, minor, patch = _recv(sock, size, deadline, got)[:3]
            return major, minor, patch
        except TimeoutError:
            if got:
                raise LlamaspecError(
                    f"The rpc host {endpoint} sent {len(got)} byte(s) ({_quote(got)}) but no "
                    f"whole answer to the RPC HELLO within {timeout:g} s: a link too slow for "
                    "the time limit (raise --timeout), or a program that is not an rpc-server. "
                    "llama-server was not started."
                ) from None
            raise LlamaspecError(
                f"The rpc host {endpoint} accepted the connection but did not answer the RPC "
                f"HELLO within {timeout:g} s: an rpc-server busy with another client (it "
                "serves one at a time), or another program that waits for a request of its "
                "own (an HTTP server, say). llama-server was not started. Check that no other "
                "llama-server uses that rpc-server, and that the port is the rpc-server's."
            ) from None
        except _NotRpc:
            raise _not_rpc(endpoint, f"answered with {_quote(got)}") from None
        except ConnectionError:
            if got:
                raise _not_rpc(endpoint, f"sent {_quote(got)} and closed the connection") from None
            raise LlamaspecError(
                f"The rpc host {endpoint} accepted the connection and closed it without "
                "answering the RPC HELLO: another program listens there, or an rpc-server "
                "from a build too old to know HELLO. llama-server was not started. Run an "
                "rpc-server from the same llama.cpp commit there (`llamaspec rpc serve`), or "
                "point the recipe at the port it binds."
            ) from None
        except OSError as exc:
            why = f"failed during the handshake ({exc.strerror or exc})"
            raise _unreachable(endpoint, port, why) from None


def _left(deadline: float) -> float:
    """Seconds left before `deadline`; past it, a timeout."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _recv(sock: socket.socket, n: int, deadline: float, got: bytearray) -> bytes:
    """Exactly `n` bytes before `deadline` (each read waits only for the time left); every
    byte read is kept in `got`, to quote to the user."""
    data = b""
    while len(data) < n:
        sock.settimeout(_left(deadline))
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("closed")
        data += chunk
        got += chunk
    return data


def _more(sock: socket.socket, got: bytearray, limit: int = 64) -> None:
    """A little more of what a non-RPC peer sent, to quote it (what is there now)."""
    with contextlib.suppress(OSError):
        sock.settimeout(0.05)
        got += sock.recv(limit - len(got)) if len(got) < limit else b""


def _quote(data: bytes, limit: int = 64) -> str:
    text = repr(bytes(data[:limit]))
    return text + ("…" if len(data) > limit else "")


def _unreachable(endpoint: str, port: int, why: str) -> LlamaspecError:
    return LlamaspecError(
        f"The rpc host {endpoint} {why}. llama-server was not started: it would wait on that "
        f"host or abort. Start an rpc-server there (`llamaspec rpc serve --host ADDRESS --port "
        f"{port}` on that machine), check that the address and port are the ones it binds and "
        "that a firewall or tunnel lets the connection through, or leave the host out of the "
        "recipe's `rpc:` list."
    )


def _not_rpc(endpoint: str, what: str) -> LlamaspecError:
    return LlamaspecError(
        f"Something other than an rpc-server listens on {endpoint}: it {what}, which is not "
        "the RPC protocol. llama-server was not started. Point the recipe (or `rpc check`) at "
        "the port the rpc-server binds (`llamaspec rpc serve --port`), or move the other "
        "program off that port."
    )


@contextlib.contextmanager
def local_server(
    artifact: Artifact,
    host: str,
    port: int,
    devices: Sequence[str] = ("CPU",),
    log: Path | None = None,
) -> Iterator[subprocess.Popen]:
    """The artifact's rpc-server on `host:port` until the block ends (ready when it answers)."""
    argv = serve_argv(artifact, ServeOptions(host=host, port=port, devices=tuple(devices)))
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    out = log.open("w") if log else subprocess.DEVNULL
    proc = procs.spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise LlamaspecError(
                    f"rpc-server exited with status {proc.returncode} at start-up"
                    + (f"; its log: {log}" if log else "")
                )
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
                break
            if time.monotonic() > deadline:
                raise LlamaspecError(f"rpc-server did not listen on {host}:{port} within 30 s.")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log and out is not subprocess.DEVNULL:
            out.close()


def own_version(artifact: Artifact) -> Version:
    """The protocol version this artifact speaks: its own rpc-server, asked on loopback (the
    client library and the server are one build, so they speak one version)."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    except OSError as exc:
        raise LlamaspecError(
            f"Cannot bind a port on 127.0.0.1 to ask the artifact's own rpc-server its protocol "
            f"version ({exc.strerror or exc}): the loopback interface is down or has no address "
            "(as in a fresh network namespace). Bring it up (`ip link set lo up`)."
        ) from None
    with local_server(artifact, "127.0.0.1", port):
        return probe(f"127.0.0.1:{port}")


def compatible(client: Version, server: Version) -> bool:
    """The engine's own rule (ggml-rpc.cpp negotiate_hello): same major, server minor ≤ client's."""
    return client[0] == server[0] and server[1] <= client[1]


def check_hosts(
    artifact: Artifact,
    endpoints: Sequence[str],
    timeout: float = PROBE_TIMEOUT,
    mine: Version | None = None,
) -> dict[str, Version]:
    """Every host answers and speaks a version the artifact's client accepts, or an error.
    `mine`: the artifact's version when already known (else its rpc-server is asked).
    The addresses and the time limit are checked before the artifact's rpc-server starts."""
    if not endpoints:
        return {}
    for endpoint in endpoints:
        split_endpoint(endpoint)
    check_timeout(timeout)
    mine = mine or own_version(artifact)
    found = {}
    for endpoint in endpoints:
        theirs = probe(endpoint, timeout)
        if not compatible(mine, theirs):
            raise LlamaspecError(
                f"The rpc host {endpoint} runs rpc-server protocol {_v(theirs)}, but artifact "
                f"{artifact.id} speaks {_v(mine)}; the client refuses a different major version "
                "or a newer minor one. Run an rpc-server from the same llama.cpp commit on that "
                f"host (`llamaspec rpc serve --artifact {artifact.id}` there, or the image's rpc "
                "mode)."
            )
        found[endpoint] = theirs
    return found


def _v(v: Version) -> str:
    return ".".join(map(str, v))
