"""The runtime half of the generated sweep (issue 54): every option or argument of every
command that takes a path, walked from the parser tree, is given paths no command can use,
by kind, on a command line that is otherwise good, in the hand-written sweep's world
(tests/unit/test_bad_input_sweep.py: a fake artifact, no network, no process but probes).
Each must be refused in one paragraph that names the path, with a non-zero exit, no
traceback, within the sweep's time limit, and nothing written in the world or the checkout.

The kinds, for every path: one below a plain file (`afile/sub`: it can be neither read nor
created) and ones under /sys and /proc (kernel filesystems where llamaspec keeps nothing).
A folder (a type of FOLDERS) is also given a plain file; a file (FILES) an empty
folder; a path that must exist, one that does not. A new option is covered when it is
declared; a new positional or required option needs a good value in BASE (the test that
walks the tree says which).

Not swept here: read-only folders (the suite runs as root, whom a mode does not stop: the
hand-written sweep covers a read-only mount); relative paths that leave the working
directory, which name a place like any other.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from test_bad_input_sweep import (  # the hand-written sweep's world, guard and verdict
    ARTIFACT,
    WouldStart,
    _parser,
    answer,
    error_paragraph,
    models_cache,  # noqa: F401 (a fixture)
    problems_of,
)

pytestmark = pytest.mark.unit

# a good value for each positional and required option, by destination
BASE = {
    "recipe": "gemma3-270m-ngram",
    "pair": "gemma3-270m-f32-q4draft",
    "target": "gemma3-270m",
    "image": "127.0.0.1:5000/llamaspec:cpu",
    "hosts": "127.0.0.1:50052",
    "native": ARTIFACT,
    "stock": ARTIFACT,
    "engine": "llama.cpp",
    "out": "{tmp}/out",
    "record": "{tmp}/record.json",
}
BASE_BY_COMMAND = {("patches", "import"): {"dir": "{tmp}/empty"}, ("patches", "export"): {}}
FOLDERS = {"out_dir", "existing_dir", "some_dir", "_some_dir", "_import_dir", "folder"}
FOLDERS |= {"patch_source_form", "_mirror", "MirrorAction"}  # DIR|URL, ENGINE=DIR: a folder
FILES = {"out_file", "existing_file", "some_file"}
MUST_EXIST = {"existing_file", "existing_dir", "_import_dir"}
MUST_EXIST |= {"patch_source_form", "_mirror", "MirrorAction"}
PREFIX = {"_mirror": "llama.cpp="}  # a value's form before the path
EVERY_PATH = ("{tmp}/afile/sub", "/sys/llamaspec-sweep/x", "/proc/llamaspec-sweep")


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [c for s in subs for n, sp in s.choices.items() for c in _commands(sp, (*path, n))]


def _type_name(action: argparse.Action) -> str:
    """The option's type (or, for an action that checks its own values, its class)."""
    if action.type:
        return getattr(action.type, "__name__", "")
    return type(action).__name__


def _is_path(action: argparse.Action) -> bool:
    return _type_name(action) in FOLDERS | FILES


def values(action: argparse.Action) -> list[tuple[str, str, str]]:
    """(kind, argument, the path in it) for a path option: what no command can use there."""
    name = _type_name(action)
    out = [("below a file", EVERY_PATH[0]), ("under /sys", EVERY_PATH[1])]
    out.append(("under /proc", EVERY_PATH[2]))
    if name in FOLDERS:
        out.append(("a file for a folder", "{tmp}/afile"))
    else:
        out.append(("a folder for a file", "{tmp}/empty"))
    if name in MUST_EXIST:
        out.append(("missing", "{tmp}/missing"))
    return [(kind, PREFIX.get(name, "") + value, value) for kind, value in out]


