"""engines.yaml: each engine's source, pin, server target and CLI dialect; and the CUDA
toolkit wheels the lock pins (`cuda_toolkit` in llamaspec.lock)."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import Field

from llamaspec.config.loader import Frozen, FullSha, RelPath, Sha256, parse, read_yaml
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.paths import project_root

ENGINES = ("llama.cpp", "ik_llama.cpp")
Dialect = Literal["upstream", "upstream-legacy", "ik-legacy", "ik-spec-type"]


class PypiMirror(Frozen):
    """A PyPI source distribution that vendors an engine's exact commit."""

    package: str
    version: str
    sha256: Sha256
    subdir: RelPath


class Engine(Frozen):
    """One engine: where its source lives and how its server is built and spoken to."""

    name: str
    git_url: str
    pin: FullSha
    tag: str
    pin_date: date
    build_number: int | None = None
    server_target: str = "llama-server"
    server_dir: RelPath
    dialect: Dialect
    pypi: PypiMirror | None = None


class EnginesFile(Frozen):
    engines: dict[str, Engine]


def load_engines(root: Path | None = None) -> dict[str, Engine]:
    """engines.yaml → {name: Engine}; each entry's `name` comes from its key."""
    path = (root or project_root()) / "engines.yaml"
    raw = read_yaml(path)
    if isinstance(raw, dict) and isinstance(raw.get("engines"), dict):
        raw = {
            **raw,
            "engines": {
                k: {"name": k, **v} if isinstance(v, dict) else v for k, v in raw["engines"].items()
            },
        }
    parsed = parse(EnginesFile, raw, str(path))
    for name in parsed.engines:
        if name not in ENGINES:
            raise LlamaspecError(
                f"{path} defines engine {name!r}, which llamaspec does not know how to build."
                f"{did_you_mean(name, ENGINES)} Known engines: {', '.join(ENGINES)}."
            )
    return dict(parsed.engines)


class CudaWheelFile(Frozen):
    """One platform's file of a pinned CUDA wheel (llamaspec.lock `cuda_toolkit`)."""

    file: str
    sha256: Sha256
    size: int = Field(gt=0)
    unpacked: int = Field(gt=0)  # bytes once unzipped (the disk check adds these up)


class CudaWheel(Frozen):
    name: str
    version: str
    files: dict[str, CudaWheelFile]  # machine (`x86_64`) → its wheel


class CudaToolkitLock(Frozen):
    """The PyPI wheels a CUDA toolkit root is assembled from, and the driver it needs."""

    release: str
    driver_min: int = Field(gt=0)  # the oldest NVIDIA driver that runs this CUDA major
    wheels: tuple[CudaWheel, ...]
