"""Build options are declared once (cli/options.py), match BuildSpec, and start-up stays light."""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.cli import options, shared
from llamaspec.cli.main import make_parser
from llamaspec.engine.pipeline import BuildSpec
from llamaspec.errors import LlamaspecError

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
# BuildSpec fields that no command-line option fills (none today).
NOT_CLI: set[str] = set()


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def test_every_buildspec_field_has_exactly_one_option_and_the_same_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(BuildSpec)}
    declared = [o.field for o in options.OPTIONS if o.field]
    assert len(declared) == len(set(declared)), "a BuildSpec field is declared twice"
    assert set(declared) == set(fields) - NOT_CLI
    for opt in options.OPTIONS:
        if not opt.field:
            continue
        want = _default(fields[opt.field])
        got = () if opt.kind == "list" else opt.default
        if opt.kind == "flag":
            got = bool(opt.default)
        assert got == want, f"{opt.flags[0]}: default {got!r}, BuildSpec says {want!r}"
    flags = [f for o in options.OPTIONS for f in o.flags]
    assert len(flags) == len(set(flags))


def test_the_docs_build_options_table_is_generated() -> None:
    assert options.markdown() in (ROOT / "docs/reference/build-options.md").read_text(), (
        "the docs' Build options table is stale: paste llamaspec.cli.options.markdown() into "
        "docs/reference/build-options.md"
    )


def _sub(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize(
    ("command", "names"),
    [
        (("build",), [o.name for o in options.OPTIONS]),
        (("doctor",), ["engine", "source", "source_dir", "cuda_arch", "defines"]),
        (("docker", "build"), list(options.IMAGE)),
        (("docker", "pull"), ["engine", "pin"]),  # its --backend: see the test below
        (("patches", "status"), list(options.SOURCE)),
    ],
)
def test_commands_take_the_declared_options(command: tuple[str, ...], names: list[str]) -> None:
    parser = _sub(make_parser(), *command)
    by_flag = {f: a for a in parser._actions for f in a.option_strings}
    for name in names:
        opt = options.BY_NAME[name]
        action = by_flag[opt.flags[0]]
        assert tuple(action.option_strings) == opt.flags
        assert action.help == opt.help and action.dest == opt.dest


def test_docker_pull_takes_the_declared_backend_with_its_own_default() -> None:
    """`docker pull` detects the host's backend when --backend is left out, so its help
    says so instead of the declared "cpu (default)" (issue 42); flags and dest as declared."""
    parser = _sub(make_parser(), "docker", "pull")
    opt = options.BY_NAME["backend"]
    (action,) = [a for a in parser._actions if opt.flags[0] in a.option_strings]
    assert tuple(action.option_strings) == opt.flags and action.dest == opt.dest
    assert action.help == "cpu, cuda or vulkan (default: this host's)"
    assert parser.parse_args([]).backend is None  # None: detect the host


def test_parsed_build_arguments_make_the_buildspec() -> None:
    args = make_parser().parse_args(
        [
            *("build", "--engine", "ik_llama.cpp", "--pin", "a" * 40, "--source", "pypi"),
            *("--patch", "p1", "--patch", "p2", "--no-patch", "p3", "--no-default-patches"),
            *("-D", "GGML_NATIVE=OFF", "--variant", "rpc", "--cuda-arch", "86", "-j", "3"),
            *("--dist", "out", "--patch-source", "/srv/m", "--backend", "vulkan"),
        ]
    )
    assert options.build_spec(args) == BuildSpec(
        engine="ik_llama.cpp",
        pin="a" * 40,
        source="pypi",
        backend="vulkan",
        patch=("p1", "p2"),
        no_patch=("p3",),
        no_default_patches=True,
        defines=("GGML_NATIVE=OFF",),
        variants=("rpc",),
        cuda_arch="86",
        jobs=3,
        dist=Path("out"),
        patch_source="/srv/m",
    )
    assert options.build_spec(make_parser().parse_args(["build"])) == BuildSpec()


@pytest.mark.parametrize("jobs", ["-4", "0", "two"])
def test_jobs_must_be_a_positive_whole_number(jobs: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="whole number of 1 or more"):
        options.positive_int(jobs)
    assert options.positive_int("12") == 12


def test_docker_defaults_are_read_when_the_command_runs() -> None:
    from llamaspec.images import specs

    args = make_parser().parse_args(["docker", "build"])
    assert args.registry == specs.LOCAL_REGISTRY
    pull = make_parser().parse_args(["docker", "pull", "--registry", "r.example"])
    assert (pull.registry, pull.recipe, pull.backend) == ("r.example", specs.DEFAULT_RECIPE, None)
    size = make_parser().parse_args(["docker", "size", "img"])
    assert size.base == specs.BASES["cpu"][0]


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("/srv/mirror", (None, "/srv/mirror")),
        ("ik_llama.cpp=/srv/ik", ("ik_llama.cpp", "/srv/ik")),
        ("https://example.org/x.git?a=b", (None, "https://example.org/x.git?a=b")),
        ("./a=b", (None, "./a=b")),
        ("llama.cpp=https://example.org/llama.cpp", ("llama.cpp", "https://example.org/llama.cpp")),
    ],
)
def test_patch_source_forms(text: str, split: tuple) -> None:
    assert options.split_patch_source(text) == split


