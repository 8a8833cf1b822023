"""Shared test helpers: isolated caches for unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(request: pytest.FixtureRequest, tmp_path_factory, monkeypatch) -> None:
    """Unit tests never touch the user's cache; integration tests share it (and its builds)."""
    if request.node.get_closest_marker("unit"):
        monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path_factory.mktemp("cache")))
