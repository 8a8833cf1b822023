"""llama.cpp's RPC backend: the rpc-server command line, and checks of remote rpc hosts.

`serve_argv` renders an `rpc-server` invocation from an artifact's own binary and refuses to
bind every interface unless asked. `probe` speaks the protocol's first message (HELLO: one
command byte 14, an 8-byte little-endian size, 24 capability bytes; the answer is an 8-byte
size, then major, minor, patch, a pad byte and 24 capability bytes — ggml-rpc.cpp at the
default pin) to learn a host's protocol version within a bounded time. `check_hosts` compares
every host's version with the artifact's own, as the engine's client does (same major, the
server's minor not newer), so a mismatch is refused before llama-server starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise LlamaspecError(f"{endpoint!r} is not an rpc host: write it as HOST:PORT.")
    return host.strip("[]"), int(port)


def binds_everywhere(host: str) -> bool:
    """Whether binding `host` listens on every interface (0.0.0.0, ::, an empty host)."""
    if host in ("", "*"):
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_unspecified
    return False


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    devices: tuple[str, ...] = ()
    threads: int | None = None
    cache: bool = False
    allow_all_interfaces: bool = False


def serve_argv(artifact: Artifact, opts: ServeOptions) -> list[str]:
    """`rpc-server` argv; binding every interface is refused unless explicitly allowed."""
    if binds_everywhere(opts.host) and not opts.allow_all_interfaces:
        raise LlamaspecError(
            f"--host {opts.host or '(empty)'} would let every network this machine is on reach "
            "the rpc-server, whose protocol has no authentication or encryption. Bind the "
            "address of the one interface the client uses (or 127.0.0.1 behind an SSH tunnel, "
            "docs/guides/rpc.md); pass --allow-all-interfaces to bind it anyway."
        )
    if not 0 < opts.port < 65536:
        raise LlamaspecError(f"--port {opts.port} is not a TCP port (1-65535).")
    argv = [str(rpc_server_binary(artifact)), "-H", opts.host, "-p", str(opts.port)]
    if opts.devices:
        argv += ["-d", ",".join(opts.devices)]
    if opts.threads is not None:
        argv += ["-t", str(opts.threads)]
    if opts.cache:
        argv.append("-c")
    return argv


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


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> Version:
    """The protocol version of the rpc-server at `endpoint`; one paragraph naming the host
    when it does not answer within `timeout` seconds (connect and answer together)."""
    host, port = split_endpoint(endpoint)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.sendall(bytes([HELLO]) + struct.pack("<Q", CAPS) + bytes(CAPS))
            size = struct.unpack("<Q", _recv(sock, 8))[0]
            if size < 3 or size > 4096:
                raise OSError(f"it answered HELLO with a {size}-byte message, not a version")
            major, minor, patch = _recv(sock, size)[:3]
            return major, minor, patch
    except TimeoutError:
        why = f"did not answer within {timeout:g} s"
    except ConnectionRefusedError:
        why = "refused the connection (nothing listens on that port)"
    except OSError as exc:
        why = f"could not be reached ({exc.strerror or exc})"
    raise LlamaspecError(
        f"The rpc host {endpoint} {why}. llama-server was not started: it would wait on that "
        f"host or abort. Start an rpc-server there (`llamaspec rpc serve --host ADDRESS --port "
        f"{port}` on that machine), check that the address and port are the ones it binds and "
        "that a firewall or tunnel lets the connection through, or leave the host out of the "
        "recipe's `rpc:` list."
    )


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("it closed the connection during the handshake (not an rpc-server?)")
        data += chunk
    return data


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
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
    `mine`: the artifact's version when already known (else its rpc-server is asked)."""
    if not endpoints:
        return {}
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
