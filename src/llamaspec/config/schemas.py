"""The JSON Schemas of the files users write (recipes, models.yaml, the user config),
exported from their pydantic models and committed under docs/reference/schemas/, where
editors, the docs site and other tools find them.

`nox -s schemas` (`python -m llamaspec.config.schemas`) rewrites them after a schema change;
`--check` only says which differ. A unit test fails when a committed file is stale."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import BaseModel

from llamaspec.config.models import ModelsFile
from llamaspec.config.recipes import Recipe
from llamaspec.config.user import UserConfig
from llamaspec.paths import project_root

DIR = "docs/reference/schemas"  # from the checkout's root
DIALECT = "https://json-schema.org/draft/2020-12/schema"  # what pydantic writes
REGENERATE = "nox -s schemas (or python -m llamaspec.config.schemas)"
SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "recipe": (Recipe, "recipes/NAME.yaml (and recipes in the user config directory)"),
    "models": (ModelsFile, "models.yaml: model files and pairs (and the user's own models.yaml)"),
    "user-config": (UserConfig, "config.yaml in the user config directory: build defaults"),
}


def schemas() -> dict[str, dict]:
    """Schema name → the JSON Schema (draft 2020-12) of its file, as editors check it."""
    out = {}
    for name, (model, _) in SCHEMAS.items():
        out[name] = {"$schema": DIALECT, **model.model_json_schema(mode="validation")}
    # a recipe file may leave out `name`: its file name gives it (recipes.load_recipes)
    out["recipe"]["required"] = [k for k in out["recipe"]["required"] if k != "name"]
    return out


def texts() -> dict[str, str]:
    """File name (`recipe.schema.json`) → the text committed for it."""
    return {
        f"{name}.schema.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in schemas().items()
    }


def stale(root: Path) -> list[str]:
    """The files under root/DIR that differ from what the models give: missing, changed, or
    a schema no model gives any more."""
    where = root / DIR
    want = texts()
    have = {p.name for p in where.glob("*.schema.json")}
    changed = [
        f"{DIR}/{name}"
        for name, text in want.items()
        if not (where / name).is_file() or (where / name).read_text(encoding="utf-8") != text
    ]
    return changed + [f"{DIR}/{name}" for name in sorted(have - set(want))]


def write(root: Path) -> list[str]:
    """Write every schema under root/DIR (and drop the ones no model gives); what changed."""
    changed = stale(root)
    where = root / DIR
    where.mkdir(parents=True, exist_ok=True)
    want = texts()
    for name, text in want.items():
        (where / name).write_text(text, encoding="utf-8")
    for old in where.glob("*.schema.json"):
        if old.name not in want:
            old.unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llamaspec.config.schemas",
        description=f"Write the JSON Schemas of {', '.join(SCHEMAS)} under {DIR}/.",
    )
    parser.add_argument("--check", action="store_true", help="only say which files differ")
    parser.add_argument("--root", type=Path, help="the checkout (default: this one)")
    args = parser.parse_args(argv)
    root = args.root or project_root()
    if not (root / "docs").is_dir():
        print(f"{root} is not a llamaspec checkout (no docs/); give --root.", file=sys.stderr)
        return 2
    if args.check:
        bad = stale(root)
        for path in bad:
            print(f"{path} differs from the pydantic models; run {REGENERATE}", file=sys.stderr)
        return 1 if bad else 0
    changed = write(root)
    print("\n".join(f"updated {p}" for p in changed) or f"{DIR}/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
