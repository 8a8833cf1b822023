"""Backend builds that must stop at preflight here, and profiles checked against real trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llamaspec import config
from llamaspec.engine import preflight, sources, toolchain
from llamaspec.engine import profiles as flags

from helpers import llamaspec

pytestmark = pytest.mark.integration


def _text(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


def test_cuda_build_stops_at_preflight_with_the_fix(tmp_path: Path) -> None:
    """This machine has nvcc without cuBLAS (or no CUDA at all): no configure, a clear fix."""
    proc = llamaspec("build", "--backend", "cuda", "--source", "pypi", "--dist", str(tmp_path))
    text = _text(proc)
    nvcc = preflight.find_nvcc([])
    if nvcc and not any(
        c.name.startswith("cuBLAS") and not c.ok for c in preflight.cuda_checks(None, [])
    ):
        pytest.fail("this machine has a complete CUDA toolkit; the test expects none")
    assert proc.returncode == 2, text
    assert "Preflight for the cuda backend failed, so nothing was configured" in text
    assert "configure:" not in proc.stdout and not list(tmp_path.iterdir())
    if nvcc:
        assert "[cuBLAS headers] no cublas_v2.h" in text
        assert "apt-get install libcublas-dev-" in text
    else:
        assert "[nvcc]" in text and "apt-get install" in text


def test_cuda_archs_are_checked_against_nvcc(tmp_path: Path) -> None:
    proc = llamaspec("build", "--backend", "cuda", "--cuda-arch", "61;86", "--dist", str(tmp_path))
    text = _text(proc)
    assert proc.returncode == 2, text
    if preflight.find_nvcc([]):
        assert "cannot compile for sm_61" in text and "86" in text
    bad = llamaspec("build", "--backend", "cuda", "--cuda-arch", "sm_86", "--dist", str(tmp_path))
    assert bad.returncode == 2 and "'sm_86' is not one" in _text(bad)


def test_doctor_names_every_backend_and_exits_2_for_a_named_failing_one() -> None:
    proc = llamaspec("doctor", "--no-tree")
    assert proc.returncode == 0, _text(proc)
    assert "doctor: llama.cpp: cpu ready" in proc.stdout
    if not shutil.which("glslc"):
        named = llamaspec("doctor", "--no-tree", "--backend", "vulkan")
        assert named.returncode == 2 and "apt-get install glslc" in _text(named)
    if preflight.find_nvcc([]):
        named = llamaspec("doctor", "--no-tree", "--backend", "cuda")
        assert named.returncode == 2 and "cuBLAS" in _text(named)


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_every_profile_and_variant_define_is_an_option_of_the_pinned_tree(engine: str) -> None:
    tree = sources.fetch(config.load_engines()[engine], None, "pypi", None, lambda _m: None).path
    known = flags.tree_options(tree)
    tables = [flags.profile(engine, b) for b in ("cpu", "cuda", "vulkan")]
    tables += [t for (e, _), t in flags.VARIANTS.items() if e == engine]
    for table in tables:
        for name, flag in table.items():
            assert flag.only_if_declared or name in known or name.startswith("CMAKE_"), name
    assert preflight.cmake_minimum(tree, "cuda") <= preflight._version(
        toolchain.detect().cmake_version
    )
