"""Where llamaspec keeps its caches and outputs."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from llamaspec import env
from llamaspec.errors import LlamaspecError

REPO_FILES = ("engines.yaml", "models.yaml", "patches/series.yaml")


def cache_dir() -> Path:
    """The user cache dir (override with LLAMASPEC_CACHE)."""
    given = env.get(env.CACHE)
    path = Path(given) if given else Path(platformdirs.user_cache_dir("llamaspec"))
    where = f"LLAMASPEC_CACHE={given}" if given else f"the cache directory {path}"
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
    """Where the catalogs live: LLAMASPEC_ROOT, else the checkout holding engines.yaml (cwd or
    a parent), else this source tree, else the data installed with the package."""
    given = env.get(env.ROOT)
    if given:
        return Path(given).resolve()
    here = (start or Path.cwd()).resolve()
    found = checkout_of(here)
    if found is not None:
        return found
    source = Path(__file__).resolve().parents[2]
    if (source / "engines.yaml").is_file():
        return source
    if (packaged_data() / "engines.yaml").is_file():
        return packaged_data()
    return here


def checkout_of(here: Path) -> Path | None:
    """The llamaspec checkout holding `here` (the nearest engines.yaml upwards), or None."""
    for candidate in (here, *here.parents):
        if (candidate / "engines.yaml").is_file():
            return candidate
    return None


def packaged_data() -> Path:
    """The catalogs, recipes and patches shipped inside the wheel (read-only)."""
    return Path(__file__).resolve().parent / "data"


def is_packaged(root: Path) -> bool:
    return root.resolve() == packaged_data()


def user_data() -> Path:
    """The user data dir (override with LLAMASPEC_DATA): the lock, tuned recipes, artifacts
    and reports of an installed llamaspec used outside a checkout."""
    given = env.get(env.DATA)
    return Path(given) if given else Path(platformdirs.user_data_dir("llamaspec"))


def user_config() -> Path:
    """The user config dir (override with LLAMASPEC_CONFIG_DIR): the user's own
    `models.yaml` (models and pairs) and `recipes/*.yaml`, read over the project's. Only
    read: it need not be writable, but must be a readable directory where it exists."""
    given = env.get(env.CONFIG_DIR)
    path = Path(given) if given else Path(platformdirs.user_config_dir("llamaspec"))
    what = f"The user config directory {path}" + (" (LLAMASPEC_CONFIG_DIR)" if given else "")
    fix = "point LLAMASPEC_CONFIG_DIR at a directory you can read (llamaspec never writes there)"
    if given and not path.exists():  # set by hand: a typo would hide the user's pairs
        raise LlamaspecError(
            f"{what} does not exist; create it (`mkdir -p {path}`) or {fix}, or unset "
            "LLAMASPEC_CONFIG_DIR to use the default."
        )
    if path.exists() and not path.is_dir():
        raise LlamaspecError(f"{what} is a file, not a directory; {fix}.")
    if path.is_dir() and not os.access(path, os.R_OK | os.X_OK):
        raise LlamaspecError(f"{what} is not readable by this user; {fix}.")
    return path


def writable_root(root: Path) -> Path:
    """Where llamaspec writes what belongs beside the catalogs (the lock, tuned recipes):
    the checkout, or the user data dir when the catalogs are the installed package's."""
    return user_data() if is_packaged(root) else root


def default_out(name: str) -> Path:
    """`dist` or `reports`: relative to the working directory when the catalogs are a
    checkout's (or LLAMASPEC_ROOT's), under the user data dir when they are the package's."""
    return user_data() / name if is_packaged(project_root()) else Path(name)
