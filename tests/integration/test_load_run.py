"""`llamaspec load` on the suite's upstream build: the F32 reference with its Q4_K_M draft,
8 clients at once, streams hung up mid-answer, prompts at and over the context edge, and the
server SIGKILLed mid-run and restarted. Small settings (one thread, 8-token answers, 128
tokens of context per slot) keep it within a few minutes on a 2-core machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import llamaspec

pytestmark = pytest.mark.integration

RECIPE = "gemma3-270m-q4-draft"  # target: the embedded model's F32 copy


def test_load_with_cancellations_and_a_kill_keeps_outputs_exact(
    upstream_artifact, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    proc = llamaspec(
        "load", RECIPE,
        "--artifact", upstream_artifact.id,
        "--dist", str(upstream_artifact.path.parent),
        "--clients", "8",
        "--requests", "16",
        "--duration", "120",
        "--n-predict", "8",
        "--ctx", "128",
        "-t", "1",
        "--stream-share", "0.6",
        "--cancel-share", "0.5",
        "--fault", "kill@6",
        "--reports", str(reports),
        timeout=600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    stem = reports / f"load-{RECIPE}-{upstream_artifact.id}"
    report = json.loads(stem.with_name(stem.name + ".json").read_text())
    assert stem.with_name(stem.name + ".md").is_file()
    assert report["complete"] is True and report["speculative"] is True
    # every error is an expected one: the over-context prompt refused, or lost to the kill
    assert report["unexpected_errors"] == 0, report["outcomes"]
    assert report["outcomes"].get("error: over context", 0) >= 1
    assert report["cancelled"] >= 1
    e = report["exactness"]
    assert e["checked"] and e["compared"] >= 1
    assert e["identical"] == e["compared"], e["differences"]
    spec = report["by_mode"]["spec"]
    assert spec["acceptance"] is not None and spec["acceptance"]["rate"] > 0
    (kill,) = report["faults"]["kill"]
    assert kill["time_to_healthy_s"] is not None and kill["time_to_healthy_s"] > 0
    assert "exactness:" in output and "kill:" in output
