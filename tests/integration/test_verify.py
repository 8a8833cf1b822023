"""The equivalence suite on the real upstream build: embedded pair and a random hybrid model."""

from __future__ import annotations

import json

import pytest

from helpers import llamaspec

pytestmark = pytest.mark.integration


def test_verify_embedded_and_hybrid(upstream_artifact, tmp_path) -> None:
    proc = llamaspec(
        "verify",
        "--artifact",
        upstream_artifact.id,
        "--dist",
        str(upstream_artifact.path.parent),
        "--model",
        "embedded",
        "--model",
        "hybrid",
        "--reports",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    emb = json.loads((tmp_path / f"verify-{upstream_artifact.id}-embedded.json").read_text())
    assert emb["passed"]
    by_name = {m["method"]: m for m in emb["methods"]}
    assert by_name["draft"]["accepted"] > 0
    assert by_name["mtp"]["skipped"]
    for name in ("draft", "ngram-simple", "ngram-map-k", "ngram-mod"):
        m = by_name[name]
        assert m["skipped"] is None and m["hard"] == 0
        assert m["identical"] + m["near_tie"] == 2 * 5  # sequential + parallel, five prompts
    assert emb["envelope"]["threshold"] >= 0.5
    assert (tmp_path / f"verify-{upstream_artifact.id}-embedded.md").is_file()
    hyb = json.loads((tmp_path / f"verify-{upstream_artifact.id}-hybrid.json").read_text())
    (mod,) = hyb["methods"]
    assert hyb["passed"] and mod["method"] == "ngram-mod" and mod["accepted"] > 0


def test_bench_writes_json_markdown_and_png(upstream_artifact, tmp_path) -> None:
    proc = llamaspec(
        "bench",
        "--artifact",
        upstream_artifact.id,
        "--dist",
        str(upstream_artifact.path.parent),
        "--repetitions",
        "1",
        "--reports",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stem = tmp_path / f"bench-gemma3-270m-self-{upstream_artifact.id}"
    report = json.loads(stem.with_suffix(".json").read_text())
    assert {w["workload"] for w in report["workloads"]} == {"code-rewrite", "prose", "conversation"}
    for w in report["workloads"]:
        assert w["summary"]["spec_tps_median"] > 0 and w["summary"]["accepted"] > 0
    assert stem.with_suffix(".md").read_text().startswith("# Bench")
    assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
