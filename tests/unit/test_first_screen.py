"""The first screen of README.md, docs/index.md and docs/start.md answers "what do I type"
(issue 55): a quick start under the tagline, then a table of recipes with one command per
row. The three pages carry the same block; its commands parse with the real CLI, the recipes
it names exist, each row's number says whether it was measured here (with that recipe's
report) or reported elsewhere, and no sentence there runs past 35 words."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from llamaspec.cli.main import make_parser as parser
from llamaspec.config.recipes import load_recipes

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/index.md", "docs/start.md")
# Recipes a user asking for each speculation family should find on the first screen.
MUST = ("qwen3.6-27b-mtp", "gemma-4-31b-assistant", "llama-3.1-8b-eagle3", "gemma3-270m-q4-draft")
FACT = re.compile(r"<!--.*?-->")


def block(page: str) -> str:
    """The page's text from "## Quick start" to the next section after "## Pick a recipe"."""
    text = (ROOT / page).read_text()
    start = text.index("## Quick start")
    pick = text.index("## Pick a recipe", start)
    end = text.find("\n## ", pick + 1)
    return text[start : end if end > 0 else len(text)]


def same(text: str) -> str:
    """A page's block with its links made root-relative, to compare the three pages."""
    return text.replace("](guides/", "](docs/guides/")


def commands(text: str) -> list[list[str]]:
    """The `$ llamaspec …` lines of the console block and the table's command column."""
    lines = [ln[2:] for ln in text.splitlines() if ln.startswith("$ llamaspec ")]
    lines += [row.split("|")[-2].strip(" `") for row in rows(text)]
    return [shlex.split(line)[1:] for line in lines]


def rows(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("| `")]


def test_the_three_pages_open_with_the_same_quick_start_and_table() -> None:
    readme = block("README.md")
    for page in PAGES[1:]:
        assert same(block(page)) == readme, f"{page} opens differently from README.md"
    head = (ROOT / "README.md").read_text().split("## Quick start")[0]
    assert len(head.splitlines()) <= 4, "README's quick start comes right under the tagline"


def test_every_command_parses_and_names_a_recipe_that_exists() -> None:
    recipes = load_recipes(ROOT)
    argvs = commands(block("README.md"))
    assert len(argvs) >= 10
    for argv in argvs:
        try:
            args = parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"llamaspec {' '.join(argv)}: the CLI refuses it")
        if argv[0] in ("serve", "bench"):
            assert args.recipe in recipes, f"{args.recipe}: no such recipe"


def test_each_row_says_measured_or_reported_and_the_families_are_there() -> None:
    recipes = load_recipes(ROOT)
    table = rows(block("README.md"))
    named = {row.split("|")[1].strip(" `"): row for row in table}
    assert set(MUST) <= set(named), "the first screen misses a speculation family"
    for name, row in named.items():
        recipe = recipes[name]
        assert f"serve {name}" in row.split("|")[-2], row
        speed = row.split("|")[5]
        if recipe.measured:
            assert speed.strip().startswith("measured:") and recipe.measured.report in speed
        elif recipe.reported:
            assert speed.strip().startswith("reported:"), row
        else:
            assert "not measured" in speed, row


def test_no_sentence_on_the_first_screen_runs_past_35_words() -> None:
    prose = re.sub(r"^```.*?^```", "", block("README.md"), flags=re.S | re.M)
    prose = FACT.sub("", prose)
    cells = [c for row in prose.splitlines() if row.startswith("|") for c in row.split("|")]
    text = " ".join(ln for ln in prose.splitlines() if not ln.startswith("|"))
    sentences = [*re.split(r"(?<=[.!?])\s+", text), *cells]
    longest = max(sentences, key=lambda s: len(s.split()))
    assert len(longest.split()) <= 35, longest
