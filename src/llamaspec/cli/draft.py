"""`llamaspec draft find TARGET`: which draft models fit a target, and why others do not."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import shared
from llamaspec.errors import LlamaspecError
from llamaspec.paths import default_out

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("draft", help="find a draft model for any target, checked and ranked")
    dsub = d.add_subparsers(dest="draft_command", required=True)
    f = dsub.add_parser(
        "find",
        help="search the Hub for drafts that fit TARGET, judged from GGUF headers",
        description="Read TARGET's GGUF header (range requests, no download), search the Hub\n"
        "for GGUF repos of its family, read one header of each, apply the engine's draft\n"
        "rules and print the candidates ranked. TARGET: owner/name (its Q8_0 or Q4_K_M\n"
        "GGUF), owner/name:file.gguf, a local .gguf, or a model name from\n"
        "`llamaspec models list`.",
    )
    f.add_argument("target", metavar="TARGET")
    f.add_argument(
        "--limit",
        type=shared.positive,
        default=20,
        metavar="N",
        help="at most N repos per search term, most downloaded first (default 20)",
    )
    f.add_argument(
        "--search",
        action="append",
        default=[],
        metavar="TERM",
        help="search the Hub for TERM too (repeatable), e.g. a published draft's name",
    )
    m = f.add_argument_group("measuring (--measure)")
    m.add_argument(
        "--measure",
        action="store_true",
        help="download the top compatible drafts that fit --memory, check and time them on "
        "your build, write the winner as recipes/<target>-draft.yaml in the user config dir",
    )
    m.add_argument(
        "--memory",
        type=shared.quantity("GiB"),
        metavar="GIB",
        help="memory for target + draft + KV cache, in GiB (default: this machine's RAM)",
    )
    m.add_argument(
        "--ctx",
        type=shared.positive,
        metavar="N",
        help="context the memory estimate and the recipe use (default 4096)",
    )
    m.add_argument(
        "--top",
        type=shared.positive,
        metavar="K",
        help="measure at most K drafts, best ranked first (default 2)",
    )
    shared.add_reports(m)
    shared.add_artifact_args(m)
    m.set_defaults(reports=None, dist=None)  # given or not: they go with --measure only
    f.set_defaults(handler=cmd_draft_find)


def cmd_draft_find(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.perf import draft_measure

    _check(args)
    path = draft_measure.draft_find(
        args.target,
        console,
        limit=args.limit,
        extra_terms=args.search,
        measuring=args.measure,
        memory_gb=args.memory,
        ctx=args.ctx or 4096,
        top=args.top or 2,
        reports=args.reports or default_out("reports"),
        dist=args.dist or default_out("dist"),
        artifact_id=args.artifact,
    )
    if path is not None:
        console.print(
            f"draft measure: wrote {path} (models and pair in your models.yaml); check it with "
            f"`llamaspec verify --recipe {path.stem}`"
        )


def _check(args: argparse.Namespace) -> None:
    """The measuring options go with --measure; --memory is a size."""
    measuring = ("memory", "ctx", "top", "reports", "artifact", "dist")
    given = [f"--{o}" for o in measuring if getattr(args, o) is not None]
    if given and not args.measure:
        raise LlamaspecError(
            f"{', '.join(given)} shape(s) a measurement: add --measure (or drop them to only "
            "search and rank)."
        )
    if args.memory is not None and args.memory <= 0:
        raise LlamaspecError(f"--memory {args.memory:g} is not a size in GiB above 0.")
