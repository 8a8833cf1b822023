"""Helpers for integration tests: run the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def llamaspec(
    *args: str, cwd: Path = ROOT, timeout: float = 3600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the real `llamaspec` CLI in a subprocess, output captured; `env` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", *args],
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def verify_cli(artifact, reports: Path, *extra: str) -> subprocess.CompletedProcess:
    """`llamaspec verify` on a built artifact, reports into `reports`."""
    return llamaspec(
        "verify",
        "--artifact",
        artifact.id,
        "--dist",
        str(artifact.path.parent),
        "--reports",
        str(reports),
        *extra,
    )
