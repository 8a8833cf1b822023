"""The CLI turns bad input into one paragraph and exit status 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runcli import cli

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "--engine", "llama.ccp"], "Did you mean 'llama.cpp'"),
        (["build", "--pin", "0c1e570"], "not a full 40-character commit SHA"),
        (["build", "--backend", "cuda2"], "Did you mean 'cuda'"),
        (["build", "--define", "GGML_CUDA_DISABLE_GRAPHS"], "has no value"),
        (["build", "--source", "local", "--source-dir", "/nonexistent/x"], "does not exist"),
        (["build", "--patch", "nope"], "Unknown patch id 'nope'"),
        (["smoke", "--artifact", "nope", "--dist", "/nonexistent"], "is not an artifact"),
        (["build", "--jobs", "-4"], "'-4' is not a whole number of 1 or more"),
        (["build", "-j", "0"], "'0' is not a whole number of 1 or more"),
        (["verify", "--repeat", "0"], "'0' is not a whole number of 1 or more"),
        (["bench", "--repetitions", "x"], "'x' is not a whole number of 1 or more"),
        (["verify", "--artifact", "nope", "--dist", "/nonexistent"], "is not an artifact"),
        (["bench-build", "--artifact", "nope", "--dist", "/nonexistent"], "is not an artifact"),
        (["recipe", "show", "qwen2.5-coder-7b", "--engine", ""], "--engine: must not be empty"),
        (["serve", "qwen2.5-coder-7b", "--engine", " "], "--engine: must not be empty"),
        (
            ["build", "--patch-source", "ik_llama.cpp=/srv/ik"],
            "is a mirror of ik_llama.cpp, but this command works on llama.cpp",
        ),
        (["build", "--patch-source", "ik_llama.cpp="], "write it as DIR|URL"),
        (["lock", "--patch-source", "llama.cpe=/srv/u"], "Did you mean 'llama.cpp'"),
        (["gpu-acceptance"], "gpu-acceptance needs an NVIDIA GPU, and none is visible"),
        (
            ["recipe", "show", "qwen3-8b", "--format", "llama-swap"],
            "must name model files llama-server can open",
        ),
        (["recipe", "show", "qwen3-8b", "--format", "llama-swap", "--ttl", "0"], "--ttl"),
        (["build", "--backend", "cpu", "--cuda-toolkit", "pypi"], "applies to --backend cuda"),
        (
            ["build", "--backend", "cuda", "--cuda-arch", "90", "--cuda-toolkit", "/nonexistent"],
            "--cuda-toolkit /nonexistent: no such directory",
        ),
        (
            ["cuda-compile-check", "--cuda-arch", "70", "--cuda-toolkit", "pypi"],
            "cannot compile for sm_70",
        ),
        (["build", "--backend", "cuda", "--cuda-toolkit", "pypi"], "no --cuda-arch, and no NVIDIA"),
    ],
)
def test_bad_input_is_one_clear_error(args: list[str], message: str, tmp_path: Path) -> None:
    proc = cli(*args, env_cache=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr + proc.stdout


def test_missing_cmake_is_named_with_the_install_command(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to("/usr/bin/git")
    proc = subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", "build"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "LLAMASPEC_CACHE": str(tmp_path)},
        check=False,
    )
    assert proc.returncode == 2 and "cmake is not installed" in proc.stderr
    assert "apt-get install cmake" in " ".join(proc.stderr.split())


def _no_tools(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has git and nothing else: no cmake, ninja or compiler."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "git").exists():
        (bin_dir / "git").symlink_to("/usr/bin/git")
    return {"PATH": str(bin_dir), "LLAMASPEC_CACHE": str(tmp_path / "cache"), "HOME": str(tmp_path)}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["build", "--pin", "0c1e570"], "not a full 40-character commit SHA"),
        (["build", "--patch", "nope"], "Unknown patch id 'nope'"),
        (["build", "--define", "GGML_CUDA=maybe"], "neither ON nor OFF"),
        (["build", "--define", "GGML_CUDA=2"], "turns on the cuda backend"),
        (["build", "--source", "pypi", "--pin", "1" * 40], "no PyPI mirror"),
        (["build", "--source-dir", "/nonexistent/x", "--source", "git"], "only goes with"),
        (["smoke", "--artifact", "../x"], "is not an artifact id"),
        (["build", "--source", "local", "--source-dir", "PLAIN", "--pin", "1" * 40], "plain"),
    ],
)
def test_inputs_are_checked_before_tools_are_looked_for(
    args: list[str], message: str, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    (plain / "tools" / "server").mkdir(parents=True)
    (plain / "CMakeLists.txt").write_text("x\n")
    args = [str(plain) if a == "PLAIN" else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_no_tools(tmp_path),
        check=False,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert message in text and "is not installed" not in text
    assert "Traceback" not in proc.stderr + proc.stdout


def test_gpu_acceptance_of_one_engine_keeps_the_other_engines_rows(tmp_path: Path) -> None:
    import json

    from llamaspec.maint import gpu_acceptance as gpu

    summary = tmp_path / "gpu-acceptance-x.json"
    rows = [
        {"step": "llama.cpp: build and smoke", "argv": [], "exit": 0, "seconds": 3},
        {"step": "ik_llama.cpp: build and smoke", "argv": [], "exit": 0, "seconds": 9},
    ]
    artifacts = {"llama.cpp": "up-1", "ik_llama.cpp": "ik-1"}
    summary.write_text(json.dumps({"steps": rows, "artifacts": artifacts}))
    assert gpu.kept_from(summary, ["llama.cpp"]) == ([rows[1]], {"ik_llama.cpp": "ik-1"})
    assert gpu.kept_from(summary, list(gpu.ENGINES)) == ([], {})
    summary.write_text("{not json")
    assert gpu.kept_from(summary, ["llama.cpp"]) == ([], {})
    assert gpu.kept_from(tmp_path / "none.json", ["llama.cpp"]) == ([], {})


def test_gpu_acceptance_runs_each_step_as_a_llamaspec_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    import json
    import os

    from rich.console import Console

    from llamaspec.errors import LlamaspecError
    from llamaspec.maint import gpu_acceptance as gpu

    smi = tmp_path / "bin" / "nvidia-smi"  # a GPU as nvidia-smi describes one
    smi.parent.mkdir()
    smi.write_text(
        '#!/bin/sh\ncase "$*" in *driver_version*) echo 999.1;; *) echo "Fake GPU, 9.0";; esac\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    reports = tmp_path / "reports"
    # --source local without --source-dir: the build step's own process refuses it at once
    request = gpu.Request(("llama.cpp",), tmp_path / "dist", reports, source="local")
    with pytest.raises(LlamaspecError, match="1 of 1 steps failed"):
        gpu.run(request, Console())
    record = json.loads((reports / "gpu-acceptance-fake-gpu.json").read_text())
    assert record["gpus"] == ["Fake GPU, 9.0"] and record["driver"] == "999.1"
    [row] = record["steps"]
    assert row["step"] == "llama.cpp: build and smoke" and row["exit"] == 2
    assert row["argv"][:3] == ["build", "--backend", "cuda"] and row["argv"][-1] == "llama.cpp"
    md = (reports / "gpu-acceptance-fake-gpu.md").read_text()
    assert "| llama.cpp: build and smoke | 2 |" in md and "none built" in md
    out, err = capfd.readouterr()  # the child wrote to this process's stdout and stderr
    assert "gpu-acceptance: llama.cpp: build and smoke: llamaspec build" in out
    assert "--source local needs --source-dir" in err


def test_every_command_help_ends_with_examples_that_parse() -> None:
    import shlex

    from llamaspec.cli import examples
    from llamaspec.cli.main import make_parser

    parser = make_parser()
    paths = {" ".join(path): sub for path, sub in examples.parsers(parser)}
    assert set(paths) == set(examples.EXAMPLES), "a command without examples, or a stale one"
    for name, sub in paths.items():
        assert sub.format_help().rstrip().endswith(examples.EXAMPLES[name][-1]), name
        for line in examples.EXAMPLES[name]:
            argv = shlex.split(line)
            assert argv[0] == "llamaspec" and argv[1 : 1 + len(name.split())] == name.split()
            parser.parse_args(argv[1:])  # SystemExit on anything the parser refuses


def test_every_command_has_one_handler_and_main_only_calls_it() -> None:
    """Each command (and subcommand) parser names its handler; `main` dispatches on nothing
    else, and no module imports `cli.main` to run a command in-process."""
    import argparse
    import inspect

    import llamaspec
    from llamaspec.cli import examples
    from llamaspec.cli.main import main, make_parser

    for path, sub in examples.parsers(make_parser()):
        groups = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
        handler = sub._defaults.get("handler")
        assert groups or callable(handler), f"llamaspec {' '.join(path)} has no handler"
        if handler is not None:
            assert handler.__name__ == "cmd_" + "_".join(path).replace("-", "_"), path
    source = inspect.getsource(main)
    assert "args.handler(args, console)" in source and "args.command" not in source
    src = Path(llamaspec.__file__).parent
    importers = sorted(
        p.relative_to(src).as_posix()
        for p in src.rglob("*.py")
        if "llamaspec.cli.main import" in p.read_text()
        or "from llamaspec.cli import main" in p.read_text()
    )
    assert importers == ["cli/__init__.py", "cli/__main__.py", "cli/reference.py"]


def test_top_level_help_lists_users_commands_and_names_the_maintainers() -> None:
    from llamaspec.cli import main as cli_main

    text = cli_main.make_parser().format_help()
    listed = {line.split()[0] for line in text.splitlines() if line.startswith("    ")}
    assert {"build", "verify", "bench", "tune", "serve", "recipe", "models", "doctor"} <= listed
    assert not listed & set(cli_main.MAINTAINER)
    assert "maintainer commands (also as `llamaspec maint COMMAND`" in text
    assert cli_main._maint(["maint", "lock", "--patch-source", "x"]) == [
        "lock", "--patch-source", "x"
    ]  # fmt: skip
    assert cli_main._maint(["lock"]) == ["lock"]  # and directly, as before
    with pytest.raises(SystemExit) as stop:
        cli_main._maint(["maint", "serve", "x"])  # a user's command is not under maint
    assert stop.value.code == 2
