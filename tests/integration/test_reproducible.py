"""The reproducible-build flags on a small real CMake project (seconds, not a llama build).

The project has what leaks paths in llama.cpp: `__FILE__` in sources, in a header found via
the build directory, and in a unity build (whose generated file includes the sources by
absolute path). It is built three times: in a tree under a cache with ccache's base_dir at
the tree (as llamaspec builds its own trees), from a copy at another path and depth without
ccache, and from that copy again with ccache. All three must be byte-identical, hold no path
of this machine, and the third must come from ccache (hits across directories).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.engine import build, toolchain
from llamaspec.engine import reproducible as repro
from llamaspec.engine.profiles import Define

pytestmark = pytest.mark.integration

PROJECT = {
    "CMakeLists.txt": """cmake_minimum_required(VERSION 3.16)
project(t C CXX)
file(GLOB MODELS "models/*.cpp")
configure_file(gen.h.in gen.h)
add_library(models SHARED ${MODELS} core.c)
set_target_properties(models PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
set_source_files_properties(core.c PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
target_include_directories(models PRIVATE include ${CMAKE_BINARY_DIR})
""",
    "gen.h.in": "static inline const char * gen_where(void) { return __FILE__; }\n",
    "include/where.h": "#define WHERE __FILE__\nstatic const char * hdr = __FILE__;\n",
    "core.c": '#include "where.h"\n#include "gen.h"\n'
    "const char * core_where(void) { return WHERE; }\n"
    "const char * core_gen(void) { return gen_where(); }\n"
    "const char * core_hdr(void) { return hdr; }\n",
    "models/a.cpp": 'extern "C" const char * a_where() { return __FILE__; }\n',
    "models/b.cpp": 'extern "C" const char * b_where() { return __FILE__; }\n',
}


def _stats(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(
        ["ccache", "--print-stats"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {k: int(v) for k, v in re.findall(r"^(\w+)\t(\d+)$", out, re.M)}


def test_ccache_and_plain_builds_in_other_trees_are_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CCACHE_DISABLE", raising=False)
    if not shutil.which("ccache"):
        pytest.fail("ccache is not installed; .ci/run installs it (apt-get install ccache)")
    tools, console = toolchain.detect(), Console()
    tree_a = tmp_path / "cache" / "sources" / "t-pypi"
    for name, text in PROJECT.items():
        (tree_a / name).parent.mkdir(parents=True, exist_ok=True)
        (tree_a / name).write_text(text)
    tree_b = tmp_path / "elsewhere" / "a" / "deeper" / "copy"
    shutil.copytree(tree_a, tree_b)
    base = {"CCACHE_DIR": str(tmp_path / "ccache")}

    def run(tree: Path, bdir: Path, env: dict[str, str], relative: bool) -> bytes:
        maps = repro.path_maps(tree, bdir, relative)
        defines = [
            Define("CMAKE_BUILD_TYPE", "Release", "test"),
            Define("CMAKE_C_COMPILER_LAUNCHER", "ccache", "test"),
            Define("CMAKE_CXX_COMPILER_LAUNCHER", "ccache", "test"),
        ]
        defines = repro.with_flags(defines, repro.flag_defines(defines, maps, {}))
        bdir.mkdir(parents=True)
        build.configure(tree, bdir, defines, tools, console, env)
        build.compile_target(bdir, "models", tools, None, console, env)
        return (bdir / "libmodels.so").read_bytes()

    build_a = tree_a / build.BUILD_SUBDIR / "t-0123"
    a = run(tree_a, build_a, {**base, "CCACHE_BASEDIR": str(tree_a)}, True)
    build_b = tmp_path / "b"
    b = run(tree_b, build_b, {**base, "CCACHE_DISABLE": "1"}, False)
    assert a == b
    for needle in repro.needles(tmp_path, tree_a, tree_b, build_a, build_b):
        assert needle.encode() not in a, needle
    for name in (b"models/a.cpp", b"include/where.h", b"core.c"):
        assert name in a  # the names stay, relative to the tree
    assert b"../" not in a and b"./gen.h" not in a and b"gen.h" in a
    # the copy again, with ccache: core.c comes from the cache filled by the first tree (the
    # unity file names its sources by absolute path, so its text differs per tree: a miss)
    before = _stats(base)
    env_c = {**base, "CCACHE_BASEDIR": str(tree_b)}
    c = run(tree_b, tree_b / build.BUILD_SUBDIR / "t-4567", env_c, True)
    after = _stats(base)
    assert c == a
    hits = sum(after[k] - before.get(k, 0) for k in ("direct_cache_hit", "preprocessed_cache_hit"))
    assert hits >= 1, (before, after)
