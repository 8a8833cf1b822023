"""Build benchmark: llamaspec's build vs plain cmake on the same tree and flags, same run.

Both builds are cold (ccache disabled, empty build directories); the no-op rebuild is
timed too. Writes reports/bench-build-<artifact>.{json,md}.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from . import build as build_stage
from .build import Artifact
from .errors import LlamaspecError
from .paths import cache_dir
from .toolchain import detect


def _run(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LlamaspecError(
            f"`{' '.join(cmd[:4])} …` failed during the build benchmark.",
            details="\n".join((proc.stdout + proc.stderr).splitlines()[-15:]),
        )
    return time.monotonic() - t0


def bench_build(artifact: Artifact, dist: Path, reports: Path, console: Console) -> dict:
    """Time a cold plain-cmake build and a cold llamaspec build of the same artifact."""
    m = artifact.manifest
    cache_file = cache_dir() / "build" / artifact.id / "CMakeCache.txt"
    if not cache_file.is_file():
        raise LlamaspecError(f"Build {artifact.id} here first; its build tree is not cached.")
    tree = Path(build_stage._read_cache(cache_file)["CMAKE_HOME_DIRECTORY"])
    tools = detect()
    env = {**os.environ, "CCACHE_DISABLE": "1"}
    defines = [f"-D{d['name']}={d['value']}" for d in m["defines"]]
    target = "llama-server"
    with tempfile.TemporaryDirectory(prefix="llamaspec-plain-") as plain:
        console.print("bench-build: plain cmake, cold (ccache disabled)…")
        t_conf = _run([tools.cmake, "-S", str(tree), "-B", plain, "-G", "Ninja", *defines], env)
        t_build = _run([tools.cmake, "--build", plain, "--target", target], env)
    plain_s = t_conf + t_build
    console.print(f"bench-build: plain cmake {plain_s:.0f}s; llamaspec, cold…")
    shutil.rmtree(cache_dir() / "build" / artifact.id)
    shutil.rmtree(artifact.path)
    src = m["source"]["origin"]
    cmd = [
        sys.executable,
        "-m",
        "llamaspec.cli",
        "build",
        "--engine",
        m["engine"],
        "--pin",
        m["commit"],
        "--source",
        {"pypi-sdist": "pypi"}.get(src, src),
        "--dist",
        str(dist),
        "--no-smoke",
        "--backend",
        m["backend"],
    ]
    ls_s = _run(cmd, env)
    noop_s = _run(cmd, env)
    report = {
        "artifact_id": artifact.id,
        "engine": m["engine"],
        "commit": m["commit"],
        "cores": os.cpu_count(),
        "plain_cmake_seconds": round(plain_s, 1),
        "llamaspec_seconds": round(ls_s, 1),
        "ratio": round(ls_s / plain_s, 3),
        "noop_rebuild_seconds": round(noop_s, 2),
    }
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / f"bench-build-{artifact.id}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(
        f"# Build benchmark: {artifact.id}\n\n"
        f"{m['engine']}@{m['commit'][:12]}, `{target}`, {report['cores']} cores, cold, ccache "
        "disabled, same tree and defines.\n\n"
        "| build | seconds |\n|---|---|\n"
        f"| plain cmake (configure + build) | {report['plain_cmake_seconds']} |\n"
        f"| llamaspec build (fetch cached, patch, configure, build, install) | "
        f"{report['llamaspec_seconds']} |\n"
        f"| ratio llamaspec ÷ plain | {report['ratio']} |\n"
        f"| no-op rebuild (same request again) | {report['noop_rebuild_seconds']} |\n"
    )
    console.print(
        f"bench-build: llamaspec {ls_s:.0f}s (×{report['ratio']}), no-op {noop_s:.1f}s; "
        f"wrote {stem}.json and .md"
    )
    return report
