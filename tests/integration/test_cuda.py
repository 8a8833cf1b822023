"""CUDA without a GPU: the pinned PyPI toolkit, a real compile of CUDA sources of both
engines, and the bundling of the CUDA runtime libraries an artifact links.

The compile check downloads the pinned CUDA 13 wheels once (about 525 MB) into the shared
llamaspec cache, configures each engine's CUDA profile for sm_90 and compiles the sources
`llamaspec.engine.cuda.check.KERNELS` names; a compile error fails the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.engine import build as build_stage
from llamaspec.engine import preflight, toolchain
from llamaspec.engine.cuda import check as cuda_check
from llamaspec.engine.cuda import elf
from llamaspec.errors import LlamaspecError

from helpers import llamaspec

pytestmark = pytest.mark.integration


CHECK = ("cuda-compile-check", "--source", "pypi", "--cuda-toolkit", "pypi", "--cuda-arch", "90")


@pytest.fixture(scope="module")
def cmake_path(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PATH with a CMake that knows CUDA's C++20 dialect (≥ 3.26) first, where this
    machine's is older: installed from PyPI as a user would (`pip install -U cmake`)."""
    have = preflight._version(toolchain.detect().cmake_version)
    if have >= preflight.CUDA20_CMAKE:
        return {}
    venv = tmp_path_factory.mktemp("cmake") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "cmake>=3.26,<4"]
    subprocess.run(pip, check=True, capture_output=True)
    return {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def test_ik_cuda_needs_a_cmake_that_knows_cuda_cxx20(cmake_path: dict[str, str]) -> None:
    """ik_llama.cpp compiles CUDA as C++20; Debian 12's CMake 3.25 cannot: preflight says so."""
    if not cmake_path:
        pytest.fail("this machine's cmake already knows CUDA20; the test expects Debian 12's")
    proc = llamaspec(*CHECK, "--engine", "ik_llama.cpp")
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert "the tree needs ≥ 3.26: it compiles CUDA as C++20" in text
    assert "pip install -U cmake" in text and "configure:" not in text


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_cuda_sources_compile_with_the_pypi_toolkit(
    engine: str, tmp_path: Path, cmake_path: dict[str, str]
) -> None:
    out = tmp_path / "check.json"
    proc = llamaspec(*CHECK, "--engine", engine, "--out", str(out), env=cmake_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    record = json.loads(out.read_text())
    assert record["toolkit"].startswith("PyPI wheels nvidia-cuda-nvcc==13.0.88")
    assert [o["source"] for o in record["objects"]] == [
        k.source for k in cuda_check.KERNELS[engine]
    ]
    print(f"cuda check {engine}: configure {record['configure_seconds']} s, "
          f"compile {record['compile_seconds']} s: {record['objects']}")  # fmt: skip


def _cc(args: list[str]) -> None:
    subprocess.run(["cc", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def fake_cuda(tmp_path: Path) -> tuple[Path, Path]:
    """A toolkit lib/ with libcudart.so.13 and libcublas.so.13 (libcublas needs cudart),
    and an artifact tree whose bin/llama-server needs libcublas, RUNPATH $ORIGIN/../lib.
    Like NVIDIA's own, the libraries find each other through RUNPATH $ORIGIN."""
    lib = tmp_path / "toolkit" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "cudart.c").write_text("int cudart_version(void) { return 13; }\n")
    (tmp_path / "cublas.c").write_text(
        "int cudart_version(void);\nint cublas_version(void) { return cudart_version(); }\n"
    )
    (tmp_path / "main.c").write_text(
        "int cublas_version(void);\nint main(void) { return cublas_version() - 13; }\n"
    )
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-o", str(lib / "libcudart.so.13"),
         str(tmp_path / "cudart.c")])  # fmt: skip
    (lib / "libcudart.so").symlink_to("libcudart.so.13")
    _cc(["-shared", "-fPIC", "-Wl,-soname,libcublas.so.13", "-o", str(lib / "libcublas.so.13"),
         str(tmp_path / "cublas.c"), f"-L{lib}", "-lcudart", "-Wl,-rpath,$ORIGIN"])  # fmt: skip
    tree = tmp_path / "artifact"
    (tree / "bin").mkdir(parents=True)
    (tree / "lib").mkdir()
    _cc(["-o", str(tree / "bin" / "llama-server"), str(tmp_path / "main.c"),
         f"-L{lib}", "-l:libcublas.so.13", "-Wl,-rpath,$ORIGIN/../lib"])  # fmt: skip
    return tree, lib


def test_bundled_cuda_libraries_resolve_inside_the_artifact(fake_cuda) -> None:
    tree, lib = fake_cuda
    assert elf.unresolved(tree) == {"bin/llama-server": ["libcublas.so.13 not found"]}
    bundled = build_stage.bundle_runtime(tree, lib)
    assert sorted(b["name"] for b in bundled) == ["libcublas.so.13", "libcudart.so.13"]
    assert all(len(b["sha256"]) == 64 for b in bundled)
    assert elf.unresolved(tree) == {}
    moved = tree.parent / "moved"
    shutil.move(tree, moved)  # relocatable: the RUNPATH is $ORIGIN-relative
    assert subprocess.run([str(moved / "bin" / "llama-server")], check=False).returncode == 0


def test_a_library_the_toolkit_lacks_stops_the_install(fake_cuda) -> None:
    tree, lib = fake_cuda
    (lib / "libcudart.so.13").unlink()
    with pytest.raises(LlamaspecError) as err:
        build_stage.bundle_runtime(tree, lib)
    assert "would not run with only a driver installed" in err.value.message
    # not found, or found only outside the artifact (where a system toolkit is installed)
    assert "libcudart.so.13 not found" in err.value.message or (
        "libcudart.so.13 from" in err.value.message and "outside the artifact" in err.value.message
    )
