"""`llamaspec draft find TARGET`: which draft models fit a target, and why others do not."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import shared

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("draft", help="find a draft model for any target, checked and ranked")
    dsub = d.add_subparsers(dest="draft_command", required=True)
    f = dsub.add_parser(
        "find",
        help="search the Hub for drafts that fit TARGET, judged from GGUF headers",
        description="Read TARGET's GGUF header (range requests, no download), search the Hub "
        "for GGUF repos of its family, read one header of each, apply the engine's draft "
        "rules and print the candidates ranked. TARGET: owner/name (its Q8_0 or Q4_K_M GGUF), "
        "owner/name:file.gguf, a local .gguf, or a model name from `llamaspec models list`.",
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


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command != "draft":
        return False
    from llamaspec import config
    from llamaspec.models import drafts, recipes
    from llamaspec.paths import project_root

    root = project_root()
    catalog = config.load_models(root)
    known = recipes.load_all(root, lambda _m: None)
    target = drafts.resolve_target(args.target, catalog)
    found = drafts.find(
        target,
        catalog,
        known,
        limit=args.limit,
        extra_terms=args.search,
        say=lambda m: console.print(m, style="dim"),
    )
    console.print(drafts.table(found))
    for s in found.skipped:
        console.print(f"skipped: {s}", style="dim")
    compatible = [c for c in found.candidates if c.ok]
    console.print(
        f"draft find: {found.searched} repo(s) found, {len(found.candidates)} header(s) read, "
        f"{len(compatible)} compatible."
    )
    if not compatible:
        console.print(drafts.no_draft_advice(found, catalog, known))
    return True
