"""Session-wide fixtures: one real upstream build (with smoke) shared by every integration test."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaspec.engine.artifact import Artifact, load_artifact
from llamaspec.models.embedded import embedded_model

from helpers import UPSTREAM_VARIANT, llamaspec


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The embedded Gemma 3 270M Q4_K_M GGUF (sha256-verified)."""
    return embedded_model()


def _build(engine: str, dist: Path, *extra: str) -> tuple[Artifact, str]:
    """`llamaspec build` of an engine at its default pin from the PyPI mirror, with smoke."""
    proc = llamaspec("build", "--engine", engine, "--source", "pypi", "--dist", str(dist), *extra)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    ids = [p.name for p in dist.iterdir() if (p / "manifest.json").is_file()]
    assert len(ids) == 1, output
    return load_artifact(dist, ids[0]), output


@pytest.fixture(scope="session")
def upstream_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, str]:
    return _build("llama.cpp", tmp_path_factory.mktemp("dist"), *UPSTREAM_VARIANT)


@pytest.fixture(scope="session")
def upstream_artifact(upstream_build: tuple[Artifact, str]) -> Artifact:
    return upstream_build[0]


@pytest.fixture(scope="session")
def upstream_stock_artifact(
    upstream_build: tuple[Artifact, str], tmp_path_factory: pytest.TempPathFactory
) -> Artifact:
    """The same pin and variant without the project's patches (`--no-default-patches`): the
    stock server each patch is proven against. Built after the patched one, so ccache has
    every object the patches do not touch."""
    dist = tmp_path_factory.mktemp("dist-stock")
    return _build("llama.cpp", dist, *UPSTREAM_VARIANT, "--no-default-patches", "--no-smoke")[0]


@pytest.fixture(scope="session")
def ik_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, str]:
    """The `fast-build` variant: IQK flash-attention CPU kernels for f16/q8_0/q8_KV/q6_0 K/V
    caches only (the tests use f16), not q4_0/q4_1/iq4_nl: minutes less on 2 cores."""
    return _build("ik_llama.cpp", tmp_path_factory.mktemp("dist-ik"), "--variant", "fast-build")


@pytest.fixture(scope="session")
def vulkan_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, str]:
    """`doctor --fix-vulkan-headers` (used only where the system headers are too old), then
    `build --backend vulkan --variant rpc`; the lavapipe smoke is its own (last) test."""
    fix = llamaspec("doctor", "--backend", "vulkan", "--no-tree", "--fix-vulkan-headers")
    assert fix.returncode == 0, fix.stdout + fix.stderr
    dist = tmp_path_factory.mktemp("dist-vulkan")
    proc = llamaspec(
        "build",
        "--backend",
        "vulkan",
        "--variant",
        "rpc",
        "--source",
        "pypi",
        "--dist",
        str(dist),
        "--no-smoke",
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    ids = [p.name for p in dist.iterdir() if (p / "manifest.json").is_file()]
    assert len(ids) == 1, output
    return load_artifact(dist, ids[0]), output
