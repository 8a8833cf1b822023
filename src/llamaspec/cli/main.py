"""The `llamaspec` command line; the noxfile calls the same entry points."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from llamaspec import __version__, config, procs
from llamaspec.cli import bench as cli_bench
from llamaspec.cli import docker as cli_docker
from llamaspec.cli import doctor as cli_doctor
from llamaspec.cli import models as cli_models
from llamaspec.cli import patches as cli_patches
from llamaspec.cli import verify as cli_verify
from llamaspec.engine.build import load_artifact, newest_artifact
from llamaspec.engine.pipeline import BuildSpec, run_build
from llamaspec.errors import LlamaspecError
from llamaspec.proof.smoke import smoke_artifact


def _build_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build", help="fetch, patch, build and smoke-test llama-server")
    p.add_argument("--engine", default="llama.cpp", help="llama.cpp (default) or ik_llama.cpp")
    p.add_argument("--pin", help="engine commit (full 40-character SHA); default: engines.yaml")
    p.add_argument(
        "--source",
        default="auto",
        choices=["auto", "git", "pypi", "local"],
        help="where the source comes from (auto: git, else the PyPI mirror)",
    )
    p.add_argument("--source-dir", type=Path, help="engine checkout for --source local")
    p.add_argument("--backend", default="cpu", help="cpu (default), cuda or vulkan")
    p.add_argument(
        "--patch", action="append", default=[], metavar="ID", help="also apply this catalog patch"
    )
    p.add_argument(
        "--no-patch", action="append", default=[], metavar="ID", help="skip this catalog patch"
    )
    p.add_argument(
        "--no-default-patches", action="store_true", help="apply only patches named with --patch"
    )
    p.add_argument(
        "--define",
        "-D",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra CMake define (repeatable); overrides the profile",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME",
        help="profile variant: fast-build (ik), portable, rpc (repeatable)",
    )
    p.add_argument(
        "--cuda-arch",
        metavar="ARCHS",
        help="CUDA archs: native, all, all-major or SM numbers like '86;89' (backend cuda)",
    )
    p.add_argument("--jobs", "-j", type=int, help="parallel compile jobs")
    p.add_argument("--dist", type=Path, default=Path("dist"), help="output folder (dist/)")
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke test")
    p.add_argument(
        "--patch-source",
        metavar="DIR|URL",
        help="where commit patches come from (a local mirror or git URL; default: the engine's)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llamaspec", description=__doc__)
    parser.add_argument("--version", action="version", version=f"llamaspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _build_parser(sub)
    s = sub.add_parser("smoke", help="smoke-test an existing artifact")
    s.add_argument("--artifact", help="artifact id (or prefix) in dist/; default: newest")
    s.add_argument("--dist", type=Path, default=Path("dist"))
    sub.add_parser("engines", help="list engines and their default pins")
    cli_verify.add_parsers(sub)
    cli_bench.add_parsers(sub)
    cli_patches.add_parsers(sub)
    cli_models.add_parsers(sub)
    cli_docker.add_parsers(sub)
    cli_doctor.add_parsers(sub)
    args = parser.parse_args(argv)
    procs.install_signal_handlers()
    console = Console(highlight=False, soft_wrap=True)
    try:
        if (
            cli_verify.dispatch(args, console)
            or cli_bench.dispatch(args, console)
            or cli_patches.dispatch(args, console)
            or cli_models.dispatch(args, console)
            or cli_docker.dispatch(args, console)
            or cli_doctor.dispatch(args, console)
        ):
            pass
        elif args.command == "build":
            artifact = run_build(
                BuildSpec(
                    engine=args.engine,
                    pin=args.pin,
                    source=args.source,
                    source_dir=args.source_dir,
                    backend=args.backend,
                    patch=tuple(args.patch),
                    no_patch=tuple(args.no_patch),
                    no_default_patches=args.no_default_patches,
                    defines=tuple(args.define),
                    jobs=args.jobs,
                    dist=args.dist,
                    patch_source=args.patch_source,
                    variants=tuple(args.variant),
                    cuda_arch=args.cuda_arch,
                ),
                console,
            )
            if not args.no_smoke:
                smoke_artifact(artifact, console)
        elif args.command == "smoke":
            smoke_artifact(
                load_artifact(args.dist, args.artifact or newest_artifact(args.dist)), console
            )
        elif args.command == "engines":
            for e in config.load_engines().values():
                mirror = f"{e.pypi.package}=={e.pypi.version}" if e.pypi else "-"
                console.print(f"{e.name:14} {e.pin} {e.tag:16} dialect={e.dialect} pypi={mirror}")
    except LlamaspecError as exc:
        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted; caches were left consistent")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
