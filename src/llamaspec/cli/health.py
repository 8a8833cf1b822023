"""`llamaspec maint health` (maint/health.py): the health matrix across upstream builds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "health",
        help="build a list of engine pins and, for each, run the strict tier, a first-exposure "
        "bench and the synthetic-acceptance sweep; write one matrix with regression flags",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        type=options.non_empty,
        help="only this engine's pins (repeatable; default: every engine's)",
    )
    p.add_argument(
        "--pins",
        action="append",
        default=[],
        type=options.non_empty,
        metavar="SHA|LABEL",
        help="only these pins of the list (repeatable, or A,B): a SHA prefix or a label",
    )
    p.add_argument(
        "--mirror",
        action="append",
        default=[],
        type=_mirror,
        metavar="ENGINE=DIR",
        help="build that engine's pins from a clone with history (bare or not) (repeatable)",
    )
    p.add_argument(
        "--recipe",
        type=options.non_empty,
        default="gemma3-270m-ngram",
        help="the recipe the bench runs (default: gemma3-270m-ngram)",
    )
    p.add_argument(
        "--repetitions",
        type=shared.positive,
        default=2,
        help="bench repetitions per workload (default 2)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the pins an earlier, interrupted run finished (its health.json in --reports)",
    )
    p.add_argument("--no-bench", action="store_true", help="skip the first-exposure bench")
    p.add_argument("--no-sweep", action="store_true", help="skip the synthetic-acceptance sweep")
    shared.add_dist(p)
    shared.add_reports(p, "health.json, health.md and each pin's reports go")
    p.set_defaults(handler=cmd_health)


def _mirror(text: str) -> tuple[str, Path]:
    """argparse type for --mirror ENGINE=DIR: both halves (the command checks both)."""
    name, sep, where = text.partition("=")
    if not sep or not name.strip() or not where.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not ENGINE=DIR; e.g. ik_llama.cpp=ik_llama.cpp.git"
        )
    return name, options.checked_path(where, "some-dir", "give ENGINE=DIR with a clone in DIR")


def cmd_health(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint import health

    health.command(
        args.engine,
        args.pins,
        args.dist,
        args.reports,
        console,
        resume=args.resume,
        recipe=args.recipe,
        repetitions=args.repetitions,
        mirrors=dict(args.mirror),
        bench=not args.no_bench,
        sweep=not args.no_sweep,
    )
