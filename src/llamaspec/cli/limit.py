"""`llamaspec limit`: the engine's speculation ceiling, synthetic acceptance α × draft
length swept against a perfect engine of the verification costs measured on their own
(perf/limit.py), with shipped recipes' bench reports set against it."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import shared

if TYPE_CHECKING:
    from rich.console import Console

# The sweep's defaults (perf/limit.py holds the same; a unit test keeps them equal).
ALPHAS = "0,0.25,0.5,0.7,0.8,0.9,0.95"
LENGTHS = "1,2,4,8"
TOKENS = 64
REPETITIONS = 2
# The longest draft length taken (perf/limit.py MAX_LENGTH, the recipes' draft_n_max bound).
MAX_LENGTH = 256


def numbers(kind: type):
    """argparse type: a comma-separated list of `kind` (float or int), e.g. 0,0.5,0.9."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(v) for v in text.split(",") if v.strip())
        except ValueError:
            values = ()
        if kind is int and any(v > MAX_LENGTH for v in values):
            raise argparse.ArgumentTypeError(
                f"{text!r} has a draft length above {MAX_LENGTH}, the longest draft a recipe "
                "may ask for (draft_n_max): the engine gets γ as its draft maximum and γ "
                f"synthetic rates on its command line. Give lengths such as {LENGTHS}."
            )
        if not values:
            what = "numbers" if kind is float else "whole numbers"
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of {what}, e.g. "
                f"{ALPHAS if kind is float else LENGTHS}"
            )
        return values

    parse.__name__ = f"{kind.__name__} list"
    return parse


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "limit",
        help="the engine's speculation ceiling: synthetic acceptance × draft length against "
        "a perfect engine of measured costs",
        description="Time the verification step of each draft length γ on its own at both\n"
        "ends (drafts of γ tokens all accepted, then all rejected, between plain\n"
        "decodes; a round is priced between them by what it accepted), then sweep\n"
        "synthetic acceptance α × γ on the same server (a free n-gram draft whose\n"
        "tokens a coin accepts: upstream's --spec-synth-rates, benchmarking only), plain\n"
        "decoding taking turns.\n"
        "Each point's ceiling is the speedup a perfect engine of those measured costs\n"
        "gives over the point's own counts; the report flags any point above it beyond\n"
        "the measured noise, with acceptance per drafted token and as the block mean, and\n"
        "a plot. With --bench, each bench report's speedup ÷ the ceiling at its own\n"
        "counts, draft length and draft cost.",
    )
    shared.add_artifact_args(p)
    p.add_argument(
        "--model",
        type=shared.existing_file,
        help="the target GGUF (default: the embedded Gemma 3 270M Q4_K_M)",
    )
    p.add_argument(
        "--alphas",
        type=numbers(float),
        default=ALPHAS,
        metavar="A,B,…",
        help=f"acceptance rates α to sweep, each in [0, 1) (default {ALPHAS})",
    )
    p.add_argument(
        "--lengths",
        type=numbers(int),
        default=LENGTHS,
        metavar="N,M,…",
        help=f"draft lengths γ to sweep, each 1 to {MAX_LENGTH} (default {LENGTHS})",
    )
    p.add_argument("--repetitions", type=shared.positive, default=REPETITIONS)
    p.add_argument(
        "--tokens", type=shared.positive, default=TOKENS, help=f"tokens a sample (default {TOKENS})"
    )
    p.add_argument(
        "--threads",
        "-t",
        type=shared.positive,
        metavar="N",
        help="llama-server threads for both servers (default: the engine's)",
    )
    p.add_argument(
        "--bench",
        type=shared.some_file,
        action="append",
        default=[],
        metavar="REPORT.json",
        help="a bench report (reports/bench-<recipe>-<artifact>.json) to set against the "
        "ceiling (repeatable)",
    )
    shared.add_reports(p)
    p.set_defaults(handler=cmd_limit)


def cmd_limit(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.perf import limit, limit_report

    plan = limit.LimitPlan(
        alphas=tuple(args.alphas),
        lengths=tuple(args.lengths),
        repetitions=args.repetitions,
        tokens=args.tokens,
        threads=args.threads,
    )  # an α or γ out of range is refused before anything loads
    artifact = shared.load_artifact(args)
    limit_report.run(artifact, args.model, plan, args.bench, args.reports, console)
