"""Every recipe rendered against every binary the suite builds (upstream CPU, ik_llama.cpp
CPU, upstream Vulkan + rpc) and checked against that binary's --help; `llamaspec serve`
starts a real server with the embedded pair, speculation engaged."""

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
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects, recipes
from llamaspec.models.server_help import spec_type_choices
from llamaspec.proof.defects import known_defect
from llamaspec.runtime.client import free_port, running, server_help

from helpers import ROOT, llamaspec

pytestmark = pytest.mark.integration


def _render_all(artifact: Artifact) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Every recipe rendered for `artifact` (its engine, default-pin dialect, backend and
    variants) and checked against its --help: {name: argv} passed, {name: why} refused."""
    m = artifact.manifest
    dialect = dialects.dialect_for(artifact, root=ROOT)
    help_text = server_help(artifact.server)
    passed: dict[str, list[str]] = {}
    refused: dict[str, str] = {}
    for name, recipe in config.load_recipes(ROOT).items():
        try:
            cmd = recipes.render(
                recipe,
                m["engine"],
                dialect,
                "t.gguf",
                "d.gguf",
                server=str(artifact.server),
                backend=m["backend"],
                variants=m.get("variants") or [],
                pin=m["commit"],
            )
        except LlamaspecError as exc:
            refused[name] = " ".join(str(exc).split())
            continue
        recipes.check_against_help(cmd, help_text, f"{artifact.id} ({name})")
        passed[name] = list(cmd.argv)
    for name, why in refused.items():
        # Refused only for a spec type this pin lacks, or rpc hosts on a build without the
        # rpc variant, named; never for a hidden option.
        recipe = config.load_recipes(ROOT)[name].for_engine(m["engine"])
        if recipe.server.rpc and "rpc" not in (m.get("variants") or []):
            assert "llamaspec build --variant rpc" in why, (name, why)
            continue
        lacking = [t for t in recipe.spec.types if t not in dialects.DIALECTS[dialect].types]
        assert lacking and f"asks for spec type {', '.join(lacking)}" in why, (name, why)
    return passed, refused


RPC_RECIPES = {n for n, r in config.load_recipes(ROOT).items() if r.server.rpc}
IK_LACKS = {"gemma-4-31b-assistant", "llama-3.1-8b-eagle3"}  # assistant, eagle3


OFFLOAD = set(dialects.OFFLOAD_ONLY)


def test_every_recipe_against_the_upstream_cpu_binary(upstream_artifact: Artifact) -> None:
    passed, refused = _render_all(upstream_artifact)
    # a recipe that puts layers on rpc hosts is refused by a build without the rpc variant
    assert set(refused) == RPC_RECIPES and len(passed) + len(refused) >= 22
    for name, argv in passed.items():
        assert not OFFLOAD & set(argv), (name, argv)  # a cpu build: nothing to offload to
    # The pre-April-2026 spelling is refused by this binary, naming the flag.
    legacy = recipes.render(
        config.load_recipes(ROOT)["qwen3-8b"], "llama.cpp", "upstream-legacy", "t", "d"
    )
    with pytest.raises(LlamaspecError, match="does not accept --draft-max"):
        recipes.check_against_help(legacy, server_help(upstream_artifact.server), "upstream")


def test_every_recipe_against_the_ik_cpu_binary(ik_build: tuple[Artifact, str]) -> None:
    """ik_llama.cpp at its default pin (dialect ik-legacy): every recipe renders and passes
    its --help. Its `--spec-type` takes one ngram type and `-mtp` switches MTP on, so the
    ngram and MTP recipes render too; offload options are dropped (its CPU --help hides
    -ngl, -ngld, -dev, -devd, and -ot is never listed)."""
    artifact = ik_build[0]
    passed, refused = _render_all(artifact)
    # no rpc variant: refused, not run locally; no EAGLE-3 and no MTP drafter file at this
    # pin: refused, naming the type (_render_all checks each reason)
    assert set(refused) == RPC_RECIPES | IK_LACKS, refused
    assert len(passed) + len(refused) == len(config.load_recipes(ROOT)) >= 22
    assert passed["deepseek-r1"][-8:] == [
        *("-md", "d.gguf", "--draft-max", "12", "--draft-min", "0", "--draft-p-min", "0.5")
    ]
    assert "-mtp" in passed["glm-4.5-air-mtp"]
    assert passed["gemma3-270m-ngram"][-2:] == ["--spec-type", "ngram-mod"]
    for name, argv in passed.items():
        assert not OFFLOAD & set(argv), (name, argv)
        assert "--rpc" not in argv  # no rpc variant
    choices = spec_type_choices(server_help(artifact.server))
    assert choices is not None and {"ngram-mod", "ngram-simple", "ngram-map-k"} <= choices


def test_every_recipe_against_the_vulkan_rpc_binary(vulkan_build: tuple[Artifact, str]) -> None:
    """A GPU backend with the rpc variant keeps every offload option."""
    passed, refused = _render_all(vulkan_build[0])
    assert not refused and len(passed) == len(config.load_recipes(ROOT)) >= 22
    assert {"-ngl", "--spec-draft-ngl", "-ot"} <= set(passed["deepseek-r1"])
    rpc = passed["llama-3.3-70b-rpc-draft"]
    assert {"--rpc", "--spec-draft-device", "-ngl"} <= set(rpc)


def test_ik_serves_the_ngram_recipe_at_its_default_pin(
    ik_build: tuple[Artifact, str], gemma_path: Path, tmp_path: Path
) -> None:
    """The rendered `--spec-type ngram-mod` really runs on ik_llama.cpp 55d3c05, and greedy
    output matches the plain server."""
    artifact = ik_build[0]
    cmd = recipes.render(
        config.load_recipes(ROOT)["gemma3-270m-ngram"],
        "ik_llama.cpp",
        "ik-legacy",
        gemma_path,
        None,
        backend="cpu",
        variants=[],
    )
    args = list(cmd.argv[1:])
    del args[args.index("--host") : args.index("--port") + 2]  # running() picks the port
    prompt = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n" * 6
    body = {"prompt": prompt, "n_predict": 48, "temperature": 0, "cache_prompt": False}
    plain = [a for a in args if a not in ("--spec-type", "ngram-mod")]
    with running(artifact.server, plain, tmp_path / "plain.log") as srv:
        ref = srv.post("/completion", body)["content"]
    with running(artifact.server, args, tmp_path / "ngram.log") as srv:
        reply = srv.post("/completion", body)
    out = reply["content"]
    # An unknown --spec-type value makes this server exit at start-up; it started, and
    # says it set speculation up.
    log = (tmp_path / "ngram.log").read_text(errors="replace")
    assert "ngram_mod" in log or "speculative decoding context initialized" in log, log[-3000:]
    if out != ref:
        # only the pin's catalogued defect is allowed, exactly as catalogued: every token
        # reported, and the same text cut short, keeping at least the defect's fraction
        defect = known_defect(artifact.manifest, "short-output")
        assert defect is not None, (ref, out)
        predicted = reply.get("tokens_predicted")
        why = defect.not_short_output(ref, out, predicted, body["n_predict"], "characters")
        assert why is None, (why, ref, out)


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
