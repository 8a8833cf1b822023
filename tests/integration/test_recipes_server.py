"""Rendered recipes against the built upstream binary: its --help accepts them, and
`llamaspec serve` starts a real server with the embedded pair, speculation engaged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from llamaspec import config
from llamaspec.engine.build import Artifact
from llamaspec.models import recipes
from llamaspec.proof.client import free_port, server_help

from helpers import ROOT, llamaspec

pytestmark = pytest.mark.integration


def test_every_upstream_recipe_is_accepted_by_the_binary(upstream_artifact: Artifact) -> None:
    help_text = server_help(upstream_artifact.server)
    checked = 0
    for name, recipe in config.load_recipes(ROOT).items():
        for backend in ("cpu", "cuda"):
            cmd = recipes.render(
                recipe, "llama.cpp", "upstream", "t.gguf", "d.gguf", backend=backend
            )
            recipes.check_against_help(cmd, help_text, name)
            checked += 1
    assert checked >= 30
    # The pre-April-2026 spelling is refused by this binary, naming the flag.
    legacy = recipes.render(
        config.load_recipes(ROOT)["qwen3-8b"], "llama.cpp", "upstream-legacy", "t", "d"
    )
    with pytest.raises(Exception, match="does not accept --draft-max"):
        recipes.check_against_help(legacy, help_text, "upstream")


def test_recipe_show_for_the_coder_pair(upstream_artifact: Artifact) -> None:
    proc = llamaspec(
        "recipe",
        "show",
        "qwen2.5-coder-7b",
        "--engine",
        "llama.cpp",
        "--artifact",
        upstream_artifact.id,
        "--dist",
        str(upstream_artifact.path.parent),
        "--format",
        "argv",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = json.loads(proc.stdout.splitlines()[0])
    assert argv[0] == str(upstream_artifact.server)
    assert "--spec-draft-model" in argv and "-ngl" not in argv  # a CPU build: no offload


def test_serve_runs_the_embedded_pair(upstream_artifact: Artifact, gemma_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llamaspec.cli",
            "serve",
            "gemma3-270m-self",
            "--artifact",
            upstream_artifact.id,
            "--dist",
            str(upstream_artifact.path.parent),
            "--port",
            str(port),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("llamaspec serve did not become healthy in 180 s")
        body = httpx.post(
            f"{url}/completion",
            json={
                "prompt": "def fibonacci(n):\n    " * 4,
                "n_predict": 32,
                "temperature": 0,
                "cache_prompt": False,
            },
            timeout=120,
        ).json()
        assert body["timings"].get("draft_n", 0) > 0, body["timings"]
        assert body["timings"]["draft_n_accepted"] > 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
