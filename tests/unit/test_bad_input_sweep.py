"""The bad-input sweep: every input in tests/unit/data/bad_inputs.yaml, run through the real
`llamaspec` entry point in this process, must be refused the way the docs promise
(docs/reference/errors.md): a non-zero exit, no traceback, one paragraph that names the bad
value, and nothing written, started or downloaded on the way.

Each input runs in a fresh world under tmp_path, which is also the working directory (so
`dist/` and `reports/` are there): the llamaspec cache, data and config dirs, HOME, the XDG
dirs and the Hugging Face cache all point into it; `{tmp}/dist` holds a fake rpc artifact of
the default llama.cpp pin; `{tmp}/afile` is a plain file and `{tmp}/empty` an empty
directory. The embedded model is assembled once and linked into every world's cache, and one
parser serves every input: both cost more than a refusal. There is no network (names do not
resolve, only loopback connects, the hub is a closed local port, HF_HUB_OFFLINE is set), no
child process but probes (`--help`, `--version`, git on a local tree) and no exec: a bad
input must be refused before any of that. An input that would start real work fails its
test with what it would have run; one that takes LIMIT_S fails with where it was busy.

`python tests/unit/test_bad_input_sweep.py` rewrites the summary table in
docs/reference/errors.md from the data file; a test keeps the two equal.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "bad_inputs.yaml"
DOC = ROOT / "docs" / "reference" / "errors.md"
TABLE_START = "<!-- bad-input table: generated from tests/unit/data/bad_inputs.yaml -->"
TABLE_END = "<!-- end of the bad-input table -->"
# per input: a refusal takes well under a second; this much is work that should not have
# started (or a hang), and the input fails with where it was busy
LIMIT_S = 15
ARTIFACT = "llamacpp-cpu-0123456789ab"  # the fake rpc artifact in {tmp}/dist
KEYS = {"id", "argv", "expect", "match", "env", "files", "modes", "why", "named"}
# Environment that could reach outside the world, cleared for every input.
CLEARED = ("LLAMASPEC_", "HF_", "XDG_", "HUGGINGFACE_", "REGISTRY_AUTH_FILE", "DOCKER_")
# Child processes a refusal may run: version and help probes, and git reading a local tree.
PROBE_ARGS = {"--version", "-version", "version", "--help", "-h", "-dumpversion"}
PROBE_ARGS |= {"--list-gpu-arch", "--list-devices", "--dryrun", "info"}
PROBE_TOOLS = {"nvidia-smi", "uname", "getconf", "lscpu", "ldconfig", "pkg-config", "id"}
GIT_NETWORK = {"clone", "fetch", "ls-remote", "pull", "push", "submodule"}


def entries() -> list[dict[str, Any]]:
    """The data file's inputs, each checked for its shape."""
    data = yaml.safe_load(DATA.read_text())
    for e in data:
        assert set(e) <= KEYS and {"id", "argv", "why"} <= set(e), e
        assert e.get("expect") or e.get("match"), f"{e['id']}: say what the error must name"
        assert all(isinstance(a, str) for a in e["argv"]), e["id"]
    return data


ENTRIES = entries()
MAKE_PARSER = importlib.import_module("llamaspec.cli.main").make_parser


class WouldStart(BaseException):
    """A bad input got as far as starting a process, exec'ing or a network connection."""


class Hung(BaseException):
    """A bad input was not refused within LIMIT_S."""


def _on_alarm(signum: int, frame: Any) -> None:
    import traceback

    where = " < ".join(
        f"{f.name} ({Path(f.filename).name}:{f.lineno})"
        for f in reversed(traceback.extract_stack(frame)[-3:])
    )
    raise Hung(f"no answer within {LIMIT_S:g} s (busy in {where})")


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


@pytest.fixture(scope="module")
def models_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """The embedded model, assembled once (as a user who ran llamaspec before has it): every
    world's cache/models links here, so an input that gets as far as the model costs no
    250 MB copy. None when the embedded model's package is not installed."""
    from llamaspec.errors import LlamaspecError
    from llamaspec.models.embedded import embedded_model

    cache = tmp_path_factory.mktemp("sweep-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMASPEC_CACHE", str(cache))
        try:
            models: Path | None = embedded_model().parent
        except LlamaspecError:
            models = None
    yield models
    shutil.rmtree(cache, ignore_errors=True)


