"""llamaspec installed from its wheel (built from its sdist) into a fresh virtual
environment, used outside any checkout: the catalogs, recipes and patches come from the
package, the lock, artifacts and reports go under the user data dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import UPSTREAM_VARIANT

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, " ".join(map(str, argv)) + "\n" + proc.stdout + proc.stderr
    return proc


def test_the_installed_wheel_builds_and_benches_outside_a_checkout(
    tmp_path: Path, upstream_artifact, gemma_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMASPEC_ROOT", "VIRTUAL_ENV")}
    env |= {"LLAMASPEC_DATA": str(tmp_path / "data"), "COLUMNS": "200"}
    work = tmp_path / "work"  # no engines.yaml here or above: not a checkout
    work.mkdir()
    wheels = tmp_path / "wheels"
    # `build` makes the sdist, then the wheel from the sdist: both carry the data
    _run([sys.executable, "-m", "build", "--outdir", str(wheels), str(ROOT)], work, env)
    wheel = next(wheels.glob("llamaspec-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], work, env)
    _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], work, env)
    cli = str(venv / "bin" / "llamaspec")

    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from llamaspec import paths; print(paths.project_root())",
        ],
        work,
        env,
    ).stdout.strip()
    assert where.startswith(str(venv)) and where.endswith("llamaspec/data")
    assert "gemma3-270m-ngram-tuned" in _run([cli, "recipe", "list"], work, env).stdout
    # the monitoring templates are package data: the installed wheel renders them
    _run([cli, "recipe", "monitor", "gemma3-270m-ngram", "--out", str(tmp_path / "mon")], work, env)
    assert (tmp_path / "mon" / "llamaspec-alerts.yml").read_text().count("- alert:") == 3

    # the suite's own upstream build is reused (same id, same build tree): steps, not hours
    _run(
        [cli, "build", "--backend", "cpu", "--source", "pypi", *UPSTREAM_VARIANT, "--no-smoke"],
        work,
        env,
    )
    art = tmp_path / "data" / "dist" / upstream_artifact.id
    assert (art / "bin" / "llama-server").is_file() and not (work / "dist").exists()
    _run(
        [cli, "bench", "gemma3-270m-ngram-tuned", "--workload", "copy", "--repetitions", "1",
         "--concurrency", "1", "--no-cost-model"],
        work,
        env,
    )  # fmt: skip
    report = tmp_path / "data" / "reports" / f"bench-gemma3-270m-ngram-tuned-{art.name}.json"
    assert json.loads(report.read_text())["workloads"][0]["summary"]["spec_tps_median"] > 0
