"""README's facts: the paths it names exist, its command lines parse, its YAML parses."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from llamaspec.cli.main import make_parser

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TOP = ("src", "docs", "reports", "recipes", "docker", "tests", "patches", ".ci", ".github")
PATH = re.compile(r"`((?:" + "|".join(map(re.escape, TOP)) + r")/[^`\s]*)`")
# A name that stands for many (a glob, a placeholder) is not one path to check.
PATTERN = re.compile(r"[*<>{}]|\b[A-Z]{2,}\b|\.\.\.|…")


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def commands(prog: str) -> list[str]:
    """`$ prog …` lines of the console blocks, continuation lines joined, comments and
    pipes or further commands cut off."""
    out = []
    for block in blocks("console"):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            if line.startswith(f"$ {prog} "):
                line = re.split(r"\s+#\s|\s&&\s|\s\|\s|\s>\s", line[2:])[0]
                out.append(line.strip())
    return out


def nox_sessions() -> dict[str, list[str] | None]:
    """Session name → the llamaspec arguments it runs before the user's (None: a session
    that runs no llamaspec command), read from noxfile.py."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    out: dict[str, list[str] | None] = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        decorators = [d for d in fn.decorator_list if "session" in ast.dump(d)]
        if not decorators:
            continue
        named = [
            kw.value.value
            for d in decorators
            if isinstance(d, ast.Call)
            for kw in d.keywords
            if kw.arg == "name" and isinstance(kw.value, ast.Constant)
        ]
        prefix = None
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            consts = [a.value for a in call.args if isinstance(a, ast.Constant)]
            if consts[:1] == ["llamaspec"]:
                prefix = consts[1:]
            elif isinstance(call.func, ast.Name) and call.func.id == "_build":
                prefix = ["build", "--backend", *consts]
        out[named[0] if named else fn.name] = prefix
    return out


def parse_fails(parser, argv: list[str]) -> str | None:
    """The parser's complaint about `argv`, or None when it accepts it."""
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            parser.parse_args(argv)
        except SystemExit:
            return err.getvalue().strip().splitlines()[-1]
    return None


def test_every_repository_path_readme_names_exists() -> None:
    named = sorted({m for m in PATH.findall(README) if not PATTERN.search(m)})
    assert named, "README names no repository paths: the pattern is wrong"
    missing = [p for p in named if not (ROOT / p.rstrip("/.,:;")).exists()]
    assert not missing, f"README names paths that do not exist: {missing}"


def test_every_llamaspec_line_parses_with_the_real_parser() -> None:
    lines = commands("llamaspec")
    assert len(lines) > 5
    parser = make_parser()
    bad = []
    for line in lines:
        argv = [a for a in shlex.split(line)[1:] if not PATTERN.search(a)]
        if said := parse_fails(parser, argv):
            bad.append(f"{line}: {said}")
    assert not bad, "README lines the CLI does not accept:\n" + "\n".join(bad)


def test_every_nox_line_names_a_session_and_its_arguments_parse() -> None:
    """`nox -s NAME -- ARGS`: NAME is a session, and the llamaspec command it runs accepts
    ARGS (placeholders such as ID or <id> are left out)."""
    lines = commands("nox")
    assert len(lines) > 5
    sessions = nox_sessions()
    assert sessions["build-cuda"] == ["build", "--backend", "cuda"]
    parser = make_parser()
    bad = []
    for line in lines:
        words = shlex.split(line)
        name = words[2]
        if name not in sessions:
            bad.append(f"{line}: no session {name!r}")
            continue
        prefix = sessions[name]
        args = words[words.index("--") + 1 :] if "--" in words else []
        if prefix is not None and (args or name in ("models", "recipe")):
            argv = [*prefix, *(a for a in args if not PATTERN.search(a))]
            if said := parse_fails(parser, argv or ["--help"]):
                bad.append(f"{line}: {said}")
    assert not bad, "README nox lines that would not run:\n" + "\n".join(bad)


def test_every_yaml_block_parses() -> None:
    texts = blocks("yaml")
    assert texts
    for text in texts:
        yaml.safe_load(text)
