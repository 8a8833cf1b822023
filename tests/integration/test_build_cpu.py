"""The full `llamaspec build` of upstream llama.cpp from the PyPI mirror, with its smoke test."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.engine import build
from llamaspec.engine import reproducible as repro
from llamaspec.maint import build_bench as benchbuild

from helpers import UPSTREAM_VARIANT, llamaspec

pytestmark = pytest.mark.integration


def test_build_smoke_passes_with_drafts_accepted(upstream_build) -> None:
    artifact, output = upstream_build
    assert "smoke: PASSED" in output
    assert "equivalence: draft/code: identical" in output
    report = json.loads((artifact.path / "smoke.json").read_text())
    assert report["passed"] and report["accepted"] > 0 and report["drafted"] >= report["accepted"]
    # the speculation gate read the speculative server's /metrics: it drafted
    assert report["gate"]["kind"] == "drafting" and report["gate"]["drafted"] > 0
    # the gate: the strict fast form on the F32 reference copy, token-identical
    strict = {s["method"]: s for s in report["strict"]}
    assert set(strict) == {"draft", "ngram-mod"} and len(report["reference_sha256"]) == 64
    for method, s in strict.items():
        assert s["case"]["kind"] == "identical", (method, s)
    assert strict["draft"]["accepted"] > 0
    # the quantized model's comparison stays as information
    info = {r["prompt"]: r for r in report["results"]}
    assert set(info) == {"code", "prose"}
    assert info["code"]["speculative"]["draft_n"] > 0


def test_manifest_records_inputs_and_binary(upstream_artifact) -> None:
    m = upstream_artifact.manifest
    assert m["engine"] == "llama.cpp"
    assert m["commit"] == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert m["source"]["origin"] == "pypi-sdist"
    assert "llama-cpp-python==0.3.36" in m["source"]["detail"]
    names = {d["name"]: d["value"] for d in m["defines"]}
    assert names["CMAKE_BUILD_TYPE"] == "Release" and names["LLAMA_USE_PREBUILT_UI"] == "OFF"
    assert "LLAMA_CURL" not in names  # not an option of upstream at this pin
    assert m["toolchain"]["cmake"] and m["toolchain"]["compiler"]
    assert len(m["binary_sha256"]) == 64 and m["build_seconds"]["compile"] >= 0


def test_version_names_the_pinned_commit(upstream_artifact) -> None:
    out = subprocess.run(
        [upstream_artifact.server, "--version"], capture_output=True, text=True, check=True
    )
    assert "commit 0c1e570" in out.stdout + out.stderr


def test_dist_is_self_contained(upstream_artifact) -> None:
    ldd = subprocess.run(
        ["ldd", upstream_artifact.server], capture_output=True, text=True, check=True
    ).stdout
    for line in ldd.splitlines():
        if "libllama" in line or "libggml" in line:
            resolved = Path(line.split("=>")[1].split("(")[0].strip()).resolve()
            assert resolved.parent == (upstream_artifact.path / "lib").resolve(), line
    assert "not found" not in ldd
    # portable: ggml loads one CPU backend per instruction set from beside the binary
    variants = sorted((upstream_artifact.path / "bin").glob("libggml-cpu-*.so"))
    names = {p.name.removeprefix("libggml-cpu-").removesuffix(".so") for p in variants}
    assert {"x64", "sse42", "haswell", "skylakex", "zen4"} <= names, names
    for module in variants:
        out = subprocess.run(["ldd", module], capture_output=True, text=True, check=True)
        assert "not found" not in out.stdout, (module, out.stdout)


def test_same_request_again_compiles_nothing(upstream_artifact) -> None:
    proc = llamaspec(
        "build",
        "--source",
        "pypi",
        "--dist",
        str(upstream_artifact.path.parent),
        "--no-smoke",
        *UPSTREAM_VARIANT,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"build: {upstream_artifact.id} is up to date" in proc.stdout
    assert "configure:" not in proc.stdout


def test_misspelt_define_fails_fast_with_did_you_mean(upstream_artifact, tmp_path) -> None:
    proc = llamaspec(
        "build",
        "--source",
        "pypi",
        "--dist",
        str(tmp_path),
        "--no-smoke",
        "--define",
        "GGML_USE_OPENMP=ON",
    )
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2
    assert "GGML_USE_OPENMP (from --define) is not an option of this tree" in text
    assert "Did you mean 'GGML_OPENMP'" in text
    assert not list(tmp_path.iterdir())


def test_one_line_patch_change_recompiles_little(upstream_artifact, tmp_path) -> None:
    """The bench-build scenario as a check of the build layout (not of speed): after a
    one-line change to a project patch, ccache serves almost every object of the new tree."""
    if not shutil.which("ccache"):
        pytest.fail("ccache is not installed; .ci/run installs it (apt-get install ccache)")
    tree_link = build.cache_dir() / "build" / upstream_artifact.id
    tree = Path(build.read_cmake_cache(tree_link / "CMakeCache.txt")["CMAKE_HOME_DIRECTORY"])
    cmd = [sys.executable, "-m", "llamaspec.cli", "build", "--source", "pypi", "--no-smoke"]
    cmd += UPSTREAM_VARIANT
    cmd += ["--dist", str(tmp_path)]
    out = benchbuild.patch_rebuild(tree, cmd, tmp_path, "llama.cpp", Console())
    hits = out["rebuild_ccache"]
    assert out["file"] == "tools/server/server.cpp"
    assert hits["direct_cache_hit"] + hits["preprocessed_cache_hit"] > 100, out
    assert hits["cache_miss"] <= 20, out
    assert not list(tmp_path.iterdir())  # the benchmark's artifacts are gone again


def test_binary_holds_no_build_host_path(upstream_artifact) -> None:
    """Reproducible builds, checked cheaply on the suite's build: no path of the source tree,
    the build directory or the cache in llama-server or its libraries (ccache's relative
    `../../` form included), a RUNPATH of $ORIGIN only, and the manifest's fixed inputs."""
    link = build.cache_dir() / "build" / upstream_artifact.id
    tree = Path(build.read_cmake_cache(link / "CMakeCache.txt")["CMAKE_HOME_DIRECTORY"])
    needles = repro.needles(tree, link, link.resolve(), build.cache_dir())
    assert repro.scan(upstream_artifact.path, needles) == {}
    files = repro.shipped(upstream_artifact.path)
    assert len([f for f in files if f.startswith("lib/")]) >= 3  # a shared-library build
    for rel, digest in files.items():
        if digest.startswith("->"):
            continue
        data = (upstream_artifact.path / rel).read_bytes()
        assert b"../../ggml/" not in data and b"../../src/" not in data, rel
        dyn = subprocess.run(
            ["readelf", "-d", upstream_artifact.path / rel], capture_output=True, text=True
        ).stdout
        for path in re.findall(r"R(?:UN)?PATH\)\s+Library r(?:un)?path: \[(.*)\]", dyn):
            assert all(p.startswith("$ORIGIN") for p in path.split(":") if p), (rel, path)
    m = upstream_artifact.manifest
    assert m["reproducible"] == {"checked": False}  # portable: checkable, not checked here
    names = {d["name"]: d["value"] for d in m["defines"]}
    assert names["GGML_NATIVE"] == "OFF" and names["GGML_CPU_ALL_VARIANTS"] == "ON"
    assert m["files_sha256"] == files and m["binary_sha256"] == files["bin/llama-server"]
    inputs = m["reproducible_inputs"]
    assert inputs["source_date_epoch"] == 1790812800  # 2026-10-01, the pin_date
    assert "-ffile-prefix-map=<source>/=" in inputs["path_maps"]
    assert str(tree) not in json.dumps(m["defines"])
