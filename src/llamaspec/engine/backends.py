"""Backends: which ones exist, their GPU-arch choice, and defines that contradict them."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llamaspec.engine.profiles import Define, cmake_bool
from llamaspec.errors import LlamaspecError, choose

BACKENDS = ("cpu", "cuda", "vulkan")

# CMake switches that turn a ggml backend on, and the llamaspec backend that owns them.
SWITCHES = {
    "GGML_CUDA": "cuda",
    "GGML_VULKAN": "vulkan",
    "GGML_HIP": "hip",
    "GGML_HIPBLAS": "hip",
    "GGML_MUSA": "musa",
    "GGML_SYCL": "sycl",
    "GGML_METAL": "metal",
    "GGML_OPENCL": "opencl",
    "GGML_WEBGPU": "webgpu",
    "GGML_KOMPUTE": "kompute",
    "GGML_CANN": "cann",
}
_ARCH = re.compile(r"^(\d{2,3})([af]?)(-real|-virtual)?$")
ARCH_KEYWORDS = ("native", "all", "all-major")


def check_backend(name: str) -> str:
    return choose("backend", name, BACKENDS)


def parse_cuda_arch(text: str, origin: str = "--cuda-arch") -> tuple[str, ...]:
    """`native`, `all`, `all-major` or a list like `86;89` / `86,89` / `90a-real`.

    Returns the entries; each numeric one is an SM version CMake understands."""
    raw = text.strip()
    if raw in ARCH_KEYWORDS:
        return (raw,)
    parts = [p.strip() for p in re.split(r"[;,\s]+", raw) if p.strip()]
    bad = [p for p in parts if not _ARCH.match(p)]
    if not parts or bad:
        what = ", ".join(repr(b) for b in bad) or "nothing"
        raise LlamaspecError(
            f"{origin} {text!r} is not a list of CUDA architectures ({what} is not one). Give "
            "'native' (the GPU of this machine), 'all', 'all-major', or SM numbers such as "
            "'86' or '86;89' (optionally with -real/-virtual, e.g. '90a-real')."
        )
    return tuple(parts)


def cuda_arch_define(archs: Sequence[str], origin: str) -> Define:
    return Define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs), origin)


def sm_numbers(archs: Sequence[str]) -> list[int]:
    """The SM numbers in an arch list (keywords give none)."""
    return [int(m.group(1)) for a in archs if (m := _ARCH.match(a))]


def check_conflicts(backend: str, defines: Sequence[Define]) -> None:
    """A define that switches another backend on, or this one off, is a conflict."""
    problems = []
    for d in defines:
        owner = SWITCHES.get(d.name)
        if owner is None:
            continue
        on = cmake_bool(d.value)
        if on is None:
            raise LlamaspecError(
                f"{d.name}={d.value} (from {d.origin}) is neither ON nor OFF. CMake would read "
                f"{d.value!r} as true and build the {owner} backend, which is rarely what was "
                f"meant; write {d.name}=ON or {d.name}=OFF."
            )
        if on and owner != backend:
            problems.append(
                f"{d.name}={d.value} (from {d.origin}) turns on the {owner} backend but the "
                f"build is for --backend {backend}"
                + (f"; use --backend {owner} instead" if owner in BACKENDS else "")
            )
        elif not on and owner == backend:
            problems.append(
                f"{d.name}={d.value} (from {d.origin}) turns off the {backend} backend that "
                f"--backend {backend} builds"
            )
    if problems:
        raise LlamaspecError(
            "Conflicting backends: "
            + "; ".join(problems)
            + ". One build has one GPU backend; nothing was configured."
        )
