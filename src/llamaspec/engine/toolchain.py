"""Preflight: find the build tools and record their versions (they go into the artifact id)."""

from __future__ import annotations

import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from llamaspec import procs
from llamaspec.engine.cuda.host import nvidia_smi
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


def machine() -> dict:
    """CPU model and core count (/proc/cpuinfo), and the GPUs nvidia-smi reports."""
    cpu, cores = platform.processor() or platform.machine(), os.cpu_count() or 0
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        names = re.findall(r"^model name\s*:\s*(.+)$", text, re.M)
        cpu = names[0].strip() if names else cpu
        cores = len(re.findall(r"^processor\s*:", text, re.M)) or cores
    except OSError:
        pass
    gpus: list[str] = []
    try:
        out = nvidia_smi(["--query-gpu=name,driver_version", "--format=csv,noheader"], 20)
    except LlamaspecError:
        out = None
    if out is not None and out.returncode == 0:
        gpus = [
            ", driver ".join(p.strip() for p in ln.split(","))
            for ln in out.stdout.splitlines()
            if ln.strip()
        ]
    desc = f"{cpu}, {cores} cores" + (f"; GPU: {'; '.join(gpus)}" if gpus else "; no GPU")
    return {"cpu": cpu, "cores": cores, "gpus": gpus, "description": desc}
