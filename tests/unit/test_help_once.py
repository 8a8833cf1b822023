"""What a build says about itself is read once (issue 55): `llama-server --help` runs at most
once per command per artifact, however many stages render, check and run its lines; a
rebuilt binary is asked again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llamaspec.cli.main import main
from llamaspec.models import server_help

ROOT = Path(__file__).resolve().parents[2]
HELP = """usage: llama-server [options]
-m,    --model FNAME                     model path
-md,   --spec-draft-model FNAME          draft model
--host HOST                              listen address
--port PORT                              port
-c,    --ctx-size N                      context
-np,   --parallel N                      slots
-ngl,  --gpu-layers N                    layers on the GPU
-t,    --threads N                       threads
--metrics                                metrics endpoint
--spec-draft-n-max N                     draft length
--spec-draft-n-min N                     shortest draft
--spec-draft-p-min P                     draft p-min
--spec-ngram-mod-n-min N                 n-gram
--spec-ngram-mod-n-max N                 n-gram
--spec-ngram-mod-n-match N               n-gram
--spec-type none,draft-simple,ngram-mod  comma-separated list
"""


def fake_server(path: Path, counter: Path) -> Path:
    """A llama-server that prints HELP and counts each --help in `counter`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --help ]; then echo x >> '{counter}'; fi\n"
        'if [ "$1" = --list-devices ]; then echo "Available devices:"; exit 0; fi\n'
        f"cat <<'EOF'\n{HELP}EOF\n"
    )
    path.chmod(0o755)
    return path


def runs(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_the_help_is_read_once_per_binary_and_again_when_it_changes(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    binary = fake_server(tmp_path / "bin" / "llama-server", counter)
    texts = {server_help.server_help(binary) for _ in range(5)}
    assert texts == {HELP} and runs(counter) == 1
    time.sleep(0.01)
    binary.write_text(binary.read_text() + "# rebuilt\n")  # a new build in the same place
    assert server_help.server_help(binary) == HELP and runs(counter) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["recipe", "show", "gemma3-270m-ngram-tuned", "--format", "argv"],
        ["recipe", "show", "gemma3-270m-ngram-tuned", "--format", "llama-swap"],
        # bench renders, checks and prices its servers before starting one (the fake exits
        # there: status 2); it read the help twice before it was kept (issue 55)
        ["bench", "gemma3-270m-ngram-tuned", "--workload", "copy", "--reports", "{tmp}/r"],
    ],
)
def test_a_command_asks_its_artifact_for_help_at_most_once(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    counter = tmp_path / "count"
    art = tmp_path / "dist" / "llamacpp-cpu-0123456789ab"
    fake_server(art / "bin" / "llama-server", counter)
    from llamaspec import config

    pin = config.load_engines(ROOT)["llama.cpp"].pin
    (art / "manifest.json").write_text(
        json.dumps(
            {
                "id": art.name,
                "engine": "llama.cpp",
                "commit": pin,
                "backend": "cpu",
                "variants": [],
                "patches": [],
                "defines": {},
            }
        )
    )
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LLAMASPEC_SERVER_READY_TIMEOUT", "5")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    status = main([*argv, "--artifact", art.name, "--dist", str(tmp_path / "dist")])
    out = capsys.readouterr()
    if argv[0] == "bench":  # stopped where the fake server would start
        assert status == 2 and "exited during start-up" in out.err, out.err
    else:
        assert status == 0, out.err
    assert runs(counter) == 1, f"--help ran {runs(counter)} times for one command"
