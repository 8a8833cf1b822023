"""Backends: which ones exist and what each one is, in one place (`Backend`: where the weights
live, whether the CUDA toolkit builds it, what its images and containers need), their
GPU-arch choice, and defines that contradict them. Other floors ask a `Backend`'s fields;
they do not compare backend names."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llamaspec.engine.profiles import Define, cmake_bool
from llamaspec.errors import LlamaspecError, choose


@dataclass(frozen=True)
class Backend:
    """What llamaspec knows about one backend."""

    name: str
    # the weights live on a device, not in host memory: there is something to offload to,
    # and host memory bandwidth does not bound decoding
    gpu: bool
    # built with the CUDA toolkit: `--cuda-arch` and `--cuda-toolkit` apply, a toolkit is
    # resolved before the build, the build writes a CUDA report, a pull checks the NVIDIA
    # host, and image tags carry the toolkit's major (`cuda13`)
    cuda: bool = False
    # F32 decoding is batch-invariant here (established on the CPU backend only): the
    # smoke's F32 comparison gates the build
    batch_invariant_f32: bool = False
    # compiles its shader pipelines on first use (minutes on a software device): the smoke
    # asks for fewer tokens, and an image's server sees device 0 only
    compiles_pipelines: bool = False
    container_env: tuple[tuple[str, str], ...] = ()  # a container of its image needs these
    compose_service: Mapping[str, object] = field(default_factory=dict)  # compose additions
    run_device: str = ""  # what `docker run` needs to see the device

    def tag_name(self, cuda_major: str | int | None = None) -> str:
        """The backend as image tags spell it: `cuda13` for a CUDA build of toolkit 13."""
        return f"cuda{cuda_major}" if self.cuda and cuda_major else self.name


CPU = Backend("cpu", gpu=False, batch_invariant_f32=True)
CUDA = Backend(
    "cuda",
    gpu=True,
    cuda=True,
    run_device="--gpus all",
    compose_service={
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
                }
            }
        }
    },
)
VULKAN = Backend(
    "vulkan",
    gpu=True,
    compiles_pipelines=True,
    container_env=(("GGML_VK_VISIBLE_DEVICES", "0"),),
    compose_service={"devices": ["/dev/dri:/dev/dri"]},
    run_device="--device /dev/dri",
)
BY_NAME: Mapping[str, Backend] = {b.name: b for b in (CPU, CUDA, VULKAN)}
BACKENDS = tuple(BY_NAME)


def backend(name: str | None) -> Backend:
    """The backend called `name` (None: the CPU, as an artifact without one records);
    an unknown name is one paragraph."""
    return BY_NAME[check_backend(name or "cpu")]


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