@pytest.mark.parametrize("text", ["", "ik_llama.cpp=", "=/srv/x"])
def test_patch_source_needs_both_parts(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="ENGINE=DIR"):
        options.patch_source_form(text)


def test_build_patch_source_prefix_must_name_the_engine_built() -> None:
    parse = make_parser().parse_args
    args = parse(["build", "--engine", "ik_llama.cpp", "--patch-source", "ik_llama.cpp=/srv/ik"])
    options.settle_patch_source(args)
    assert args.patch_source == "/srv/ik"
    assert options.build_spec(args).patch_source == "/srv/ik"
    args = parse(["build", "--patch-source", "ik_llama.cpp=/srv/ik"])
    with pytest.raises(LlamaspecError, match="mirror of ik_llama.cpp, but this command works on"):
        options.settle_patch_source(args)
    args = parse(["patches", "status", "--patch-source", "llama.cpe=/srv/u"])
    with pytest.raises(LlamaspecError, match="Did you mean 'llama.cpp'"):
        options.settle_patch_source(args)


def test_lock_takes_both_patch_source_forms() -> None:
    parse = make_parser().parse_args
    assert parse(["lock", "--patch-source", "ik_llama.cpp=/srv/ik"]).patch_source == [
        "ik_llama.cpp=/srv/ik"
    ]
    both = parse(["lock", "--patch-source", "/srv/all"]).patch_source
    assert sorted(both) == ["ik_llama.cpp=/srv/all", "llama.cpp=/srv/all"]
    # an ENGINE= item wins over a bare one, in either order (the lock reads them in order)
    for argv in (
        ["--patch-source", "ik_llama.cpp=/srv/ik", "--patch-source", "/srv/all"],
        ["--patch-source", "/srv/all", "--patch-source", "ik_llama.cpp=/srv/ik"],
    ):
        mirrors = dict(i.split("=", 1) for i in parse(["lock", *argv]).patch_source)
        assert mirrors == {"ik_llama.cpp": "/srv/ik", "llama.cpp": "/srv/all"}


HEAVY = (
    "openai",
    "matplotlib",
    "huggingface_hub",
    "gguf",
    "numpy",
    "httpx",
    "pydantic",
    "yaml",
    "rich.table",
    "llamaspec.config",
    "llamaspec.lock",
    "llamaspec.engine",
    "llamaspec.models",
    "llamaspec.proof",
    "llamaspec.images",
)


def test_the_command_line_imports_no_stage_module() -> None:
    """`llamaspec --help` builds the whole parser; that must not import a stage or a heavy
    dependency (what is imported is tested, not wall time)."""
    code = (
        "import llamaspec.cli.main as m; m.make_parser().format_help()\n"
        "for c in ('build', 'doctor', 'docker', 'patches', 'recipe'):\n"
        "    try: m.make_parser().parse_args([c, '--help'])\n"
        "    except SystemExit: pass\n"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    imported = {
        line.split("|")[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "llamaspec.cli.main" in imported and "llamaspec.cli.options" in imported
    loaded = sorted(m for m in imported if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not loaded, f"imported at start-up: {loaded}"


def test_a_missing_extra_names_the_pip_line() -> None:
    from llamaspec.errors import missing_extra

    err = missing_extra("smoke", "openai", "The smoke test's OpenAI endpoint check")
    assert isinstance(err, LlamaspecError)
    assert "pip install 'llamaspec[smoke]'" in err.message and "\n" not in err.message
    assert err.message.startswith("The smoke test's OpenAI endpoint check needs")


def _actions(parser: argparse.ArgumentParser, flag: str, path: str = "llamaspec"):
    """(command path, action) for every parser under `parser` that has `flag`."""
    for action in parser._actions:
        if flag in action.option_strings:
            yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, flag, f"{path} {name}")


@pytest.mark.parametrize("flag", ["--artifact", "--dist", "--reports"])
def test_run_time_options_shared_by_many_commands_are_declared_once(flag: str) -> None:
    """`--artifact`, `--dist` and `--reports` come from one declaration each (cli/shared.py;
    the build options' `--dist` from options.py): one type, one metavar, one help text but
    for the default each command names (issue 55)."""
    found = list(_actions(make_parser(), flag))
    assert len(found) >= 5, found
    template = re.escape(shared.REPORTS_HELP).replace(re.escape("{what}"), ".+")

    def declared(help_: str) -> str:  # the help less what each command says for itself
        if flag == "--reports" and re.fullmatch(template, help_):
            return shared.REPORTS_HELP
        return help_.split("; default:")[0]

    kinds = {(a.type, a.metavar, declared(a.help or "")) for _, a in found}
    assert len(kinds) == 1, f"{flag} is declared in more than one way: {kinds}"
    spelled = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "src/llamaspec/cli").glob("*.py"))
        if f'"{flag}"' in p.read_text() and p.name not in ("shared.py", "options.py")
    ]
    assert not spelled, f"{flag} spelled out in {spelled}: use cli/shared.py"
