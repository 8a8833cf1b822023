"""Upstream built with Vulkan (+ the rpc variant) from the PyPI mirror, smoke-tested on lavapipe;
the same build serves the embedded pair with its draft model on an rpc-server over loopback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaspec.engine import preflight
from llamaspec.engine.artifact import Artifact
from llamaspec.models import dialects
from llamaspec.proof import smoke
from llamaspec.runtime.client import HOST, free_port, running

from helpers import llamaspec

pytestmark = pytest.mark.integration


def test_vulkan_manifest_records_backend_defines_and_headers(vulkan_build) -> None:
    m = vulkan_build[0].manifest
    defines = {d["name"]: d for d in m["defines"]}
    assert m["backend"] == "vulkan" and m["variants"] == ["rpc"]
    assert defines["GGML_VULKAN"]["value"] == "ON"
    assert defines["GGML_VULKAN"]["origin"] == "profile llama.cpp/vulkan"
    assert defines["GGML_RPC"]["value"] == "ON"
    assert "bin/ggml-rpc-server" in m["files"]  # upstream's name for rpc-server at b11312
    assert m["preflight"]["glslc"] and m["cuda_archs"] is None
    system = preflight.header_info(Path("/usr/include"))
    if system and "VK_EXT_layer_settings" not in system[1]:
        assert "private prefix" in defines["Vulkan_INCLUDE_DIR"]["origin"]
        assert defines["SPIRV-Headers_DIR"]["key"].startswith("Debian libvulkan-dev")
    ldd = subprocess.run(
        ["ldd", vulkan_build[0].path / "lib" / "libggml-vulkan.so"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "libvulkan.so.1" in ldd and "not found" not in ldd


@contextlib.contextmanager
def rpc_server(artifact: Artifact, log: Path) -> Iterator[tuple[int, subprocess.Popen]]:
    """`rpc-server` on a loopback port with the CPU device; yields the port and process."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [
                str(artifact.path / "bin" / "ggml-rpc-server"),
                "-H",
                HOST,
                "-p",
                str(port),
                "-d",
                "CPU",
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), 1):
                break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_draft_model_on_rpc_server_speculates_and_matches(vulkan_build, gemma_path, tmp_path):
    artifact = vulkan_build[0]
    help_text = subprocess.run(
        [artifact.server, "--help"], capture_output=True, text=True, check=False
    ).stdout
    assert "--rpc" in help_text and "--spec-draft-device" in help_text
    # Draft length 1: the target verifies two tokens per batch, a shape whose greedy output
    # matched the plain server token for token here (longer drafts can flip near-ties).
    settings = dialects.SpecSettings(
        method="draft", draft_model=gemma_path, n_max=1, p_min=0.0, draft_ngl=99
    )
    spec = dialects.spec_args("upstream", settings)
    base = smoke.base_args(gemma_path)
    with rpc_server(artifact, tmp_path / "rpc-server.log") as (port, rpc):
        endpoint = f"{HOST}:{port}"
        listed = subprocess.run(
            [artifact.server, "--rpc", endpoint, "--list-devices"],
            capture_output=True,
            text=True,
            check=False,
        )
        device = re.search(r"^\s*(RPC\d+(?:\[[^\]]+\])?):", listed.stdout, re.M)
        assert device, listed.stdout + listed.stderr
        remote = ["--rpc", endpoint, "-dev", "none", "-devd", device.group(1)]
        with running(artifact.server, [*base, "-dev", "none"], tmp_path / "ref.log") as ref:
            refs = [smoke.complete(ref, p) for p in smoke.SMOKE_PROMPTS]
            with running(artifact.server, [*base, *remote, *spec], tmp_path / "spec.log") as sp:
                specs = [smoke.complete(sp, p) for p in smoke.SMOKE_PROMPTS]
                held_mib = _rss_mib(rpc.pid)
            verdicts = []
            for p, r, s in zip(smoke.SMOKE_PROMPTS, refs, specs, strict=True):
                pos = smoke.divergence(r, s)
                near = pos is not None and pos < len(r.tokens)
                top = smoke.top_logprobs_at(ref, p, pos) if near else None
                verdicts.append(smoke.classify(r, s, top))
    assert held_mib > 100, f"rpc-server held only {held_mib} MiB: the draft is not on it"
    assert sum(s.draft_n or 0 for s in specs) > 0
    assert sum(s.draft_accepted or 0 for s in specs) > 0
    assert [v.kind for v in verdicts] == ["identical"] * len(verdicts), verdicts


def _rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) // 1024  # type: ignore[union-attr]


def test_vulkan_smoke_passes_on_lavapipe(vulkan_build) -> None:
    """Last: the smoke on lavapipe, speculation on, the quantized comparison as information;
    the F32 comparison, which does not gate on Vulkan, is left out on this software device. A cold
    lavapipe compiles pipelines on first use; Mesa's shader cache makes later runs fast
    (docs/guides/vulkan.md, "Vulkan on lavapipe", gives both costs)."""
    artifact = vulkan_build[0]
    listed = subprocess.run(
        [artifact.server, "--list-devices"],
        capture_output=True,
        text=True,
        env={**os.environ, "GGML_VK_VISIBLE_DEVICES": "0"},
        check=False,
    )
    assert re.search(r"Vulkan0: .*llvmpipe", listed.stdout), listed.stdout + listed.stderr
    proc = llamaspec("smoke", "--artifact", artifact.id, "--dist", str(artifact.path.parent))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "smoke: PASSED" in output, output
    report = json.loads((artifact.path / "smoke.json").read_text())
    # a software device: one code prompt, short drafts (docs/guides/vulkan.md)
    assert [r["prompt"] for r in report["results"]] == ["code"]
    assert report["drafted"] > 0 and report["accepted"] > 0
    assert "draft length 2" in " ".join(output.split())
    # on a GPU backend the F32 comparison informs (batch invariance of F32 decoding is
    # established on the CPU backend only); on a software device it is left out, saying why
    assert report["strict_gates"] is False and report["strict"] == []
    assert "llvmpipe" in report["strict_skipped"], report["strict_skipped"]
    said = " ".join(output.split())  # rich wraps long lines
    assert "strict (F32 reference): not run: the only device is a software one" in said
    # lavapipe was made visible to the servers (ggml-vulkan hides CPU-type devices otherwise)
    assert "GGML_VK_VISIBLE_DEVICES=0" in output or os.environ.get("GGML_VK_VISIBLE_DEVICES")
