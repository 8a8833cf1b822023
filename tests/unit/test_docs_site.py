"""The docs site: its generated reference covers every command and schema, the schemas
accept the repository's own files, and the strict build fails on what it is for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from llamaspec import config
from llamaspec.cli import reference
from llamaspec.cli.main import MAINTAINER, make_parser

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_the_cli_pages_hold_every_command_and_subcommand() -> None:
    pages = reference.cli_pages()
    users, maint = pages["reference/cli.md"], pages["maintainers/cli.md"]
    commands = reference._subcommands(make_parser())
    for name, parser in commands.items():
        page = maint if name in MAINTAINER else users
        assert f"## `llamaspec {name}`" in page, name
        for sub in reference._subcommands(parser):
            assert f"### `llamaspec {name} {sub}`" in page, (name, sub)
    assert "## `llamaspec models`" in users and "### `llamaspec models pull`" in users
    assert "## `llamaspec bump`" in maint and "llamaspec bump" not in users.split("## ")[1]
    # help is wrapped to a fixed width, not the terminal's of whoever builds the site
    assert max(len(ln) for ln in users.splitlines() if not ln.startswith("#")) <= 100


def test_the_exported_schemas_accept_every_recipe_and_models_yaml() -> None:
    committed = ROOT / "docs" / "reference" / "schemas"  # the files the site serves
    schemas = {
        p.name.removesuffix(".schema.json"): json.loads(p.read_text())
        for p in committed.glob("*.schema.json")
    }

    def plain(data: object) -> object:
        """data as an editor checks it: YAML's dates are text there"""
        return json.loads(json.dumps(data, default=str))

    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    assert len(recipes) > 5
    for path in recipes:
        jsonschema.validate(plain(yaml.safe_load(path.read_text())), schemas["recipe"])
    models = yaml.safe_load((ROOT / "models.yaml").read_text())
    jsonschema.validate(plain(models), schemas["models"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x", "pair": "y", "spec": {"types": []}}, schemas["recipe"])
    assert {p.relative_to(ROOT / "docs").as_posix() for p in committed.iterdir()} == {
        "reference/schemas/recipe.schema.json",
        "reference/schemas/models.schema.json",
        "reference/schemas/user-config.schema.json",
    }
    assert (ROOT / "docs" / "reference" / "schemas.md").is_file()
    assert config.Recipe.model_fields.keys() <= schemas["recipe"]["properties"].keys()


def _site(tmp_path: Path, pages: dict[str, str], nav: list[str]) -> subprocess.CompletedProcess:
    """Build a small site with the repository's own strictness settings."""
    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    for name, text in pages.items():
        (docs / name).write_text(text)
    settings = {
        "site_name": "t",
        "strict": ours["strict"],
        "validation": ours["validation"],
        "theme": {"name": "material"},
        "nav": nav,
    }
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(settings))
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-f", str(tmp_path / "mkdocs.yml")],
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_the_strict_build_fails_on_a_broken_link_an_anchor_or_a_page_left_out(
    tmp_path: Path,
) -> None:
    good = {"index.md": "# Home\n\n[there](b.md#a-heading)\n", "b.md": "# B\n\n## A heading\n"}
    ok = _site(tmp_path, good, ["index.md", "b.md"])
    assert ok.returncode == 0, ok.stderr
    for pages, nav, said in (
        ({**good, "index.md": "[gone](nowhere.md)\n"}, ["index.md", "b.md"], "nowhere.md"),
        ({**good, "index.md": "[x](b.md#no-such)\n"}, ["index.md", "b.md"], "no-such"),
        ({**good, "c.md": "# C\n"}, ["index.md", "b.md"], "c.md"),
    ):
        for stale in (tmp_path / "docs").glob("*.md"):
            stale.unlink()
        proc = _site(tmp_path, pages, nav)
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr
