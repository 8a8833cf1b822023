"""A CUDA toolkit root: the Toolkit record a build points CMake at, and what a root must hold.

A root is complete when it has every piece in PIECES (nvcc, CUDA headers, cudart, NVVM and
cuBLAS); its release is the one its nvcc reports. Which root a build uses is choice.py's
job; assembling one from PyPI's wheels is assemble.py's.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import procs
from llamaspec.engine.profiles import Define
from llamaspec.errors import LlamaspecError

# The oldest CUDA each engine's CUDA backend builds with at its default pin (llama.cpp's
# docs/build.md shows CUDA 11.7 as the oldest toolkit it still builds with).
CUDA_MIN = (11, 7)
# Files every toolkit root must have: (what, candidate paths relative to the root).
PIECES: dict[str, tuple[str, ...]] = {
    "nvcc": ("bin/nvcc",),
    "CUDA headers": ("include/cuda_runtime.h", "targets/x86_64-linux/include/cuda_runtime.h"),
    "cudart": ("lib/libcudart.so", "lib64/libcudart.so", "targets/x86_64-linux/lib/libcudart.so"),
    "NVVM (cicc)": ("nvvm/bin/cicc",),
    "cuBLAS headers": ("include/cublas_v2.h", "targets/x86_64-linux/include/cublas_v2.h"),
    "cuBLAS libraries": ("lib/libcublas.so", "lib64/libcublas.so"),
}


@dataclass(frozen=True)
class Toolkit:
    """A complete toolkit root: what CMake is pointed at."""

    root: Path
    version: tuple[int, ...]
    origin: str  # how it was found or made, for preflight and the manifest
    key: str  # what the artifact id sees instead of this machine's path

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def lib_dir(self) -> Path:
        """Where the runtime libraries lie: lib/, lib64/ (a system toolkit's) or targets/."""
        for rel in ("lib", "lib64", f"targets/{machine()}-linux/lib"):
            if _has(self.root, f"{rel}/libcudart.so"):
                return self.root / rel
        return self.root / "lib"

    def link_dirs(self) -> list[Path]:
        """The toolkit's library folders (lib/, lib64/), real paths, each once."""
        out: list[Path] = []
        for d in (self.lib_dir, self.root / "lib", self.root / "lib64"):
            if d.is_dir() and d.resolve() not in out:
                out.append(d.resolve())
        return out

    @property
    def release(self) -> str:
        return ".".join(map(str, self.version[:2]))

    def defines(self) -> list[Define]:
        """CMake defines that make the build use this toolkit (paths keyed by version)."""
        origin = f"llamaspec (CUDA toolkit: {self.origin})"
        out = [
            Define("CMAKE_CUDA_COMPILER", str(self.nvcc), origin, f"nvcc {self.key}"),
            Define("CUDAToolkit_ROOT", str(self.root), origin, f"toolkit {self.key}"),
        ]
        # only $ORIGIN/../lib in the RUNPATH: the bundled CUDA libraries, not the toolkit's
        # absolute path on the build machine
        relocatable = "llamaspec (relocatable dist/: bundled CUDA libraries)"
        out += [
            Define("CMAKE_BUILD_WITH_INSTALL_RPATH", "ON", relocatable),
            Define("CMAKE_INSTALL_RPATH", "$ORIGIN/../lib", relocatable),
        ]
        # with that RUNPATH the linker cannot follow a library's own CUDA dependencies
        # (ik links cuBLAS into libggml.so) to a toolkit outside the system paths
        link = ":".join(str(d) for d in self.link_dirs())
        if link:
            linked = "llamaspec (link against the toolkit's libraries)"
            for name in ("CMAKE_EXE_LINKER_FLAGS", "CMAKE_SHARED_LINKER_FLAGS"):
                out.append(
                    Define(name, f"-Wl,-rpath-link,{link}", linked, f"rpath-link {self.key}")
                )
        if not driver_library(self.root):
            # no libcuda.so to link (wheels ship no driver stub): ggml's CUDA pool then uses
            # cudaMalloc instead of the driver's virtual-memory API
            out.append(Define("GGML_CUDA_NO_VMM", "ON", origin))
        return out


def driver_library(root: Path) -> Path | None:
    """libcuda.so to link against: the toolkit's stub or an installed driver's."""
    for cand in (
        root / "lib" / "stubs" / "libcuda.so",
        root / "lib64" / "stubs" / "libcuda.so",
        Path("/usr/lib/x86_64-linux-gnu/libcuda.so"),
        Path("/usr/lib64/libcuda.so"),
    ):
        if cand.exists():
            return cand
    return None


def missing(root: Path) -> list[str]:
    """The PIECES a root lacks (empty: complete)."""
    return [what for what, paths in PIECES.items() if not any(_has(root, p) for p in paths)]


def _has(root: Path, rel: str) -> bool:
    path = root / rel
    if path.exists():
        return True
    if not path.name.endswith(".so") or not path.parent.is_dir():
        return False
    return any(path.parent.glob(path.name + ".*"))  # versioned only (libcudart.so.13)


def nvcc_version(nvcc: Path) -> tuple[int, ...]:
    try:
        proc = procs.run([str(nvcc), "--version"], timeout=60, check=False, what="nvcc")
    except LlamaspecError:
        return ()
    m = re.search(r"release (\d+)\.(\d+)", proc.stdout + proc.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def dotted(v: Sequence[int] | None) -> str:
    return ".".join(map(str, v or ()))


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)
