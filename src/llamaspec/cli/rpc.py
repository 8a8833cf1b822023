"""`llamaspec rpc serve|check`: an rpc-server from an artifact's binary, and remote host checks."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import shared
from llamaspec.paths import default_out

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("rpc", help="llama.cpp's RPC backend: run an rpc-server, check hosts")
    rs = r.add_subparsers(dest="rpc_command", required=True, metavar="COMMAND")
    s = rs.add_parser(
        "serve",
        help="run the artifact's rpc-server (foreground), bound to one address",
        description="Runs the artifact's own rpc-server. The RPC protocol has no authentication\n"
        "or encryption: it binds 127.0.0.1 unless --host names an address, and every\n"
        "interface only with --allow-all-interfaces.",
    )
    s.add_argument("--artifact", help="artifact id (or prefix) in dist/; default: newest rpc one")
    s.add_argument("--dist", type=Path, default=default_out("dist"))
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=shared.port, default=50052, help="TCP port (default 50052)")
    s.add_argument(
        "--device",
        action="append",
        default=[],
        help="device to serve, e.g. CPU, CUDA0 (repeatable; default: the server's own choice)",
    )
    s.add_argument("--threads", type=shared.positive, help="threads for the CPU device")
    s.add_argument("--cache", action="store_true", help="keep a local cache of sent tensors")
    s.add_argument(
        "--allow-all-interfaces",
        action="store_true",
        help="allow --host 0.0.0.0 or :: (every network this machine is on can reach it)",
    )
    s.add_argument("--dry-run", action="store_true", help="print the command, do not run it")
    c = rs.add_parser(
        "check", help="check that rpc hosts answer and speak the artifact's protocol version"
    )
    c.add_argument("hosts", nargs="+", metavar="HOST:PORT", type=shared.rpc_endpoint)
    c.add_argument("--artifact", help="artifact id (or prefix) in dist/; default: newest rpc one")
    c.add_argument("--dist", type=Path, default=default_out("dist"))
    c.add_argument(
        "--timeout", type=shared.seconds, default=5.0, help="seconds per host (default 5)"
    )
    st = rs.add_parser(
        "study",
        help="measure plain and speculative tok/s per placement across two network "
        "namespaces at several round-trip times (root; writes reports/rpc-latency-*)",
    )
    st.add_argument("--artifact", help="artifact id (or prefix) in dist/; default: newest rpc one")
    st.add_argument("--dist", type=Path, default=default_out("dist"))
    st.add_argument("--reports", type=Path, default=default_out("reports"))
    st.add_argument("--model", type=Path, help="GGUF (target and its own draft); default: embedded")
    st.add_argument(
        "--rtt",
        type=float,
        action="append",
        help="round trip in ms (repeatable; default 0 0.2 1 5)",
    )
    st.add_argument("--mbit", type=float, default=1000.0, help="link cap, Mbit/s (0: none)")
    st.add_argument("--n-predict", type=int, default=48, help="tokens per run (default 48)")
    st.add_argument("--n-max", type=int, default=8, help="draft length (default 8)")


def _artifact(args: argparse.Namespace):
    from llamaspec.engine.artifact import load_artifact, newest_artifact
    from llamaspec.errors import LlamaspecError

    if args.artifact:
        return load_artifact(args.dist, args.artifact)
    ids = sorted(
        (p for p in args.dist.glob("*/manifest.json") if (p.parent / "bin").is_dir()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for manifest in ids:
        artifact = load_artifact(args.dist, manifest.parent.name)
        if "rpc" in (artifact.manifest.get("variants") or []):
            return artifact
    newest = newest_artifact(args.dist)  # says what to do when dist/ is empty
    raise LlamaspecError(
        f"No artifact in {args.dist} has the rpc variant (newest: {newest}); build one with "
        "`llamaspec build --variant rpc`, or name one with --artifact."
    )


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command != "rpc":
        return False
    from llamaspec.runtime import rpc

    if args.rpc_command == "serve":  # the address first: before any artifact is looked at
        rpc.check_bind(args.host, args.allow_all_interfaces)
    artifact = _artifact(args)
    if args.rpc_command == "check":
        versions = rpc.check_hosts(artifact, args.hosts, args.timeout)
        for host, version in versions.items():
            console.print(f"rpc: {host} answers, protocol {'.'.join(map(str, version))}")
        return True
    if args.rpc_command == "study":
        from llamaspec.models.embedded import embedded_model
        from llamaspec.perf import rpcstudy

        rtts = tuple(sorted(set(args.rtt or rpcstudy.RTTS_MS)))
        if rtts[0] != 0:
            rtts = (0.0, *rtts)  # the network term is learned at RTT 0
        stem = f"rpc-latency-{artifact.id}"
        report = rpcstudy.study(
            artifact,
            args.model or embedded_model(console.print),
            args.reports / f"{stem}-logs",
            console,
            rtts=rtts,
            mbit=args.mbit or None,
            n_predict=args.n_predict,
            n_max=args.n_max,
        )
        for path in rpcstudy.write(report, args.reports, stem):
            console.print(f"rpc study: wrote {path}")
        return True
    opts = rpc.ServeOptions(
        host=args.host,
        port=args.port,
        devices=tuple(args.device),
        threads=args.threads,
        cache=args.cache,
        allow_all_interfaces=args.allow_all_interfaces,
    )
    argv = rpc.serve_argv(artifact, opts)
    print(rpc.WARNING, file=sys.stderr, flush=True)
    console.print("rpc serve: " + " ".join(argv))
    if not args.dry_run:
        sys.stdout.flush()
        os.execv(argv[0], argv)
    return True
