"""The bad-input sweep generated from the command tree and the environment table (issue 54):
every option of every command, the new ones included without a list, refuses a value with
a control character (a direction override included) or of 10,000 characters, and every
typed option a number that is not finite or beyond a 32-bit integer, in one paragraph
(exit 2) before any work, writing nothing. Every `LLAMASPEC_*` variable llamaspec reads,
set to garbage of its kind (env.KINDS), is refused the same way by any command.
Paths, the values checked against the machine, are swept in test_generated_paths.py."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaspec.cli import hostile
from llamaspec.cli.main import make_parser, parse

pytestmark = pytest.mark.unit

NUMBERS = ("nan", "inf", "-inf", "1e400", "99999999999999999999", "-99999999999999999999")
CONTROL = ("a\nb", "a\rb", "a\x1bb", "a\u202eb")


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


def _fill(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each positional and each required option of the command (a hostile
    value given after it wins)."""
    out: list[str] = []
    for a in parser._actions:
        value = str(a.choices[0]) if a.choices else "x"
        if a.option_strings:
            out += [a.option_strings[0], value] if a.required else []
        elif not isinstance(a, argparse._SubParsersAction) and a.nargs not in ("?", "*"):
            out.append(value)
    return out


def _options() -> list[tuple[tuple[str, ...], list[str], argparse.Action]]:
    found = []
    for path, parser in _commands(make_parser()):
        for a in parser._actions:
            if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction):
                found.append((path, _fill(parser), a))
    return found


OPTIONS = _options()


def _hostile_numbers(action: argparse.Action) -> list[str]:
    """The values of NUMBERS that the option's own type lets through as such a number."""
    out = []
    for text in NUMBERS:
        try:
            value = action.type(text) if action.type else text
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
        values = value if isinstance(value, (list, tuple)) else (value,)
        if any(hostile._unlike_any(v) for v in values):
            out.append(text)
    return out


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, (argv, err)
    assert "Traceback" not in err
    return " ".join(err.split())


def test_the_tree_has_the_commands_and_options_it_had() -> None:
    commands = {p for p, _, _ in OPTIONS}
    assert len(commands) >= 36 and len(OPTIONS) >= 250, (len(commands), len(OPTIONS))


@pytest.mark.parametrize(
    ("path", "fill", "action"),
    OPTIONS,
    ids=[f"{' '.join(p)} {a.option_strings[-1]}" for p, _, a in OPTIONS],
)
def test_every_option_refuses_hostile_values_in_one_paragraph_writing_nothing(
    path, fill, action, capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    flag = action.option_strings[-1]
    for text in CONTROL:
        said = _refused([*path, *fill, f"{flag}={text}"], capsys)
        assert "holds a control character" in said, said
    said = _refused([*path, *fill, f"{flag}={'x' * 10_000}"], capsys)
    assert "characters, more than the 4,096" in said, said
    for text in _hostile_numbers(action):
        said = _refused([*path, *fill, f"{flag}={text}"], capsys)
        assert flag in said or action.option_strings[0] in said, said
        assert "finite" in said or "beyond" in said, said
    assert not any(tmp_path.iterdir())


def test_no_options_default_is_a_value_the_check_refuses() -> None:
    for _, _, action in OPTIONS:
        d = action.default
        assert not any(
            hostile._unlike_any(v) for v in (d if isinstance(d, (list, tuple)) else (d,))
        )


def test_the_entry_point_refuses_before_any_work(capsys, tmp_path, monkeypatch) -> None:
    from llamaspec.cli.main import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["load", "gemma3-270m-ngram", "--duration", "nan"])
    assert (
        exc.value.code == 2 and "--duration nan is not a finite number" in capsys.readouterr().err
    )
    assert not any(tmp_path.iterdir())


# --- every LLAMASPEC_* variable, set to garbage of its kind --------------------------------------

from llamaspec import env  # noqa: E402

EVERYWHERE = ("a\nb", "a\u202eb", "x" * 10_000)  # no variable takes these
GARBAGE = {
    "text": (),
    "seconds": ("abc", "nan", "-1", "0", "1e999", " 5"),
    "writable-dir": ("{tmp}/afile", "{tmp}/afile/sub", "/sys/llamaspec-sweep", "/proc/x"),
    "dir": ("{tmp}/missing", "{tmp}/afile", "/proc/llamaspec-sweep"),
    "file": ("{tmp}/missing", "{tmp}/empty", "/sys/llamaspec-sweep"),
    "url": ("not a url", "ftp://host/x", "http://", "http://a b/"),
    "choice": ("maybe", "o ff"),
    "pattern": ("Not A Name!", "a b"),
    "port": ("abc", "0", "-1", "70000", " 8080", "99999999999999999999"),
    "count": ("abc", "-1", "1.5", "9999999999"),
}
FINE = {  # one value each kind takes (a pattern's comes from its form's example)
    "text": "1",
    "seconds": "2.5",
    "writable-dir": "{tmp}/new/dir",
    "dir": "{tmp}/empty",
    "file": "{tmp}/afile",
    "url": "http://127.0.0.1:9/simple",
    "port": "8080",
    "count": "64",
}
READ = [v for v in env.VARIABLES if v.read_by == env.LLAMASPEC]
CASES = [(v, text) for v in READ for text in (*GARBAGE[v.kind], *EVERYWHERE)]


