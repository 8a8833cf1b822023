"""The speculation gate on a real server (issue 43): a draft loaded with `-md` and no
`--spec-type` (upstream #25345) drafts nothing on the stock build of the pin, and the smoke
test fails with the gate's message, read from the server's own `/metrics` counters. (The
default build carries spec-type-from-plain-draft, which makes such a draft draft:
test_patches_vs_stock.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamaspec.engine.artifact import Artifact

from helpers import llamaspec

pytestmark = pytest.mark.integration


def test_a_planted_draft_without_a_spec_type_fails_the_smoke_with_the_gates_message(
    upstream_stock_artifact: Artifact, gemma_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "smoke"
    proc = llamaspec(
        "smoke",
        "--artifact",
        upstream_stock_artifact.id,
        "--dist",
        str(upstream_stock_artifact.path.parent),
        "--spec-args",
        f"-md {gemma_path}",
        "--out",
        str(out),
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "SPECULATION GATE" in output, output
    assert "nothing was drafted" in output
    assert "--spec-type draft-simple" in output  # the fix
    assert "#25345" in output  # the cause
    report = json.loads((out / "smoke.json").read_text())
    assert report["passed"] is False
    gate = report["gate"]
    assert gate["kind"] == "idle" and gate["drafted"] == 0 and gate["generated"] > 0
    assert gate["source"].startswith("/metrics")
    assert report["strict"] == []  # the gate's verdict stands: no F32 comparison after it
    # --out is where the report goes: nothing is written into the artifact (built --no-smoke)
    assert not (upstream_stock_artifact.path / "smoke.json").exists()
