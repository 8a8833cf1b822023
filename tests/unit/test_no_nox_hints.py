"""No message an installed user sees tells them to run nox: a pip or pipx install has no
noxfile, so every hint names the `llamaspec …` command instead. Maintainer commands
(llamaspec/maint) and text only a checkout's contributors meet are the exceptions, each
with its reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import llamaspec

SRC = Path(llamaspec.__file__).parent
NOX = re.compile(r"\bnox -s\b|`nox\b")
# module: why its nox mention is for contributors of a checkout only
CONTRIBUTORS_ONLY = {
    "lock.py": "the header of llamaspec.lock, the maintainers' file `nox -s lock` writes",
    "config/schemas.py": "regenerates docs/reference/schemas, which only a checkout has",
}


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, nodes) and n.body and isinstance(n.body[0], ast.Expr)
    }


def nox_hints(path: Path, root: Path = SRC) -> list[str]:
    """The string literals (f-string parts included, docstrings not) that mention nox."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    return [
        f"{path.relative_to(root)}:{n.lineno}: {n.value.strip()[:80]}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
        if NOX.search(n.value)
    ]


def test_no_user_facing_message_tells_an_installed_user_to_run_nox() -> None:
    found = [
        hint
        for path in sorted(SRC.rglob("*.py"))
        if "maint" not in path.relative_to(SRC).parts
        and path.relative_to(SRC).as_posix() not in CONTRIBUTORS_ONLY
        for hint in nox_hints(path)
    ]
    assert found == [], "hints an installed user cannot follow:\n" + "\n".join(found)


def test_the_scan_sees_nox_in_messages_and_the_exceptions_still_exist(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Docstrings may say `nox -s lock`."""\n'
        'def f(e):\n    raise ValueError(f"build {e} first (`nox -s build-cpu`)")\n'
    )
    assert [h.split(": ", 1)[0] for h in nox_hints(sample, tmp_path)] == ["sample.py:3"]
    for module in CONTRIBUTORS_ONLY:
        assert nox_hints(SRC / module), f"{module} no longer mentions nox: drop its exception"
