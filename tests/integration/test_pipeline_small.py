"""The whole pipeline on a tiny engine-shaped CMake project: fast, real cmake and compiler."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gitrepos import run_git
from helpers import llamaspec

pytestmark = pytest.mark.integration

CMAKE = """cmake_minimum_required(VERSION 3.14)
project(tiny CXX)
option(LLAMA_BUILD_TESTS "" ON)
option(LLAMA_BUILD_EXAMPLES "" ON)
option(LLAMA_BUILD_SERVER "" ON)
option(LLAMA_CURL "" OFF)
option(LLAMA_USE_PREBUILT_UI "" ON)
option(GGML_NATIVE "" ON)
set(LLAMA_BUILD_COMMIT "unknown" CACHE STRING "")
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server tools/server/server.cpp)
target_compile_definitions(llama-server PRIVATE COMMIT="${LLAMA_BUILD_COMMIT}")
"""
SERVER = '#include <cstdio>\nint main() { std::printf("version: 1 (commit %s)\\n", COMMIT); }\n'


def tiny_tree(path: Path, server: str = SERVER) -> str:
    (path / "tools" / "server").mkdir(parents=True)
    (path / "CMakeLists.txt").write_text(CMAKE)
    (path / "tools" / "server" / "server.cpp").write_text(server)
    run_git(path, "init", "-q")
    run_git(path, "add", "-A")
    run_git(path, "commit", "-q", "-m", "tiny")
    return run_git(path, "rev-parse", "HEAD")


def build_args(src: Path, dist: Path) -> tuple[str, ...]:
    """Build a local tree, no smoke (no model), no catalog patches (not an engine pin)."""
    return (
        "build",
        "--source",
        "local",
        "--source-dir",
        str(src),
        "--dist",
        str(dist),
        "--no-smoke",
        "--no-default-patches",
    )


def test_local_tree_builds_installs_and_stamps_its_commit(tmp_path: Path) -> None:
    commit = tiny_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    args = build_args(tmp_path / "src", dist)
    proc = llamaspec(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (art,) = [p for p in dist.iterdir() if p.is_dir()]
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["commit"] == commit and manifest["source"]["origin"] == "local"
    version = subprocess.run([art / "bin" / "llama-server"], capture_output=True, text=True)
    assert f"commit {commit[:7]}" in version.stdout
    again = llamaspec(*args)
    assert "is up to date" in again.stdout and "configure:" not in again.stdout


def test_compile_error_shows_the_first_error_only(tmp_path: Path) -> None:
    tiny_tree(tmp_path / "src", server="int main() { undeclared_thing(); }\n" + "\n" * 50)
    proc = llamaspec(*build_args(tmp_path / "src", tmp_path / "dist"))
    assert proc.returncode == 2
    assert "The build of llama-server failed" in proc.stderr
    assert "undeclared_thing" in proc.stderr and "was not declared" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


# The server prints where it was compiled from (__FILE__, mapped to a relative name) and, with
# LEAK=ON, the build directory as a string literal, which no prefix map can rewrite.
REPRO_CMAKE = (
    CMAKE
    + """option(LEAK "" OFF)
if (LEAK)
    target_compile_definitions(llama-server PRIVATE BDIR="${CMAKE_BINARY_DIR}")
endif()
"""
)
REPRO_SERVER = """#include <cstdio>
#ifndef BDIR
#define BDIR ""
#endif
int main() { std::printf("version: 1 (commit %s) %s %s %s\\n", COMMIT, __FILE__, __DATE__, BDIR); }
"""


def repro_tree(src: Path) -> None:
    (src / "tools" / "server").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(REPRO_CMAKE)
    (src / "tools" / "server" / "server.cpp").write_text(REPRO_SERVER)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "repro"]):
        run_git(src, *args)


def test_check_reproducible_rebuilds_a_copy_and_records_the_result(tmp_path: Path) -> None:
    src, dist = tmp_path / "src", tmp_path / "dist"
    repro_tree(src)
    native = llamaspec(*build_args(src, dist), "--check-reproducible")
    out = native.stdout
    assert native.returncode == 0, out + native.stderr
    assert "host-specific (GGML_NATIVE=ON)" in out and "--variant portable" in out
    portable = (*build_args(src, dist), "--check-reproducible", "-D", "GGML_NATIVE=OFF")
    proc = llamaspec(*portable)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reproducible: equal: " in proc.stdout
    manifests = [json.loads((p / "manifest.json").read_text()) for p in dist.iterdir()]
    (manifest,) = [m for m in manifests if isinstance(m["reproducible"], dict)]
    record = manifest["reproducible"]
    assert record["checked"] and record["equal"] and record["differing"] == []
    assert record["sha256_a"] == record["sha256_b"] == manifest["binary_sha256"]
    assert record["host_paths"] == {}
    server = dist / manifest["artifact_id"] / "bin" / "llama-server"
    printed = subprocess.run([server], capture_output=True, text=True).stdout
    # __FILE__ relative to the tree, __DATE__ from SOURCE_DATE_EPOCH (the commit's date)
    assert " tools/server/server.cpp " in printed and str(tmp_path) not in printed
    # asked again: the recorded result, no rebuild
    again = llamaspec(*portable)
    assert "is up to date" in again.stdout and "reproducible: equal (checked" in again.stdout


def test_check_reproducible_names_a_leak_and_keeps_the_second_build(tmp_path: Path) -> None:
    from llamaspec.paths import cache_dir

    src, dist = tmp_path / "src", tmp_path / "dist"
    repro_tree(src)
    proc = llamaspec(
        *build_args(src, dist), "--check-reproducible", "-D", "GGML_NATIVE=OFF", "-D", "LEAK=ON"
    )
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "The build is not reproducible: 1 of 1 files differ (bin/llama-server)" in text
    assert "build-host paths are in bin/llama-server" in text and "diffoscope" in text
    (art,) = list(dist.iterdir())
    record = json.loads((art / "manifest.json").read_text())["reproducible"]
    assert record["checked"] and not record["equal"] and record["differing"] == ["bin/llama-server"]
    kept = list((cache_dir() / "build").glob(f".repro-{art.name}-*"))
    assert len(kept) == 1 and str(kept[0]) in text
    shutil.rmtree(kept[0])
