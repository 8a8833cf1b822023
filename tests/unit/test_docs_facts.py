"""The docs' facts (README.md and every page of docs/, the reports aside): the paths they
name exist, their command lines parse with the real parsers, their YAML parses, and the
figures they take from reports/ equal the reports.

Paths in code spans are written from the repository's root; links are relative to the page
that holds them (the site's generated pages count as present). Fact markers: right after a
figure taken from a report, a page has an HTML comment (GitHub and the site do not show it)
naming the report's JSON, a JSON pointer (RFC 6901) into it, an optional
divisor, and the figure as README shows it:

    **826.6 MB**<!-- fact: reports/docker-size-X.json#/image_bytes / 1e6 = 826.6 -->

The figure must stand in the text between the previous marker (or the start of its paragraph
or table row) and the marker. A number is compared with the report's value, divided and
rounded half-up (or as the reports' Markdown rounds) to the figure's decimals (`,` groups
thousands); anything else as text, where `…` stands for the middle (`c052b6c4…0abc7`).
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import functools
import io
import json
import posixpath
import re
import shlex
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path, PurePosixPath

import pytest
import yaml

from llamaspec.cli import reference
from llamaspec.cli.main import _maint, make_parser

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The docs' pages: README and docs/**/*.md; reports/ (linked into docs/) are written by the
# commands, not by hand.
PAGES = {
    p.relative_to(ROOT).as_posix(): p.read_text()
    for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    if not p.relative_to(DOCS if DOCS in p.parents else ROOT).as_posix().startswith("reports/")
}
README = PAGES["README.md"]
# Pages the site generates when it is built (docs/hooks.py): links to them are not broken.
GENERATED = {
    f"docs/{p}" for p in [*reference.cli_pages(), "reports/index.md", "reference/environment.md"]
}
# What a repository path starts with (dist/ is build output, not part of the repository).
TOP = ("src/", "docs/", "reports/", "recipes/", "docker/", "tests/", "patches/", ".ci/", ".github/")
TOP_FILES = ("noxfile.py", "models.yaml", "engines.yaml", "llamaspec.lock", "pyproject.toml")
# Package paths README writes without src/ (`llamaspec/images/tools.py`, `cli/options.py`).
PACKAGE = re.compile(r"llamaspec/|(?:cli|engine|models|proof|images)/.*\.py$")
# Path-like names that stand for many files, not one, are not checked, for these reasons.
NOT_ONE_PATH = {
    r"<[^>]*>": "a placeholder such as <id>",
    r"\b[A-Z]{3,}\b": "an upper-case placeholder such as ENGINE",
    r"\.\.\.|…": "elided",
}
# Names that look like this repository's paths but are another tree's.
NOT_OURS = {"src/models/*.cpp": "llama.cpp's own sources (its unity build), not this repository"}
# Shell operators end a command line's arguments.
OPERATORS = {"|", "||", "&&", ";", ">", ">>", "&", "2>&1"}
MARKER = re.compile(
    r"<!-- fact: (?P<report>\S+?)#(?P<pointer>\S*)(?: / (?P<scale>\S+))? = (?P<figure>.+?) -->"
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def prose(text: str = README) -> str:
    """text with its fenced blocks blanked out, line numbers kept."""
    return re.sub(r"^```.*?^```", lambda m: "\n" * m[0].count("\n"), text, flags=re.S | re.M)


def spans(text: str = README) -> list[str]:
    """The inline code spans of text's prose, as written (line breaks kept)."""
    return re.findall(r"`([^`]+)`", prose(text))


