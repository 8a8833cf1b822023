"""`llamaspec bench` and `llamaspec bench-build`: what speculation and builds cost here."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from llamaspec.engine.build import load_artifact, newest_artifact


def add_parsers(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="speedup benchmark with and without speculation")
    b.add_argument(
        "recipe",
        nargs="?",
        default="gemma3-270m-self",
        help="recipe name (default: the embedded pair)",
    )
    b.add_argument("--artifact", help="artifact id (or prefix); default: newest in dist/")
    b.add_argument("--dist", type=Path, default=Path("dist"))
    b.add_argument("--repetitions", type=int, default=3)
    b.add_argument("--n-max", type=int, default=8, help="draft length")
    b.add_argument("--reports", type=Path, default=Path("reports"))
    bb = sub.add_parser("bench-build", help="cold build time: llamaspec vs plain cmake")
    bb.add_argument("--artifact", help="artifact id (or prefix); default: newest in dist/")
    bb.add_argument("--dist", type=Path, default=Path("dist"))
    bb.add_argument("--reports", type=Path, default=Path("reports"))


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command not in ("bench", "bench-build"):
        return False
    artifact = load_artifact(args.dist, args.artifact or newest_artifact(args.dist))
    if args.command == "bench-build":
        from llamaspec.engine.build_bench import bench_build

        bench_build(artifact, args.dist, args.reports, console)
        return True
    from llamaspec.models import dialects
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.embedded import embedded_model
    from llamaspec.proof import bench

    dialect = dialect_for(artifact, console.print)
    model = embedded_model(console.print)
    settings = dialects.SpecSettings("draft", model, n_max=args.n_max)
    bench.bench(
        artifact,
        dialect,
        model,
        settings,
        args.recipe,
        args.reports,
        console,
        repetitions=args.repetitions,
    )
    return True