def _world(
    tmp: Path, entry: dict[str, Any], monkeypatch: pytest.MonkeyPatch, models: Path | None
) -> None:
    """The per-input world under tmp: dirs, the fake artifact, the entry's files and env."""
    for d in ("cache", "data", "config", "home", "hf", "empty", "xdg/cache", "xdg/data"):
        (tmp / d).mkdir(parents=True)
    (tmp / "xdg/config").mkdir()
    if models is not None:
        (tmp / "cache" / "models").symlink_to(models, target_is_directory=True)
    (tmp / "afile").write_text("a plain file, not a directory\n")
    art = tmp / "dist" / ARTIFACT
    (art / "bin").mkdir(parents=True)
    (art / "lib").mkdir()
    pin = default_pin()
    manifest = (
        '{"id": "%s", "engine": "llama.cpp", "commit": "%s", "backend": "cpu", '
        '"variants": ["rpc"], "patches": [], "defines": {}}\n'
    )
    (art / "manifest.json").write_text(manifest % (ARTIFACT, pin))
    help_file = tmp / "server-help.txt"
    help_file.write_text(server_help())
    for name in ("llama-server", "rpc-server"):
        # a CPU build: `--list-devices` lists no device beside the CPU, anything else is help
        (art / "bin" / name).write_text(
            '#!/bin/sh\nif [ "$1" = --list-devices ]; then echo "Available devices:"; exit 0; fi\n'
            f"cat '{help_file}'\n"
        )
        (art / "bin" / name).chmod(0o755)
    for name, content in (entry.get("files") or {}).items():
        path = tmp / _fill(name, tmp)
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir(exist_ok=True)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(_fill(content, tmp))
    for name, mode in (entry.get("modes") or {}).items():
        (tmp / _fill(name, tmp)).chmod(mode)

    for key in list(os.environ):
        if key.startswith(CLEARED):
            monkeypatch.delenv(key)
    with socket.socket() as s:  # a port nothing listens on: the hub and PyPI are "down"
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {
        "LLAMASPEC_CACHE": tmp / "cache",
        "LLAMASPEC_DATA": tmp / "data",
        "LLAMASPEC_CONFIG_DIR": tmp / "config",
        "HOME": tmp / "home",
        "XDG_CACHE_HOME": tmp / "xdg/cache",
        "XDG_DATA_HOME": tmp / "xdg/data",
        "XDG_CONFIG_HOME": tmp / "xdg/config",
        "HF_HOME": tmp / "hf",
        "HF_HUB_CACHE": tmp / "hf/hub",
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": closed,
        "LLAMASPEC_PYPI_URL": closed,
        "LLAMASPEC_SOURCE_URL": closed,
        "COLUMNS": "200",
    }
    for key, value in {**env, **(entry.get("env") or {})}.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, _fill(str(value), tmp))
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # read at import time: an earlier test may have imported it
        monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(hub, "ENDPOINT", closed)
    monkeypatch.chdir(tmp)


@functools.cache
def default_pin() -> str:
    from llamaspec import config

    return config.load_engines(ROOT)["llama.cpp"].pin


@functools.cache
def server_help() -> str:
    """A --help that lists every flag llamaspec's sources spell (so a rendered command passes
    the help check and gets as far as starting the server, where the guard stops it)."""
    from llamaspec import config

    flags: set[str] = set()
    for path in (ROOT / "src" / "llamaspec").rglob("*.py"):
        flags |= set(re.findall(r"[\"'](--?[a-z][a-z0-9-]*)[\"' =]", path.read_text()))
    lines = ["usage: llama-server [options]", ""]
    lines += [f"{f:<40} N    an option" for f in sorted(flags - {"--spec-type"})]
    lines.append(f"{'--spec-type':<40} {','.join(['none', *config.SPEC_TYPES])}")
    return "\n".join(lines) + "\n"


def _is_probe(argv: list[str]) -> bool:
    if not argv:
        return False
    tool = os.path.basename(argv[0])
    if tool == "git":
        return not set(argv[1:]) & GIT_NETWORK
    if argv[1:] == ["-cpu", "help"]:  # qemu's CPU model list
        return True
    return tool in PROBE_TOOLS or bool(PROBE_ARGS & set(argv[1:]))


def _guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """No process but probes, no exec, no fork, no connection beyond loopback, no DNS."""
    popen_init = subprocess.Popen.__init__

    def popen(self, args, *a, **kw):
        argv = [os.fspath(x) for x in ([args] if isinstance(args, (str, bytes)) else args)]
        if kw.get("shell") or not _is_probe([str(x) for x in argv]):
            raise WouldStart(f"would run `{' '.join(map(str, argv))}`")
        return popen_init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)

    def refuse(name: str):
        def call(*args, **kwargs):
            shown = args[1] if len(args) > 1 and name.startswith("exec") else args
            raise WouldStart(f"would {name} `{' '.join(map(str, shown))}`")

        return call

    for name in ("execv", "execve", "execvp", "execvpe", "execl", "execlp", "system", "fork"):
        monkeypatch.setattr(os, name, refuse(name))
    for name in ("posix_spawn", "posix_spawnp", "spawnv", "spawnvp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(name))

    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        text = host.decode() if isinstance(host, bytes) else str(host or "")
        local = text in ("", "localhost") or re.fullmatch(
            r"[\d.]+|[0-9a-fA-F:]*:[0-9a-fA-F:.]*", text
        )
        if not local:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known (no network)")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = str(address[0])
            if not (host.startswith("127.") or host in ("::1", "localhost")):
                raise OSError(101, f"Network is unreachable (no network: {host})")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


# --- what must hold afterwards -----------------------------------------------------------------

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".nox", ".venv", "site"}


