"""llamaspec.lock: the full SHAs a build used (pins and patch commits), committed.

Two files: the project's (the checkout's, written only by maintainers' commands such as
`nox -s lock` and the bump, or the one shipped in the package) and this user's, in the user
data dir. `models pull` records what it verified in the user's lock, never in the
checkout's, so no user command changes a tracked file. `load` reads both: the project's pins
win for the project's models, the user's for the user's own models (the user config dir's
models.yaml) and for models the project's lock does not pin.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from llamaspec.config import FULL_SHA, Engine, PatchEntry, load_yaml_text
from llamaspec.errors import LlamaspecError
from llamaspec.paths import is_packaged, user_config, user_data, writable_root

LOCK = "llamaspec.lock"
# `cuda_toolkit`: the PyPI wheels (version, sha256, size) a CUDA toolkit is assembled from.
SECTIONS = ("engines", "patches", "models", "cuda_toolkit")
HEADER = (
    "# Written by `nox -s lock`: the exact commits llamaspec builds use. Patch commits are\n"
    "# applied in order, each as its diff against its first parent. An empty list means\n"
    "# the entry could not be resolved here (see `nox -s lock` output). `models` records the\n"
    "# hub commit and sha256 of every model file on its first verified download.\n"
    "# `cuda_toolkit` pins the PyPI wheels `--cuda-toolkit pypi` assembles a toolkit from.\n"
)
USER_HEADER = (
    "# This user's llamaspec lock, written by `llamaspec models pull`: the hub commit and\n"
    "# sha256 of every model file it verified, read beside the project's llamaspec.lock.\n"
    "# Never part of a checkout.\n"
)


def user_lock() -> Path:
    """This user's lock, in the user data dir (LLAMASPEC_DATA)."""
    return user_data() / LOCK


def _read(path: Path) -> dict:
    if not path.is_file():
        return {key: {} for key in SECTIONS}
    data = load_yaml_text(path.read_text(), str(path)) or {}
    return {key: data.get(key) or {} for key in SECTIONS}


def user_handles() -> frozenset[str]:
    """The models the user's own models.yaml (user config dir) defines, whose pins belong in
    the user's lock. An unreadable file counts as none here: the commands that use models
    read it themselves and say what is wrong with it."""
    try:
        path = user_config() / "models.yaml"
        raw = load_yaml_text(path.read_text(), str(path)) if path.is_file() else None
    except (LlamaspecError, OSError, UnicodeDecodeError):
        return frozenset()
    models = raw.get("models") if isinstance(raw, dict) else None
    return frozenset(models) if isinstance(models, dict) else frozenset()


def load(root: Path) -> dict:
    """The lock the commands read: the project's with the user's beside it (the user's pins
    win for the user's own models and fill in models the project does not pin; for an
    installed llamaspec, the user's lock holds everything it recorded)."""
    data = _read(root / LOCK)
    if is_packaged(root):  # an installed llamaspec records everything under the user data dir
        mine = _read(user_lock())
        for key in SECTIONS:
            if mine[key]:
                data[key] = {**data[key], **mine[key]} if key == "models" else mine[key]
        return data
    own = user_handles()
    for handle, record in _read(user_lock())["models"].items():
        if handle not in data["models"] or handle in own:
            data["models"][handle] = record
    return data


def load_project(root: Path) -> dict:
    """What `save` writes back, for the commands that edit the lock (`nox -s lock`, bump):
    a checkout's llamaspec.lock alone, never merged with a user's pins."""
    return load(root) if is_packaged(root) else _read(root / LOCK)


def save(root: Path, lock: dict) -> Path:
    """Write the project's lock: the checkout's (maintainers' commands), or for an installed
    llamaspec the user's (the package is read-only)."""
    path = writable_root(root) / LOCK
    lock = {k: v for k, v in lock.items() if v or k != "models"}
    return _write(path, HEADER, lock)


def _write(path: Path, header: str, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LOCK}.tmp")
    tmp.write_text(header + yaml.safe_dump(data, sort_keys=True))
    tmp.replace(path)
    return path


def record_model(root: Path, handle: str, record: dict) -> Path | None:
    """Record a model's pins after its first verified download, in the user's lock (the
    checkout's is the maintainers'). Returns the file written, None when the lock already
    read this record."""
    if load(root)["models"].get(handle) == record:
        return None
    path = user_lock()
    raw = load_yaml_text(path.read_text(), str(path)) if path.is_file() else None
    data = raw if isinstance(raw, dict) else {}
    models = data.get("models") if isinstance(data.get("models"), dict) else {}
    data["models"] = {**models, handle: record}
    return _write(path, USER_HEADER, data)


def patch_commits(entry: PatchEntry, lock: dict) -> tuple[str, ...] | None:
    """Full SHAs for a commit/PR patch: the catalog's when full, else the lock's (or None)."""
    if entry.source.commits and all(FULL_SHA.match(c) for c in entry.source.commits):
        locked = lock["patches"].get(entry.id)
        if locked and list(locked) != list(entry.source.commits):
            raise LlamaspecError(
                f"llamaspec.lock lists {locked} for patch {entry.id!r}, but patches/series.yaml "
                f"says {list(entry.source.commits)}. Run `llamaspec lock` to bring the lock up to "
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
            f"{locked}. Run `llamaspec lock` after changing a pin."
        )
