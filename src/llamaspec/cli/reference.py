"""The docs site's generated reference: CLI pages from the argument parser, and the JSON
Schemas of recipes and of `models.yaml` from their pydantic models (docs/hooks.py)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator

from llamaspec import config
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


SCHEMAS = {
    "recipe": (config.Recipe, "recipes/NAME.yaml (and recipes in the user config directory)"),
    "models": (config.ModelsFile, "models.yaml: model files and pairs"),
}


def schemas() -> dict[str, dict]:
    """Schema name → the JSON Schema (draft 2020-12, as pydantic writes it) of its file."""
    out = {name: model.model_json_schema(mode="validation") for name, (model, _) in SCHEMAS.items()}
    # a recipe file may leave out `name`: its file name gives it (config._load_recipe)
    out["recipe"]["required"] = [k for k in out["recipe"]["required"] if k != "name"]
    return out


def schema_files() -> dict[str, str]:
    """docs path → text: each schema as JSON, and a page that shows and links them."""
    out, page = {}, ["# Schemas", ""]
    page += [
        "The files llamaspec reads are validated by pydantic models; these are their JSON "
        "Schemas, exported when the site is built. Editors that read JSON Schema (VS Code's "
        "YAML extension: `# yaml-language-server: $schema=URL` on a file's first line) "
        "complete and check recipes with them.",
        "",
    ]
    for name, schema in schemas().items():
        text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
        out[f"reference/{name}.schema.json"] = text
        page += [
            f"## {name}",
            "",
            f"{SCHEMAS[name][1]}: [`{name}.schema.json`]({name}.schema.json)",
            "",
            "```json",
            text.rstrip(),
            "```",
            "",
        ]
    out["reference/schemas.md"] = "\n".join(page)
    return out


def pages() -> dict[str, str]:
    """Every generated docs file: docs path → text."""
    return {**cli_pages(), **schema_files()}
