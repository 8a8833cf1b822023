"""A test's tier comes from its directory (tests/conftest.py): `pytest -m unit` selects every
file under tests/unit, marked or not, and a unit test runs with a cache of its own.

This file has no `pytestmark` on purpose: its tests are unit tests because of where they are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import llamaspec

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def test_a_unit_test_is_marked_by_its_directory_and_gets_a_cache_of_its_own(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("integration") is None
    cache = Path(os.environ["LLAMASPEC_CACHE"])
    assert cache.is_dir() and tmp_path_factory.getbasetemp() in cache.parents


def _collected(*args: str) -> set[str]:
    """The test files `pytest --collect-only` selects with these arguments."""
    env = {**os.environ, "PYTHONPATH": str(Path(llamaspec.__file__).parents[1])}
    quiet = ("--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:randomly")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *quiet, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode in (0, 5), proc.stdout[-3000:] + proc.stderr[-3000:]  # 5: none
    return {ln.split("::")[0] for ln in proc.stdout.splitlines() if "::" in ln}


def test_minus_m_unit_collects_every_file_under_tests_unit_and_nothing_else() -> None:
    every = {p.relative_to(ROOT).as_posix() for p in (TESTS / "unit").glob("test_*.py")}
    assert "tests/unit/test_tiers.py" in every
    # the whole tree: no integration file slips in, and none under tests/unit carries the
    # integration marker (the hook refuses that: pytest would exit 4)
    assert _collected("-m", "unit", "tests") == every
