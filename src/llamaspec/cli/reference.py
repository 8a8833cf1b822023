"""The docs site's generated CLI reference: a page of the users' commands and one of the
maintainers', each command with its `--help`, from the argument parser (docs/hooks.py
writes them when the site is built). The JSON Schemas are committed files, written by
config/schemas.py."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from llamaspec.cli.main import MAINTAINER, make_parser

WIDTH = "100"  # help is wrapped to this many columns, whatever the terminal


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's subcommands in the order they were added (all of them, listed or not)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(name: str, parser: argparse.ArgumentParser, depth: int) -> Iterator[tuple[str, int, str]]:
    yield name, depth, parser.format_help()
    for sub, child in _subcommands(parser).items():
        yield from _walk(f"{name} {sub}", child, depth + 1)


def _page(title: str, intro: str, commands: dict[str, argparse.ArgumentParser]) -> str:
    out = [f"# {title}", "", intro, ""]
    for name, parser in commands.items():
        for full, depth, text in _walk(f"llamaspec {name}", parser, 2):
            out += [f"{'#' * min(depth, 4)} `{full}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out)


def cli_pages() -> dict[str, str]:
    """docs path → Markdown: the users' commands and the maintainers', each with its help."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse reads it whenever it formats help
    try:
        parser = make_parser()
        commands = _subcommands(parser)
        note = "Generated from the argument parser when the site is built (`cli/reference.py`)."
        return {
            "reference/cli.md": _page(
                "Command line",
                f"{note}\n\n```text\n{parser.format_help().rstrip()}\n```",
                {k: v for k, v in commands.items() if k not in MAINTAINER},
            ),
            "maintainers/cli.md": _page(
                "Maintainer commands",
                f"{note} Each also runs as `llamaspec maint COMMAND`.",
                {k: v for k, v in commands.items() if k in MAINTAINER},
            ),
        }
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
