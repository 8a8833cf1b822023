"""Shared test helpers: each test's tier (unit or integration) from its directory, and
isolated caches for unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# The tier marker each directory gives its tests; a file's own `pytestmark` may repeat it.
TIERS = {"unit": HERE / "unit", "integration": HERE / "integration"}


def tier(path: Path) -> str | None:
    """The tier of a test file: the directory under tests/ it lives in."""
    path = Path(path).resolve()
    return next((name for name, folder in TIERS.items() if folder in path.parents), None)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = []
    for item in items:
        mine = tier(item.path)
        if mine is None:
            continue
        item.add_marker(mine)
        others = {m.name for m in item.iter_markers()} & (TIERS.keys() - {mine})
        if others:
            wrong.append(f"{item.nodeid} is under tests/{mine} but marked {', '.join(others)}")
    if wrong:
        raise pytest.UsageError("a test's tier is its directory:\n" + "\n".join(wrong))


@pytest.fixture(autouse=True)
def _isolated_cache(request: pytest.FixtureRequest, tmp_path_factory, monkeypatch) -> None:
    """Unit tests never touch the user's cache, data (its lock) or config dirs; integration
    tests share the cache (and its builds)."""
    if request.node.get_closest_marker("unit"):
        monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path_factory.mktemp("cache")))
        monkeypatch.setenv("LLAMASPEC_DATA", str(tmp_path_factory.mktemp("data")))
        config = tmp_path_factory.mktemp("config")
        monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(config))
