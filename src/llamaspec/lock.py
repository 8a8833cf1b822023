"""llamaspec.lock: the full SHAs a build used (pins and patch commits), committed."""

from __future__ import annotations

from pathlib import Path

import yaml

from llamaspec.config import FULL_SHA, Engine, PatchEntry, load_yaml_text
from llamaspec.errors import LlamaspecError
from llamaspec.paths import writable_root

LOCK = "llamaspec.lock"
# `cuda_toolkit`: the PyPI wheels (version, sha256, size) a CUDA toolkit is assembled from.
SECTIONS = ("engines", "patches", "models", "cuda_toolkit")


def load(root: Path) -> dict:
    # an installed llamaspec: what this user's pulls recorded, over the shipped lock
    path = writable_root(root) / LOCK
    if not path.is_file():
        path = root / LOCK
    if not path.is_file():
        return {key: {} for key in SECTIONS}
    data = load_yaml_text(path.read_text(), str(path)) or {}
    return {key: data.get(key) or {} for key in SECTIONS}


def save(root: Path, lock: dict) -> Path:
    path = writable_root(root) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Written by `nox -s lock`: the exact commits llamaspec builds use. Patch commits are\n"
        "# applied in order, each as its diff against its first parent. An empty list means\n"
        "# the entry could not be resolved here (see `nox -s lock` output). `models` records the\n"
        "# hub commit and sha256 of every model file on its first verified download.\n"
        "# `cuda_toolkit` pins the PyPI wheels `--cuda-toolkit pypi` assembles a toolkit from.\n"
    )
    lock = {k: v for k, v in lock.items() if v or k != "models"}
    tmp = path.with_name(f".{LOCK}.tmp")
    tmp.write_text(header + yaml.safe_dump(lock, sort_keys=True))
    tmp.replace(path)
    return path


def patch_commits(entry: PatchEntry, lock: dict) -> tuple[str, ...] | None:
    """Full SHAs for a commit/PR patch: the catalog's when full, else the lock's (or None)."""
    if entry.source.commits and all(FULL_SHA.match(c) for c in entry.source.commits):
        locked = lock["patches"].get(entry.id)
        if locked and list(locked) != list(entry.source.commits):
            raise LlamaspecError(
                f"llamaspec.lock lists {locked} for patch {entry.id!r}, but patches/series.yaml "
                f"says {list(entry.source.commits)}. Run `nox -s lock` to bring the lock up to "
                "date, or fix the catalog."
            )
        return tuple(entry.source.commits)
    locked = lock["patches"].get(entry.id)
    return tuple(locked) if locked else None


def check_pin(engine: Engine, pin: str, lock: dict) -> None:
    """A build of the default pin must match the lock's record of it."""
    locked = lock["engines"].get(engine.name)
    if locked and pin == engine.pin and locked != engine.pin:
        raise LlamaspecError(
            f"engines.yaml pins {engine.name} at {engine.pin}, but llamaspec.lock records "
            f"{locked}. Run `nox -s lock` after changing a pin."
        )
