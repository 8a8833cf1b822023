"""engines.yaml: each engine's source, pin, server target and CLI dialect; and the CUDA
toolkit wheels the lock pins (`cuda_toolkit` in llamaspec.lock)."""

from __future__ import annotations

from datetime import date
from itertools import pairwise
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

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


class HistoryPin(Frozen):
    """Another commit of an engine that llamaspec knows how to fetch (`maint health` builds
    them): an older upstream build from the PyPI sdist that vendors it, or an ik commit
    fetched by git or from a local mirror (`--source local --source-dir MIRROR`).

    `date`: the commit date where the history is at hand (ik); for a PyPI pin, the date of
    the release commit that vendors it (the sdist carries no history of the vendored commit,
    which is no newer than that)."""

    pin: FullSha
    date: date
    note: str = Field(min_length=1)
    pypi: PypiMirror | None = None


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
    history: tuple[HistoryPin, ...] = ()

    @field_validator("history")
    @classmethod
    def _history_in_order(cls, value: tuple[HistoryPin, ...]) -> tuple[HistoryPin, ...]:
        seen: set[str] = set()
        for before, after in pairwise(value):
            if after.date < before.date:
                raise ValueError(
                    f"history is listed oldest first: {after.pin[:12]} ({after.date}) comes "
                    f"after {before.pin[:12]} ({before.date})"
                )
        for entry in value:
            if entry.pin in seen:
                raise ValueError(f"history lists {entry.pin} twice")
            seen.add(entry.pin)
        return value


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


def known_pins(engine: Engine) -> tuple[HistoryPin, ...]:
    """The default pin and the history pins, oldest first (the default pin once, as a
    HistoryPin with the note `default pin` and the engine's own PyPI mirror)."""
    default = HistoryPin(
        pin=engine.pin, date=engine.pin_date, note=f"default pin ({engine.tag})", pypi=engine.pypi
    )
    rest = [h for h in engine.history if h.pin != engine.pin]
    return tuple(sorted([default, *rest], key=lambda h: h.date))


def record_for(engine: Engine, pin: str) -> Engine | None:
    """The engine record as it would read with `pin` as its pin: the engine itself for the
    default pin, a copy with the history entry's date and PyPI mirror for a history pin (no
    build number: the patch queue then judges patches by their date or their diff), None
    for a pin engines.yaml does not list."""
    if pin == engine.pin:
        return engine
    entry = next((h for h in engine.history if h.pin == pin), None)
    if entry is None:
        return None
    tag = f"{entry.pypi.package}=={entry.pypi.version}" if entry.pypi else f"main@{entry.date}"
    return engine.model_copy(
        update={
            "pin": entry.pin,
            "tag": tag,
            "pin_date": entry.date,
            "build_number": None,
            "pypi": entry.pypi,
        }
    )


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
