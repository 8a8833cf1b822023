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


def test_cuda_archs_are_refused_before_anything_is_downloaded(tmp_path: Path) -> None:
    """CUDA 13 (the pinned PyPI toolkit) starts at sm_75: sm_61 is named, nothing fetched."""
    env_cache = tmp_path / "cache"
    proc = llamaspec(
        "build", "--backend", "cuda", "--cuda-toolkit", "pypi", "--cuda-arch", "61;86",
        "--dist", str(tmp_path / "dist"), env={"LLAMASPEC_CACHE": str(env_cache)},
    )  # fmt: skip
    text = _text(proc)
    assert proc.returncode == 2, text
    assert "cannot compile for sm_61" in text and "Nothing was downloaded" in text
    assert not (env_cache / "cuda-wheels").exists() and not (tmp_path / "dist").exists()
    bad = llamaspec("build", "--backend", "cuda", "--cuda-arch", "sm_86", "--dist", str(tmp_path))
    assert bad.returncode == 2 and "'sm_86' is not one" in _text(bad)


def test_doctor_names_every_backend_and_exits_2_for_a_named_failing_one() -> None:
    proc = llamaspec("doctor", "--no-tree")
    assert proc.returncode == 0, _text(proc)
    assert "doctor: llama.cpp: cpu ready" in proc.stdout
    assert "CUDA toolkit" in proc.stdout and "NVIDIA driver" in proc.stdout
    if not shutil.which("glslc"):
        named = llamaspec("doctor", "--no-tree", "--backend", "vulkan")
        assert named.returncode == 2 and "apt-get install glslc" in _text(named)
    missing = llamaspec(
        "doctor", "--no-tree", "--backend", "cuda", "--cuda-toolkit", "/nonexistent"
    )
    assert missing.returncode == 2 and "no such directory" in _text(missing)


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
