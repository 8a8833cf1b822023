"""`llamaspec verify`: speculation must change nothing but speed."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.errors import LlamaspecError

if TYPE_CHECKING:
    from rich.console import Console


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


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command != "verify":
        return False
    from llamaspec.engine.build import load_artifact, newest_artifact
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.embedded import embedded_model
    from llamaspec.proof import verify
    from llamaspec.proof.hybrid import hybrid_model

    artifact = load_artifact(args.dist, args.artifact or newest_artifact(args.dist))
    dialect = dialect_for(artifact, console.print)
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
