"""This machine's NVIDIA GPUs and driver, asked through the one nvidia-smi helper.

Every question llamaspec puts to nvidia-smi (which GPUs, which driver, for the build's
preflight, the machine description of reports and the image a host can run) goes
through `nvidia_smi`, so there is one place that finds it, runs it and bounds its time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence

from llamaspec import procs
from llamaspec.errors import LlamaspecError

# The oldest driver that runs each CUDA major (NVIDIA's minor-version compatibility rule).
DRIVER_MIN = {11: 450, 12: 525, 13: 580}
SMI_S = 30  # a hung driver makes nvidia-smi hang: never wait longer than this by default


def nvidia_smi(
    args: Sequence[str],
    timeout: float = SMI_S,
    which: Callable[[str], str | None] = shutil.which,
) -> subprocess.CompletedProcess | None:
    """`nvidia-smi ARGS` run to completion (its exit status unchecked), or None where there
    is no nvidia-smi on PATH. Raises LlamaspecError where it cannot start or times out."""
    smi = which("nvidia-smi")
    if not smi:
        return None
    what = " ".join(["nvidia-smi", *args[:1]])
    return procs.run([smi, *args], timeout=timeout, check=False, what=what)


def gpu_names() -> list[str]:
    """`name, compute capability` of each visible NVIDIA GPU (empty without nvidia-smi)."""
    try:
        proc = nvidia_smi(["--query-gpu=name,compute_cap", "--format=csv,noheader"])
    except LlamaspecError:
        return []
    if proc is None or proc.returncode != 0:
        return []
    return [ln.strip() for ln in proc.stdout.splitlines() if "," in ln]


def driver_version() -> str | None:
    """The NVIDIA driver's version where nvidia-smi answers, else None."""
    try:
        proc = nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    except LlamaspecError:
        return None
    if proc is None:
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    return lines[0] if proc.returncode == 0 and lines else None


def driver_ok(driver: str, cuda_major: int) -> bool:
    m = re.match(r"(\d+)", driver)
    return bool(m) and int(m.group(1)) >= DRIVER_MIN.get(cuda_major, 0)
