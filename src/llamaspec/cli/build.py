"""`llamaspec build`, `smoke` and `engines`."""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="fetch, patch, build and smoke-test llama-server")
    options.add(p)
    p.set_defaults(handler=cmd_build)
    s = sub.add_parser("smoke", help="smoke-test an existing artifact")
    shared.add_artifact_args(s)
    s.add_argument(
        "--spec-args",
        type=spec_args,
        metavar="ARGS",
        help="speculation arguments for the speculative server instead of the smoke's own, "
        "in one string as on a shell line ({model} stands for the embedded model): "
        "smoke-test your own speculation flags on this build",
    )
    s.add_argument(
        "--out",
        type=shared.out_dir,
        help="where smoke.json and the server logs go (default: the artifact's directory)",
    )
    s.set_defaults(handler=cmd_smoke)
    e = sub.add_parser("engines", help="list engines and their default pins")
    e.set_defaults(handler=cmd_engines)


def spec_args(text: str) -> list[str]:
    """argparse type for --spec-args: one string, split like a shell (quotes allowed)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"cannot be split like a shell line: {exc}") from None
    if not argv:
        raise argparse.ArgumentTypeError("is empty; give the speculation flags to use")
    return argv


def cmd_build(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine.pipeline import run_build
    from llamaspec.proof.smoke import smoke_artifact

    artifact = run_build(options.build_spec(args), console)
    if not args.no_smoke:
        smoke_artifact(artifact, console)


def cmd_smoke(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine.artifact import load_artifact, newest_artifact
    from llamaspec.proof.smoke import smoke_artifact

    artifact = load_artifact(args.dist, args.artifact or newest_artifact(args.dist))
    smoke_artifact(artifact, console, spec_args=args.spec_args, out_dir=args.out)


def cmd_engines(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config

    for e in config.load_engines().values():
        mirror = f"{e.pypi.package}=={e.pypi.version}" if e.pypi else "-"
        console.print(f"{e.name:14} {e.pin} {e.tag:16} dialect={e.dialect} pypi={mirror}")
        for h in e.history:
            where = f"pypi={h.pypi.package}=={h.pypi.version}" if h.pypi else "git"
            console.print(f"  history {h.pin} {h.date} {where}: {h.note}", markup=False)