def expand(name: str) -> list[str]:
    """`a/{b,c}.py` → `a/b.py`, `a/c.py`."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m[1].split(",") for x in expand(name[: m.start()] + alt + name[m.end() :])]


def named_paths(text: str = README, page: str = "README.md") -> tuple[list[str], dict[str, str]]:
    """The repository paths text names in code spans (from the root) and relative links
    (from page's folder), and the path-like names it skips, each with the reason."""
    names = [s for s in spans(text) if not re.search(r"\s", s)]
    links = re.findall(r"\]\(([^)\s]+)\)", prose(text))
    here = PurePosixPath(page).parent
    for link in (t.split("#")[0] for t in links if not re.match(r"[a-z]+:|#", t)):
        names.append(posixpath.normpath(here / link).removeprefix("./"))
    paths, skipped = set(), {}
    for name in names:
        for one in expand(name.rstrip(".,:;")):
            if PACKAGE.match(one):
                one = "src/llamaspec/" + one.removeprefix("llamaspec/")
            elif not one.startswith(TOP) and one not in TOP_FILES:
                continue
            why = NOT_OURS.get(one) or next(
                (why for pattern, why in NOT_ONE_PATH.items() if re.search(pattern, one)), None
            )
            if why:
                skipped[one] = why
            else:
                paths.add(one)
    return sorted(paths), skipped


def missing_paths(paths: list[str], root: Path = ROOT) -> list[str]:
    """The paths that do not exist under root (a glob: that match nothing)."""
    return [
        p
        for p in paths
        if p not in GENERATED and not (any(root.glob(p)) if "*" in p else (root / p).exists())
    ]


def command_lines(start: str, text: str = README) -> list[tuple[str, bool]]:
    """Command lines of the program `start` begins with, with whether each is inline: the
    `$ ` lines of console blocks and every line of bash/sh blocks (continuations joined),
    then the code spans that begin with `start` (`nox -s `: not a bare `nox -s`)."""
    prog, out = start.split()[0], []
    for lang, block in re.findall(r"```(console|bash|sh)\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if lang == "console" and not line.startswith("$ "):
                continue
            if (line := line.removeprefix("$ ")).startswith(f"{prog} "):
                out.append((line, False))
    joined = (" ".join(s.split()) for s in spans(text))
    return out + [(s, True) for s in joined if s.startswith(start)]


def words(line: str) -> list[str]:
    """A command line's words, cut at its comment or first shell operator. `[…]` optional
    groups are taken in; a word that is only `...` or `…` (arguments left out) is dropped.
    Placeholders (NAME, <id>, ik-llamacpp-cpu-…) stay: each stands for one string."""
    out = shlex.split(line, comments=True)
    cut = next((i for i, w in enumerate(out) if w in OPERATORS), len(out))
    return [w.strip("[]") for w in out[:cut] if w not in ("...", "…")]


def nox_sessions() -> dict[str, tuple[list[str], list[str]] | None]:
    """Session name → (the llamaspec arguments it puts before the user's, the arguments it
    uses when given none), read from noxfile.py; None for a session that runs no llamaspec."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    out: dict[str, tuple[list[str], list[str]] | None] = {}
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
        runs = None
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            consts = [a.value for a in call.args if isinstance(a, ast.Constant)]
            # `*(session.posargs or ["list"])`: what the session runs without arguments
            default = [
                e.value
                for a in call.args
                if isinstance(a, ast.Starred) and isinstance(a.value, ast.BoolOp)
                for e in getattr(a.value.values[-1], "elts", [])
            ]
            if consts[:1] == ["llamaspec"]:
                runs = (consts[1:], default)
            elif isinstance(call.func, ast.Name) and call.func.id == "_build":
                runs = (["build", "--backend", *consts], [])
        out[named[0] if named else fn.name] = runs
    return out


@functools.cache
def parser():
    return make_parser()


def complaint(argv: list[str], mention: bool = False) -> str | None:
    """The real parser's complaint about argv, or None when it accepts it (`--help`
    included). A mention (prose naming a command, no options: `llamaspec bench`) may leave
    out required arguments, but must name a real command."""
    with (
        contextlib.redirect_stderr(io.StringIO()) as err,
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            parser().parse_args(_maint(argv))  # `llamaspec maint CMD` as the CLI reads it
        except SystemExit as exit_:
            said = None if exit_.code == 0 else err.getvalue().strip().splitlines()[-1]
            if said and mention and "arguments are required" in said:
                return complaint([*argv, "--help"])
            return said
    return None


def llamaspec_problems(text: str = README) -> list[str]:
    """text's `llamaspec …` lines that the real parser refuses, with its complaint."""
    bad = []
    for line, inline in command_lines("llamaspec ", text):
        argv = words(line)[1:]
        mention = inline and not any(w.startswith("-") for w in argv)
        if said := complaint(argv, mention):
            bad.append(f"{line}: {said}")
    return bad


def nox_problems(text: str = README) -> list[str]:
    """text's `nox -s NAME -- ARGS` lines whose NAME is no session, or whose session's
    llamaspec command refuses ARGS (its default arguments where there are none)."""
    sessions = nox_sessions()
    bad = []
    for line, inline in command_lines("nox -s ", text):
        argv = words(line)
        names = fnmatch.filter(sessions, argv[2]) if argv[1:2] == ["-s"] and argv[2:] else []
        if not names:
            bad.append(f"{line}: no such session")
        if len(names) != 1 or (runs := sessions[names[0]]) is None:
            continue  # a pattern (`build-*`) or a session that runs no llamaspec command
        args = argv[argv.index("--") + 1 :] if "--" in argv else []
        if said := complaint([*runs[0], *(args or runs[1])], inline and not args):
            bad.append(f"{line}: {said}")
    return bad


def pointed(doc, pointer: str):
    """The value at a JSON pointer (RFC 6901) in doc."""
    for key in pointer.split("/")[1:]:
        key = key.replace("~1", "/").replace("~0", "~")
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


def shown(value, figure: str, scale: str | None) -> str:
    """value written the way figure is: a number divided by scale and rounded half-up to
    figure's decimals; else text, which matches a figure with `…` for its middle."""
    if NUMBER.fullmatch(figure):
        unit = Decimal(1).scaleb(Decimal(figure.replace(",", "")).as_tuple().exponent)
        number = (Decimal(str(value)) / Decimal(scale or 1)).quantize(unit, ROUND_HALF_UP)
        # the reports' own Markdown rounds as Python formats floats (1.505 → 1.50)
        decimals = max(0, -unit.as_tuple().exponent)
        if figure.replace(",", "") == f"{float(value) / float(scale or 1):.{decimals}f}":
            return figure
        return f"{number:,}" if "," in figure else str(number)
    text = json.dumps(value) if isinstance(value, bool) or value is None else str(value)
    head, elided, tail = figure.partition("…")
    if elided and text.startswith(head) and text.endswith(tail):
        return figure
    return text


def fact_problems(text: str = README, root: Path = ROOT, page: str = "README.md") -> list[str]:
    """Fact markers in text's prose (see the module docstring) that disagree with their
    report or stand where their figure is not."""
    text = prose(text)
    bad, last = [], 0
    for m in MARKER.finditer(text):
        where = f"{page}:{text.count(chr(10), 0, m.start()) + 1}: {m['report']}#{m['pointer']}"
        paragraph, row = text.rfind("\n\n", 0, m.start()), text.rfind("\n", 0, m.start()) + 1
        start = max(last, paragraph + 2 if paragraph >= 0 else 0)
        before, last = text[max(start, row if text[row] == "|" else 0) : m.start()], m.end()
        figure = m["figure"]
        if not re.search(rf"(?<![\w.]){re.escape(figure)}(?!\w|\.\d)", before):
            bad.append(f"{where}: {figure} is not in the text just before the marker")
        if not m["report"].startswith("reports/"):
            bad.append(f"{where}: not a report in reports/")
            continue
        try:
            value = pointed(json.loads((root / m["report"]).read_text()), m["pointer"])
        except (OSError, ValueError, LookupError, TypeError) as e:
            bad.append(f"{where}: {e!r}")
            continue
        if (got := shown(value, figure, m["scale"])) != figure:
            bad.append(f"{where}: the page says {figure}, the report {got} ({value!r})")
    return bad


def each_page(check) -> list[str]:
    """check(text, page) over every page, its complaints prefixed with the page."""
    return [f"{page}: {said}" for page, text in PAGES.items() for said in check(text, page)]


def test_the_docs_are_the_pages_the_site_builds() -> None:
    assert len(PAGES) > 20 and "docs/guides/verify.md" in PAGES
    assert len(README.splitlines()) <= 250, "README is at most 250 lines: move the rest to docs/"
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert site["strict"] is True and set(site["validation"].values()) == {"warn"}


def test_every_repository_path_the_docs_name_exists() -> None:
    named = {page: named_paths(text, page) for page, text in PAGES.items()}
    paths = {p for found, _ in named.values() for p in found}
    skipped = {s for _, found in named.values() for s in found}
    assert len(paths) > 50, f"the docs name few repository paths: the pattern is wrong: {paths}"
    assert "docker/Dockerfile.cuda" in paths and "src/llamaspec/images/tools.py" in paths
    assert "docs/reports/tune-gemma3-270m-ngram-llamacpp-cpu-9036434bcbf5.md" in paths
    broken = each_page(lambda text, _: [s for s in spans(text) if re.search(r"/\n", s)])
    assert not broken, f"code spans broken after a / (GitHub shows a space there): {broken}"
    missing = each_page(lambda _, page: missing_paths(named[page][0]))
    assert not missing, f"the docs name paths that do not exist: {missing}"
    assert set(NOT_OURS) <= skipped, "NOT_OURS lists a name the docs no longer have"


def test_every_llamaspec_line_parses_with_the_real_parser() -> None:
    assert sum(len(command_lines("llamaspec ", t)) for t in PAGES.values()) > 40
    assert len(command_lines("llamaspec ")) > 10, "README shows few llamaspec lines"
    bad = each_page(lambda text, _: llamaspec_problems(text))
    assert not bad, "lines the CLI does not accept:\n" + "\n".join(bad)


def test_every_nox_line_names_a_session_and_its_arguments_parse() -> None:
    sessions = nox_sessions()
    assert sessions["build-cuda"] == (["build", "--backend", "cuda"], [])
    assert sessions["models"] == (["models"], ["list"]) and sessions["tests"] is None
    assert sessions["docs"] is None
    assert sum(len(command_lines("nox -s ", t)) for t in PAGES.values()) > 40
    bad = each_page(lambda text, _: nox_problems(text))
    assert not bad, "nox lines that would not run:\n" + "\n".join(bad)


def test_every_yaml_block_parses() -> None:
    texts = [(page, b) for page, text in PAGES.items() for b in blocks("ya?ml", text)]
    assert len(texts) >= 2
    bad = []
    for page, text in texts:
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as e:
            bad.append(f"{page}: {text.splitlines()[0]}…: {e}")
    assert not bad, "YAML blocks that do not parse:\n" + "\n".join(bad)


def test_every_figure_marked_as_from_a_report_equals_the_report() -> None:
    markers = sum(len(MARKER.findall(prose(t))) for t in PAGES.values())
    assert markers >= 30, "the docs' fact markers are gone: the pattern?"
    bad = each_page(lambda text, page: fact_problems(text, ROOT, page))
    assert not bad, "figures that are not their report's:\n" + "\n".join(bad)


def test_the_checks_find_what_they_are_for(tmp_path: Path) -> None:
    """Each check fails on a page that gets its facts wrong."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/r.json").write_text(json.dumps({"a": {"b/c": [1234.56]}, "h": "abc0123"}))
    right = (
        "took 1,235 s<!-- fact: reports/r.json#/a/b~1c/0 = 1,235 --> or 20.6 min"
        "<!-- fact: reports/r.json#/a/b~1c/0 / 60 = 20.6 -->; `abc…123`"
        "<!-- fact: reports/r.json#/h = abc…123 -->\n"
    )
    assert fact_problems(right, tmp_path) == []
    for wrong in (
        "took 1,234 s<!-- fact: reports/r.json#/a/b~1c/0 = 1,234 -->",
        "took a while<!-- fact: reports/r.json#/a/b~1c/0 = 1,235 -->",
        "took 1,235 s\n\nand so<!-- fact: reports/r.json#/a/b~1c/0 = 1,235 -->",
        "took 5 s<!-- fact: reports/r.json#/a/x = 5 -->",
        "`abd…123`<!-- fact: reports/r.json#/h = abd…123 -->",
    ):
        assert len(fact_problems(wrong, tmp_path)) == 1, wrong
    text = (
        "See `docs/nowhere.md`, [this](reports/none.md), `llamaspec/{paths,nope}.py`.\n"
        "```console\n$ llamaspec build --no-such-flag\n$ nox -s no-such-session\n"
        "$ nox -s bench -- --no-such-flag\n```\n`llamaspec bnech` and `nox -s build-*`\n"
    )
    assert missing_paths(named_paths(text)[0]) == [
        "docs/nowhere.md",
        "reports/none.md",
        "src/llamaspec/nope.py",
    ]
    assert len(llamaspec_problems(text)) == 2 and len(nox_problems(text)) == 2
    page_text = "[up](../reports/none.md), [same](cli.md), [there](../guides/verify.md#x)\n"
    assert missing_paths(named_paths(page_text, "docs/reference/p.md")[0]) == [
        "docs/reports/none.md"
    ]
