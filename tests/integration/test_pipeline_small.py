"""The whole pipeline on a tiny engine-shaped CMake project: fast, real cmake and compiler."""

from __future__ import annotations

import json
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
