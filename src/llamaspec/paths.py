"""Where llamaspec keeps its caches and outputs."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from llamaspec.errors import LlamaspecError

REPO_FILES = ("engines.yaml", "models.yaml", "patches/series.yaml")


def cache_dir() -> Path:
    """The user cache dir (override with LLAMASPEC_CACHE)."""
    env = os.environ.get("LLAMASPEC_CACHE")
    path = Path(env) if env else Path(platformdirs.user_cache_dir("llamaspec"))
    where = f"LLAMASPEC_CACHE={env}" if env else f"the cache directory {path}"
    return writable_dir(path, where, "set LLAMASPEC_CACHE to a writable directory")


def writable_dir(path: Path, what: str, fix: str) -> Path:
    """`path` as a directory llamaspec can write into (created if missing), or one paragraph."""
    if path.exists() and not path.is_dir():
        raise LlamaspecError(f"{what} is a file, not a directory; {fix}.")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LlamaspecError(
            f"{what} cannot be created ({exc.strerror or exc}: {exc.filename or path}); {fix}."
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise LlamaspecError(f"{what} is not writable by this user; {fix}.")
    return path


def project_root(start: Path | None = None) -> Path:
    """The llamaspec checkout holding engines.yaml (override with LLAMASPEC_ROOT)."""
    env = os.environ.get("LLAMASPEC_ROOT")
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "engines.yaml").is_file():
            return candidate
    packaged = Path(__file__).resolve().parents[2]
    if (packaged / "engines.yaml").is_file():
        return packaged
    return here