def _fine(var: env.EnvVar) -> str:
    if var.kind == "choice":
        return var.choices[0]
    if var.kind == "pattern":
        return var.form.rsplit("(", 1)[1].rstrip(")")
    return FINE[var.kind]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a plain file and an empty folder, and every user dir in it;
    every LLAMASPEC_ variable unset."""
    for name in list(__import__("os").environ):
        if name.startswith("LLAMASPEC_"):
            monkeypatch.delenv(name)
    (tmp_path / "afile").write_text("a plain file\n")
    (tmp_path / "empty").mkdir()
    for var, sub in ((env.CACHE, "cache"), (env.DATA, "data"), (env.CONFIG_DIR, "config")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var.name, str(tmp_path / sub))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_variable_has_a_kind_the_sweep_knows() -> None:
    assert {v.kind for v in env.VARIABLES} <= set(GARBAGE) == set(env.KINDS)
    assert len(CASES) >= 60, len(CASES)


@pytest.mark.parametrize(("var", "text"), CASES, ids=[f"{v.name}={t[:20]!r}" for v, t in CASES])
def test_every_variable_set_to_garbage_is_refused_before_any_work(
    var: env.EnvVar, text: str, world: Path, monkeypatch, capsys
) -> None:
    from llamaspec.cli.main import main

    value = text.replace("{tmp}", str(world))
    monkeypatch.setenv(var.name, value)
    before = sorted(p.relative_to(world) for p in world.rglob("*"))
    status = main(["recipe", "list"])
    err = capsys.readouterr().err
    said = " ".join(err.split())
    assert status == 2 and "Traceback" not in err, (status, err[-800:])
    assert said.startswith("error: The environment variable " + var.name), said[:300]
    assert "\n\n" not in err.strip() and "unset" in said, said[:300]
    assert sorted(p.relative_to(world) for p in world.rglob("*")) == before


@pytest.mark.parametrize("var", READ, ids=[v.name for v in READ])
def test_every_variable_takes_a_value_of_its_kind(var: env.EnvVar, world: Path, monkeypatch):
    monkeypatch.setenv(var.name, _fine(var).replace("{tmp}", str(world)))
    env.check()
    assert not (world / "new").exists()  # checking a directory does not create it


# --- the image's own variables: docker/entrypoint.sh refuses the same garbage --------------

ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh"
IN_IMAGE = [v for v in env.VARIABLES if v.read_by == env.IMAGE] + [env.SPEC_GATE]
# a direction override is no control character to the shell: the image's check is bytes
IMAGE_CASES = [(v, t) for v in IN_IMAGE for t in (*GARBAGE[v.kind], "a\nb", "x" * 10_000)]


def _start(tmp_path: Path, name: str, value: str):
    """docker/entrypoint.sh with a stand-in llama-server that only says it started."""
    import subprocess

    server = tmp_path / "root" / "bin" / "llama-server"
    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text("#!/bin/sh\necho started\n")
    server.chmod(0o755)
    base = {"PATH": "/usr/bin:/bin", "LLAMASPEC_ROOT": str(tmp_path / "root")}
    base |= {
        "LLAMASPEC_PORT_FILE": str(tmp_path / "port"),
        "LLAMASPEC_GATE_FILE": str(tmp_path / "g"),
    }
    return subprocess.run(
        ["sh", str(ENTRYPOINT)], env={**base, name: value}, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("var", "text"), IMAGE_CASES, ids=[f"{v.name}={t[:20]!r}" for v, t in IMAGE_CASES]
)
def test_the_image_refuses_its_variables_set_to_garbage_before_the_server_starts(
    var: env.EnvVar, text: str, tmp_path: Path
) -> None:
    assert env._unlike(var, text), "the table's kind takes what the image refuses"
    proc = _start(tmp_path, var.name, text)
    assert proc.returncode == 2 and "started" not in proc.stdout, (proc.stdout, proc.stderr)
    said = " ".join(proc.stderr.split())
    assert said.startswith(f"llamaspec: {var.name} is ") and "leave it unset" in said, said


@pytest.mark.parametrize("var", IN_IMAGE, ids=[v.name for v in IN_IMAGE])
def test_the_image_starts_with_a_value_of_each_kind(var: env.EnvVar, tmp_path: Path) -> None:
    value = _fine(var).replace("{tmp}", str(tmp_path))
    assert env._unlike(var, value) is None
    proc = _start(tmp_path, var.name, value)
    assert proc.returncode == 0 and "started" in proc.stdout, proc.stderr