def tree(root: Path) -> dict[str, tuple]:
    """Every file and directory under root (symlinks not followed), with what would show a
    write: a directory's entries, a file's size, mtime and mode."""
    out: dict[str, tuple] = {}
    stack = [("", str(root))]
    while stack:
        rel, here = stack.pop()
        try:
            listed = list(os.scandir(here))
        except OSError:
            continue
        for item in listed:
            name = f"{rel}{item.name}"
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if item.is_dir(follow_symlinks=False):
                out[name] = ("d",)
                if item.name not in SKIP_DIRS:
                    stack.append((f"{name}/", item.path))
            else:
                out[name] = ("f", st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    new = [f"+{p}" for p in after if p not in before]
    gone = [f"-{p}" for p in before if p not in after]
    changed = [f"~{p}" for p in after if p in before and after[p] != before[p]]
    return sorted(new + gone + changed)


@functools.cache
def _tracked() -> dict[str, bytes]:
    """The checkout files a command could damage (the lock, the catalogs), as they were."""
    names = ("llamaspec.lock", "engines.yaml", "models.yaml", "patches/series.yaml")
    return {n: (ROOT / n).read_bytes() for n in names if (ROOT / n).is_file()}


def _restore_checkout(before: dict[str, tuple], after: dict[str, tuple]) -> None:
    """Undo what an input wrote into the checkout (the test fails either way)."""
    for name, content in _tracked().items():
        if (ROOT / name).read_bytes() != content:
            (ROOT / name).write_bytes(content)
    for p in sorted((p for p in after if p not in before), reverse=True):
        path = ROOT / p
        with contextlib.suppress(OSError):
            path.rmdir() if after[p][0] == "d" else path.unlink()


def error_paragraph(err: str) -> str | None:
    """The error the user sees: from argparse's or llamaspec's `error:` to the end."""
    m = re.search(r"(?m)^(?:\S.*?: )?error: ", err)
    return err[m.start() :].strip() if m else None


@functools.cache
def _parser():
    return MAKE_PARSER()


def run(entry: dict[str, Any], tmp: Path, monkeypatch, capsys) -> tuple[Any, str, str]:
    """main(argv) for the entry: its exit status (or what escaped), stdout, stderr."""
    cli_main = importlib.import_module("llamaspec.cli.main")

    # one parser for every input: building it takes longer than most refusals, and its
    # defaults (dist/, reports/) are relative to the working directory, not fixed paths
    monkeypatch.setattr(cli_main, "make_parser", _parser)
    argv = [_fill(a, tmp) for a in entry["argv"]]
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        with monkeypatch.context() as guarded:
            _guard(guarded)
            try:
                status: Any = cli_main.main(argv)
            except SystemExit as exit_:
                status = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException as exc:
                status = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for s, h in handlers.items():
            signal.signal(s, h)
    out, err = capsys.readouterr()
    return status, out, err


class Answer(NamedTuple):
    """How an input was answered in its world, and what it wrote there and in the checkout."""

    world: Path
    status: Any
    out: str
    err: str
    checkout: list[str]  # what it changed in the checkout (restored since)
    written: list[str]  # what it changed in its world


def answer(
    entry: dict[str, Any], tmp_path: Path, monkeypatch, capsys, models: Path | None
) -> Answer:
    """`entry` run in a fresh world under tmp_path (the generated sweeps use it too)."""
    world = tmp_path / "w"
    world.mkdir()
    _world(world, entry, monkeypatch, models)
    before, checkout = tree(world), tree(ROOT)
    status, out, err = run(entry, world, monkeypatch, capsys)
    after, checkout_after = tree(world), tree(ROOT)
    damage = changes(checkout, checkout_after)
    if damage:
        _restore_checkout(checkout, checkout_after)
    return Answer(world, status, out, err, damage, changes(before, after))


def problems_of(entry: dict[str, Any], a: Answer) -> list[str]:
    """`verdict`, and any write in the checkout or the world."""
    problems = verdict(entry, a.world, a.status, a.out, a.err)
    if a.checkout:
        problems.append(f"the checkout was written: {a.checkout} (restored)")
    if a.written:
        problems.append(f"written under the temp dir: {a.written}")
    return problems


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_bad_input_is_refused_in_one_paragraph_and_writes_nothing(
    entry: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    models_cache: Path | None,
) -> None:
    a = answer(entry, tmp_path, monkeypatch, capsys, models_cache)
    shown = f"\n--- stdout:\n{a.out[-1500:]}\n--- stderr:\n{a.err[-1500:]}"
    problems = problems_of(entry, a)
    assert not problems, "; ".join(problems) + shown


def verdict(entry: dict[str, Any], world: Path, status: Any, out: str, err: str) -> list[str]:
    """What is wrong with how the input was answered (nothing: a clear refusal)."""
    if isinstance(status, WouldStart | Hung):
        return [f"not refused: {status}"]
    if isinstance(status, BaseException):
        return [f"traceback: {type(status).__name__}: {status}"]
    if status == 0:
        return ["exit 0: the input was accepted"]
    if "Traceback" in out + err:
        return ["a traceback was printed"]
    said = error_paragraph(err)
    if not said:
        return [f"exit {status} without an `error:` paragraph"]
    problems = ["the error is more than one paragraph"] if "\n\n" in said else []
    flat = " ".join(said.split())
    expect = entry.get("expect") or []
    for fragment in [expect] if isinstance(expect, str) else expect:
        want = " ".join(_fill(fragment, world).split())
        if want not in flat:
            problems.append(f"the error does not name {want!r}: {flat}")
    if entry.get("match") and not re.search(_fill(entry["match"], world), flat):
        problems.append(f"the error does not match /{entry['match']}/: {flat}")
    return problems


def test_the_sweep_covers_every_command_and_the_inputs_issue_42_names() -> None:
    ids = [e["id"] for e in ENTRIES]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    assert len(ENTRIES) >= 160
    swept = {command_of(e["argv"]) for e in ENTRIES}
    missing = sorted(set(all_commands()) - swept)
    assert not missing, f"commands with no bad input in {DATA.name}: {missing}"
    assert sum(1 for e in ENTRIES if e.get("named")) >= 30


# --- the docs' table -----------------------------------------------------------------------------


def all_commands() -> list[str]:
    """Every runnable command path: `build`, `rpc serve`, `docker pull`, …"""
    import argparse

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> list[str]:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [" ".join(path)]
        return [c for name, sp in subs[0].choices.items() for c in walk(sp, (*path, name))]

    return walk(_parser(), ())


def command_of(argv: list[str]) -> str:
    """The command an argv runs (`maint X` as X); the bare program for none."""
    import argparse

    words, p = list(argv[1:] if argv[:1] == ["maint"] and len(argv) > 1 else argv), _parser()
    path: list[str] = []
    while True:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not words or words[0] not in subs[0].choices:
            return " ".join(path) or "(none)"
        p = subs[0].choices[words[0]]
        path.append(words.pop(0))


def shown_input(entry: dict[str, Any], command: str) -> str:
    """The input as the table shows it: the environment, the argv after the command, and
    the files it sets up."""
    rest = entry["argv"] if command == "(none)" else entry["argv"][len(command.split()) :]
    if entry["argv"][:1] == ["maint"] and command != "(none)":
        rest = rest[1:]
    parts = [
        f"{k}={_quote(v or '')}" if v is not None else f"{k} unset"
        for k, v in (entry.get("env") or {}).items()
    ]
    parts += [_quote(a) for a in rest]
    if entry.get("files"):
        parts.append("with " + ", ".join(entry["files"]))
    return (" ".join(parts) or "(no arguments)").replace("|", "\\|")


def _quote(word: str) -> str:
    return word if word and re.fullmatch(r"[\w@%+=:,./{}\-\[\]*]+", word) else repr(word)


def table(per_command: int = 3) -> str:
    """The summary: per command, how many inputs, and a few (issue 42's first)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for e in ENTRIES:
        by.setdefault(command_of(e["argv"]), []).append(e)
    rows = ["| command | inputs | for example |", "|---|---|---|"]
    for command in sorted(by):
        sample = sorted(by[command], key=lambda e: not e.get("named"))[:per_command]
        examples = "; ".join(f"`{shown_input(e, command)}`: {e['why']}" for e in sample)
        label = "(no command)" if command == "(none)" else command
        rows.append(f"| {label} | {len(by[command])} | {examples} |")
    return "\n".join(rows) + "\n"


def doc_section() -> str:
    text = DOC.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END)
    return text[start + len(TABLE_START) : end].strip("\n") + "\n"


def test_the_docs_table_is_the_data_files() -> None:
    assert doc_section() == table(), (
        "docs/reference/errors.md's bad-input table is stale: run "
        "`python tests/unit/test_bad_input_sweep.py`"
    )


if __name__ == "__main__":
    text = DOC.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    DOC.write_text(text[:start] + "\n" + table() + text[end:])
    print(f"wrote the bad-input table ({len(ENTRIES)} inputs) into {DOC.relative_to(ROOT)}")
