"""Helpers for integration tests: run the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The suite's upstream build is the one its images carry: `portable` (GGML_NATIVE=OFF, one
# CPU backend per instruction set, chosen at run time), so the image tests, the in-image
# build and the emulated-old-CPU test all reuse it. The native default is built by the ik
# fixture and by test_pipeline_small.
UPSTREAM_VARIANT = ("--variant", "portable")


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
