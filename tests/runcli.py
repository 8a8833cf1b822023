"""Run the real `llamaspec` CLI in a subprocess with an isolated cache and home."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(
    *args: str, env_cache: Path, path: str = "/usr/bin:/bin", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`path`: the PATH it sees (a directory with no tools: no container tool at all); `env`:
    more environment."""
    return subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={
            "PATH": path,
            "LLAMASPEC_CACHE": str(env_cache),
            "HOME": str(env_cache),
            "PYTHONPATH": str(ROOT / "src"),  # this checkout's code, whatever is installed
            **(env or {}),
        },
        check=False,
        timeout=120,
    )
