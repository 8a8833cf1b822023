"""`llamaspec rpc serve|check`: an rpc-server from an artifact's binary, and remote host checks."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import shared

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
    shared.add_artifact_args(s, "the newest RPC build there")
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
    s.set_defaults(handler=cmd_rpc_serve)
    c = rs.add_parser(
        "check", help="check that rpc hosts answer and speak the artifact's protocol version"
    )
    c.add_argument("hosts", nargs="+", metavar="HOST:PORT", type=shared.rpc_endpoint)
    shared.add_artifact_args(c, "the newest RPC build there")
    c.add_argument(
        "--timeout", type=shared.seconds, default=5.0, help="seconds per host (default 5)"
    )
    c.set_defaults(handler=cmd_rpc_check)
    st = rs.add_parser(
        "study",
        help="measure plain and speculative tok/s per placement across two network "
        "namespaces at several round-trip times (root; writes reports/rpc-latency-*)",
    )
    shared.add_artifact_args(st, "the newest RPC build there")
    shared.add_reports(st)
    st.add_argument(
        "--model",
        type=shared.existing_file,
        help="GGUF (target and its own draft); default: embedded",
    )
    st.add_argument(
        "--rtt",
        type=shared.quantity("milliseconds", zero=True),
        action="append",
        help="round trip in ms (repeatable; default 0 0.2 1 5)",
    )
    st.add_argument(
        "--mbit",
        type=shared.quantity("Mbit/s", zero=True),
        default=1000.0,
        help="link cap, Mbit/s (0: none)",
    )
    st.add_argument(
        "--n-predict", type=shared.positive, default=48, help="tokens per run (default 48)"
    )
    st.add_argument("--n-max", type=shared.positive, default=8, help="draft length (default 8)")
    st.set_defaults(handler=cmd_rpc_study)


def cmd_rpc_check(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.runtime import rpc

    versions = rpc.check_hosts(rpc.rpc_artifact(args.dist, args.artifact), args.hosts, args.timeout)
    for host, version in versions.items():
        console.print(f"rpc: {host} answers, protocol {'.'.join(map(str, version))}")


def cmd_rpc_study(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.perf import rpcstudy
    from llamaspec.runtime import rpc

    paths = rpcstudy.run(
        rpc.rpc_artifact(args.dist, args.artifact),
        args.model,
        args.reports,
        console,
        rtts=args.rtt or (),
        mbit=args.mbit or None,
        n_predict=args.n_predict,
        n_max=args.n_max,
    )
    for path in paths:
        console.print(f"rpc study: wrote {path}")


def cmd_rpc_serve(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.runtime import rpc

    rpc.check_bind(args.host, args.allow_all_interfaces)  # the address before any artifact
    artifact = rpc.rpc_artifact(args.dist, args.artifact)
    opts = rpc.ServeOptions(
        host=args.host,
        port=args.port,
        devices=tuple(args.device),
        threads=args.threads,
        cache=args.cache,
        allow_all_interfaces=args.allow_all_interfaces,
    )
    rpc.serve(artifact, opts, console.print, dry_run=args.dry_run)