def _argv(path: tuple[str, ...], parser: argparse.ArgumentParser, swept, value: str):
    """The command's argv with a good value for every positional and required option, and
    `value` for the `swept` one."""
    given = {**BASE, **BASE_BY_COMMAND.get(path, {"dir": "{tmp}/out"})}
    argv, tail = list(path), []
    for a in parser._actions:
        if a is swept:
            (tail if a.option_strings else argv).extend([*a.option_strings[-1:], value])
        elif isinstance(a, argparse._HelpAction):
            continue
        elif a.option_strings and a.required:
            argv += [a.option_strings[0], given[a.dest]]
        elif not a.option_strings and a.nargs not in ("?", "*"):
            argv.append(given[a.dest])
    return argv + tail


def _cases() -> list[tuple[str, list[str], str]]:
    cases = []
    for path, parser in _commands(_parser()):
        for a in parser._actions:
            if _is_path(a):
                name = f"{' '.join(path)} {(a.option_strings or [a.dest])[-1]}"
                for kind, value, named in values(a):
                    cases.append((f"{name} {kind}", _argv(path, parser, a, value), named))
    return cases


CASES = _cases()


def test_no_option_takes_a_path_of_no_kind() -> None:
    """A path option says which kind it is (cli/shared.py: out_dir, some_file, ...), so the
    check runs when the command line is read and the sweep knows what to try."""
    raw = [
        f"{' '.join(path)} {(a.option_strings or [a.dest])[-1]}"
        for path, parser in _commands(_parser())
        for a in parser._actions
        if a.type in (Path, str)
        or (not _is_path(a) and a.type is None and re.search(r"DIR|FILE", str(a.metavar)))
    ]
    assert not raw, f"path options with no kind: {raw}"


def test_the_sweep_reaches_every_path_option() -> None:
    options = [a for _, parser in _commands(_parser()) for a in parser._actions if _is_path(a)]
    assert len(options) >= 76 and len(CASES) >= 4 * len(options), (len(options), len(CASES))


@pytest.mark.parametrize(("argv", "value"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_path_no_command_can_use_is_refused_naming_it(
    argv: list[str],
    value: str,
    tmp_path: Path,
    monkeypatch,
    capsys,
    models_cache,  # noqa: F811
) -> None:
    entry = {"argv": argv, "expect": [value], "why": "generated"}
    a = answer(entry, tmp_path, monkeypatch, capsys, models_cache)
    problems = problems_of(entry, a)
    assert not problems, "; ".join(problems) + f"\n--- stderr:\n{a.err[-1200:]}"


# --- text that reaches generated files and commands ----------------------------------------

# quotes, braces, a comment sign, shell and YAML punctuation: fine as names go, or refused, but
# never a traceback, a hang, or a write outside the world
TEXTS = ('a"b', "a'b", "{x}", "a}b", "#x", "a: b", "$(x)", "-x")


def _is_text(action: argparse.Action) -> bool:
    free = action.type is None or _type_name(action) in ("non_empty", "str")
    return free and not action.choices and action.nargs != 0 and not _is_path(action)


def _text_cases() -> list[tuple[str, list[str]]]:
    cases = []
    for path, parser in _commands(_parser()):
        for a in parser._actions:
            if _is_text(a) and not isinstance(a, argparse._HelpAction):
                name = f"{' '.join(path)} {(a.option_strings or [a.dest])[-1]}"
                for text in TEXTS:
                    cases.append((f"{name} {text}", _argv(path, parser, a, text)))
    return cases


TEXT_CASES = _text_cases()


@pytest.mark.parametrize("argv", [c[1] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_punctuation_in_text_is_taken_or_refused_never_a_traceback(
    argv: list[str],
    tmp_path: Path,
    monkeypatch,
    capsys,
    models_cache,  # noqa: F811
) -> None:
    entry = {"argv": argv, "expect": [], "why": "generated"}
    a = answer(entry, tmp_path, monkeypatch, capsys, models_cache)
    status, out, err = a.status, a.out, a.err
    assert not a.checkout, f"the checkout was written: {a.checkout} (restored)"
    assert not isinstance(status, BaseException) or isinstance(status, WouldStart), (
        f"{type(status).__name__}: {status}\n{err[-1200:]}"
    )
    assert "Traceback" not in out + err, err[-1200:]
    if status not in (0, None) and not isinstance(status, WouldStart):
        said = error_paragraph(err)
        assert said and "\n\n" not in said, err[-1200:]
