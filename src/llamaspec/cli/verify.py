"""`llamaspec verify` and `llamaspec bench`: correctness and speed of speculation."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from llamaspec.engine.build import load_artifact
from llamaspec.engine.build_bench import bench_build
from llamaspec.engine.pipeline import dialect_for, newest_artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.embedded import embedded_model
from llamaspec.proof import bench, verify
from llamaspec.proof.hybrid import hybrid_model


def add_parsers(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("verify", help="equivalence suite: speculation changes nothing but speed")
    v.add_argument("--artifact", help="artifact id (or prefix); default: newest in dist/")
    v.add_argument("--dist", type=Path, default=Path("dist"))
    v.add_argument(
        "--method",
        action="append",
        default=[],
        help="only these methods (draft, ngram-simple, ngram-map-k, ngram-mod, mtp)",
    )
    v.add_argument(
        "--model",
        choices=["embedded", "hybrid"],
        action="append",
        default=[],
        help="embedded Gemma pair (default) and/or the random hybrid qwen35 model",
    )
    v.add_argument(
        "--mode",
        action="append",
        default=[],
        choices=["sequential", "parallel"],
        help="only these request modes (default: both)",
    )
    v.add_argument("--reports", type=Path, default=Path("reports"))
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
    if args.command not in ("verify", "bench", "bench-build"):
        return False
    artifact = load_artifact(args.dist, args.artifact or newest_artifact(args.dist))
    if args.command == "bench-build":
        bench_build(artifact, args.dist, args.reports, console)
        return True
    dialect = dialect_for(artifact, console)
    if args.command == "verify":
        failed = []
        for which in args.model or ["embedded"]:
            methods = args.method or None
            if which == "embedded":
                model = draft = embedded_model(console.print)
            else:
                # The target is a random hybrid (recurrent + attention) model and its draft
                # another one with other weights: drafts get rejected, and every rejection
                # restores a context checkpoint. ngram-mod drafts from the context instead.
                model = hybrid_model(artifact, console, seed=1)
                draft = hybrid_model(artifact, console, seed=2)
                methods = methods or ["draft", "ngram-mod"]
            report = verify.verify(
                artifact,
                dialect,
                model,
                args.reports,
                console,
                methods=methods,
                tag=which,
                draft=draft,
                modes=args.mode,
            )
            if not report.passed:
                failed.append(which)
        if failed:
            raise LlamaspecError(
                f"verify found hard divergences ({', '.join(failed)}); see the reports in "
                f"{args.reports}/ for both continuations at each divergence."
            )
        return True
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
