"""Where llamaspec keeps its caches and outputs."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

REPO_FILES = ("engines.yaml", "models.yaml", "patches/series.yaml")


def cache_dir() -> Path:
    """The user cache dir (override with LLAMASPEC_CACHE)."""
    env = os.environ.get("LLAMASPEC_CACHE")
    path = Path(env) if env else Path(platformdirs.user_cache_dir("llamaspec"))
    path.mkdir(parents=True, exist_ok=True)
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
