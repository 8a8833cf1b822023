"""The equivalence suite on the real upstream build: embedded pair and a random hybrid model."""

from __future__ import annotations

import json

import pytest

from helpers import llamaspec, verify_cli

pytestmark = pytest.mark.integration


def test_verify_embedded_pair(upstream_artifact, tmp_path) -> None:
    # draft model + ngram-mod: the methods users run; ngram-simple/map-k are in `nox -s verify`
    proc = verify_cli(upstream_artifact, tmp_path, "--method", "draft", "--method", "ngram-mod")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    emb = json.loads((tmp_path / f"verify-{upstream_artifact.id}-embedded.json").read_text())
    assert emb["passed"] and emb["envelope"]["threshold"] >= 0.5
    by_name = {m["method"]: m for m in emb["methods"]}
    assert set(by_name) == {"draft", "ngram-mod"}
    for m in by_name.values():
        assert m["hard"] == 0 and m["accepted"] > 0
        assert m["identical"] + m["near_tie"] + m["short"] == 2 * 5  # seq + parallel, 5 prompts
    assert (tmp_path / f"verify-{upstream_artifact.id}-embedded.md").is_file()


def test_verify_hybrid_model_through_the_checkpoint_path(upstream_artifact, tmp_path) -> None:
    proc = verify_cli(upstream_artifact, tmp_path, "--model", "hybrid")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hyb = json.loads((tmp_path / f"verify-{upstream_artifact.id}-hybrid.json").read_text())
    by_name = {m["method"]: m for m in hyb["methods"]}
    assert hyb["passed"] and set(by_name) == {"draft", "ngram-mod"}
    assert by_name["ngram-mod"]["accepted"] > 0
    # a draft with other weights is mostly rejected: each rejection restores a checkpoint
    assert by_name["draft"]["drafted"] > by_name["draft"]["accepted"]
    for m in by_name.values():
        assert m["hard"] == 0 and m["identical"] + m["near_tie"] == 2 * 5


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
