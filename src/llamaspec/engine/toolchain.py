"""Preflight: find the build tools and record their versions (they go into the artifact id)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from llamaspec import procs
from llamaspec.errors import LlamaspecError


@dataclass(frozen=True)
class Toolchain:
    cmake: str
    cmake_version: str
    ninja: str
    ninja_version: str
    cxx: str
    cxx_version: str
    ccache: str | None


def _first_line(cmd: list[str]) -> str:
    out = procs.run(cmd, timeout=60, check=False, what=f"`{' '.join(cmd)}`")
    lines = (out.stdout or out.stderr or "").strip().splitlines()
    return lines[0] if lines else ""


def _require(tool: str, fix: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise LlamaspecError(f"{tool} is not installed; llamaspec needs it to build. {fix}")
    return path


def detect() -> Toolchain:
    """Find cmake, ninja, a C++ compiler and (optionally) ccache, or say how to install them."""
    cmake = _require(
        "cmake", "Install it (Debian/Ubuntu: `apt-get install cmake`, or `pip install cmake`)."
    )
    ninja = _require(
        "ninja",
        "Install it (Debian/Ubuntu: `apt-get install ninja-build`, or `pip install ninja`).",
    )
    cxx_name = os.environ.get("CXX", "c++")
    cxx = shutil.which(cxx_name)
    if not cxx:
        raise LlamaspecError(
            f"No C++ compiler ({cxx_name}) found. Install one (Debian/Ubuntu: "
            "`apt-get install build-essential`) or set CXX to its path."
        )
    version = _first_line([cmake, "--version"]).removeprefix("cmake version ").strip()
    return Toolchain(
        cmake=cmake,
        cmake_version=version,
        ninja=ninja,
        ninja_version=_first_line([ninja, "--version"]),
        cxx=cxx,
        cxx_version=_first_line([cxx, "--version"]),
        ccache=shutil.which("ccache"),
    )
