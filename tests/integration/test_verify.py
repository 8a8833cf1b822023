"""The equivalence suite on the real upstream build: embedded pair and a random hybrid model."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import llamaspec, verify_cli

pytestmark = pytest.mark.integration


def _report(tmp_path, artifact, tag: str) -> dict:
    return json.loads((tmp_path / f"verify-{artifact.id}-{tag}.json").read_text())


def test_strict_tier_on_the_embedded_reference_copy(upstream_artifact, tmp_path) -> None:
    """F32 copy of the embedded model: draft and ngram-mod, sequential and on 4 parallel
    slots, must be token-identical to plain decoding; no threshold."""
    proc = verify_cli(
        upstream_artifact, tmp_path, "--model", "embedded", "--tier", "strict",
        "--method", "draft", "--method", "ngram-mod",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(tmp_path, upstream_artifact, "embedded")
    assert rep["tier"] == "strict" and rep["passed"] and len(rep["reference_sha256"]) == 64
    assert rep["model"].endswith("-f32.gguf")
    by_name = {m["method"]: m for m in rep["methods"]}
    assert set(by_name) == {"draft", "ngram-mod"}
    for m in by_name.values():
        assert m["failed"] == 0 and m["accepted"] > 0, m
        assert m["identical"] == 2 * 5  # every prompt, sequential and parallel
    assert (
        "token-identical" in (tmp_path / f"verify-{upstream_artifact.id}-embedded.md").read_text()
    )


# The reference models of every type but the embedded pair's, and the methods CI runs on them
# (draft+ngram-mod, which only stacks two covered types, is left to full runs).
# MTP on the Qwen3.5/3.6 hybrids: every rejected draft rolls the recurrent state back
RECURRENT_MTP = ("qwen35-mtp", "qwen35moe-mtp")
REFERENCE_MODELS = ("hybrid", "mtp", "eagle3", "gemma4", "dflash", "dspark", *RECURRENT_MTP)
COVERED = {
    "draft-simple": "hybrid",
    "ngram-simple": "hybrid",
    "ngram-map-k": "hybrid",
    "ngram-map-k4v": "hybrid",
    "ngram-mod": "hybrid",
    "draft-mtp": ("mtp", "gemma4"),  # the target's own MTP heads, or Gemma 4's assistant
    "draft-eagle3": "eagle3",
    "draft-dflash": "dflash",
    "draft-dspark": "dspark",
}


def test_strict_tier_covers_every_type_the_build_offers(upstream_artifact, tmp_path) -> None:
    """One strict run over the random-weight reference models: every type the build's --help
    offers is a row of the coverage table, covered (drafts accepted, every output identical,
    sequential and on parallel slots) or named with why not. The hybrid target takes the
    draft and n-gram types through the checkpoint path (its draft has other weights: mostly
    rejected, so every rejection restores a checkpoint). On the Qwen3.5/3.6-style hybrids
    (qwen35, qwen35moe) MTP drafts with the target's NextN block, partly accepted: every
    rejection rolls the gated delta net state back, and the outputs stay exact."""
    methods = ["draft", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod",
               "ngram-cache", "mtp", "assistant", "eagle3", "dflash", "dspark"]  # fmt: skip
    argv = ["--tier", "strict", "--prompt", "short", "--prompt", "code", "--prompt", "rewrite"]
    for m in REFERENCE_MODELS:
        argv += ["--model", m]
    for m in methods:
        argv += ["--method", m]
    proc = verify_cli(upstream_artifact, tmp_path, *argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hybrid = _report(tmp_path, upstream_artifact, "hybrid")
    by_name = {m["method"]: m for m in hybrid["methods"]}
    assert by_name["draft"]["drafted"] > by_name["draft"]["accepted"]
    cov = json.loads((tmp_path / f"verify-{upstream_artifact.id}-coverage.json").read_text())
    rows = {r["engine_type"]: r for r in cov["rows"]}
    assert len(rows) == 10, rows  # every upstream type at the pin, none left out
    for name, model in COVERED.items():
        row = rows[name]
        assert row["covered"] and row["model"].startswith(model), row  # str.startswith: a tuple too
        assert row["accepted"] > 0 and row["identical"] == {
            "sequential": "3/3", "parallel": "3/3"
        }, row  # fmt: skip
    for row in rows.values():
        assert row["covered"] or row["why"], row  # never skipped silently
    for name in RECURRENT_MTP:  # some drafts accepted, some rejected (rolled back), all exact
        (m,) = _report(tmp_path, upstream_artifact, name)["methods"]
        assert m["method"] == "mtp" and 0 < m["accepted"] < m["drafted"], m
        assert m["identical"] == 2 * 3 and m["failed"] == 0, m
    md = (tmp_path / f"verify-{upstream_artifact.id}-coverage.md").read_text()
    assert "| `draft-mtp` | yes |" in md
    assert "| qwen35-mtp (qwen35-mtp.gguf) | qwen35 | mtp | 3/3, 3/3 |" in md
    assert "| qwen35moe-mtp (qwen35moe-mtp.gguf) | qwen35moe | mtp | 3/3, 3/3 |" in md
    assert "| eagle3 (target-llama.gguf) | llama, draft eagle3 |" in md


def test_oracle_tier_for_a_recipe_on_the_quantized_model(upstream_artifact, tmp_path) -> None:
    """`verify --recipe --prompts FILE`: the recipe's own settings on the user's prompts (a
    chat among them), every emitted token judged by the plain server's log-probabilities,
    against the envelope measured without speculation; under the determinism flags and
    again under the recipe's own flags."""
    prompts = tmp_path / "prompts.jsonl"
    chat = [{"role": "user", "content": "Name three rivers in Europe."}]
    prompts.write_text(
        json.dumps({"name": "code", "text": "def fibonacci(n):\n", "n_predict": 24})
        + "\n"
        + json.dumps({"name": "chat", "messages": chat, "n_predict": 16})
        + "\n"
    )
    proc = verify_cli(
        upstream_artifact, tmp_path, "--recipe", "gemma3-270m-ngram", "--prompts", str(prompts)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(tmp_path, upstream_artifact, "recipe-gemma3-270m-ngram-oracle")
    assert rep["tier"] == "oracle" and rep["passed"] and rep["oracle_requests"] > 0
    assert rep["determinism"] == ["--no-kv-unified", "-fa", "off"]
    env = rep["envelope"]
    assert {"sequential", "parallel slots", "micro-batch 4"} <= set(env["by_config"])
    # the plain server under the recipe's own flags is part of the envelope the own rows meet
    assert {"own flags, sequential", "own flags, parallel slots"} <= set(env["by_config"])
    det, own = rep["methods"]
    assert (det["flags"], own["flags"]) == ("determinism", "own")
    assert "ngram-mod" in " ".join(det["argv"]) and own["argv"] == det["argv"]
    assert det["summary"]["sequential"]["failed"] == 0
    assert {c["prompt"] for c in det["cases"]} == {"code", "chat"}
    assert rep["own_flags"]["outputs"] == 4 and rep["own_flags"]["verdict"] == "passed"
    md = tmp_path / f"verify-{upstream_artifact.id}-recipe-gemma3-270m-ngram-oracle.md"
    assert "Recipe's own flags vs determinism flags" in md.read_text()


def test_bench_writes_json_markdown_and_png(upstream_artifact, tmp_path) -> None:
    # the ngram recipe, cheaply: one repetition of two short workloads, one client
    proc = llamaspec(
        "bench",
        "gemma3-270m-ngram",
        "--artifact",
        upstream_artifact.id,
        "--dist",
        str(upstream_artifact.path.parent),
        "--repetitions",
        "1",
        "--workload",
        "copy",
        "--workload",
        "qa",
        "--concurrency",
        "1",
        "--reports",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stem = tmp_path / f"bench-gemma3-270m-ngram-{upstream_artifact.id}"
    report = json.loads(stem.with_suffix(".json").read_text())
    # the recipe's own spec arguments, not a draft model
    assert report["spec_args"][:2] == ["--spec-type", "ngram-mod"]
    assert not any("draft" in a for a in report["spec_args"])
    assert "--spec-type ngram-mod" in report["commands"]["speculative, 1 slot(s)"]
    assert "--spec-type" not in report["commands"]["plain, 1 slot(s)"]
    assert "gemma-3-270m-q4_k_m.gguf" in report["commands"]["plain, 1 slot(s)"]
    assert "/" not in report["commands"]["plain, 1 slot(s)"].split(" -m ")[1].split()[0]
    by = {w["workload"]: w["summary"] for w in report["workloads"]}
    assert set(by) == {"copy", "qa"}
    assert by["copy"]["accepted"] > 0 and by["copy"]["spec_tps_median"] > 0
    # every token the server counted reached the client (an engine that cuts outputs short
    # would make its tok/s count tokens nobody received, and the verdict would say so)
    samples = [s for w in report["workloads"] for k in ("plain", "spec", "warm") for s in w[k]]
    assert samples and all(s["returned"] == s["tokens"] for s in samples)
    # first exposure is the headline; ngram-mod keeps its pool, so a warm figure beside it
    assert report["keeps_state"] == ["ngram-mod"] and "restarted" in report["exposure"]
    assert by["copy"]["warm_spec_tps_median"] > 0 and by["copy"]["warm_speedup"] > 0
    assert report["cost_model"]["batch_ratio"]["1"] == 1.0
    assert report["machine"]["cores"] >= 1 and report["commit"]
    md = stem.with_suffix(".md").read_text()
    assert md.startswith("# Bench") and "Cost model" in md and upstream_artifact.id in md
    assert stem.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_tune_resumes_refuses_a_tiny_budget_and_writes_a_recipe(upstream_artifact, tmp_path):
    common = (
        "--artifact",
        upstream_artifact.id,
        "--dist",
        str(upstream_artifact.path.parent),
        "--workload",
        "qa",
        "--reports",
        str(tmp_path / "reports"),
        "--out",
        str(tmp_path / "recipes"),
    )
    tiny = llamaspec("tune", "gemma3-270m-ngram", "--budget", "0.05", *common)
    assert tiny.returncode == 2 and "too small for one candidate" in " ".join(tiny.stderr.split())
    assert "Traceback" not in tiny.stderr
    # the budget only gates; --candidates 2 bounds the work (a busy machine stays in budget)
    proc = llamaspec("tune", "gemma3-270m-ngram", "--budget", "30", "--candidates", "2", *common)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = tmp_path / "reports" / f"tune-gemma3-270m-ngram-{upstream_artifact.id}.state.json"
    saved = json.loads(state.read_text())
    assert len(saved["done"]) == 2
    # both candidates passed, so both are leaders and were timed again in the second pass
    assert set(saved["second"]) == set(saved["done"])
    report = json.loads(state.with_name(state.name.replace(".state", "")).read_text())
    win = report["winner"]
    assert win["final_score"] > 0 and win["score_pass2"] > 0 and "spread" in win
    assert "pass 2" in state.with_name(state.name.replace(".state.json", ".md")).read_text()
    tuned = yaml.safe_load((tmp_path / "recipes" / "gemma3-270m-ngram-tuned.yaml").read_text())
    assert tuned["pair"] == "gemma3-270m-ngram" and tuned["spec"]["types"]
    m = tuned["measured"]
    assert m["artifact"] == upstream_artifact.id and "cores" in m["hardware"]
    assert upstream_artifact.manifest["commit"][:12] in m["engine"]
    # the resumed run measures nothing again and writes the same winner
    again = llamaspec("tune", "gemma3-270m-ngram", "--budget", "30", "--candidates", "2", *common)
    assert again.returncode == 0 and "resuming" in again.stdout
    # another mix has no baseline yet: with the earlier run's timing, a budget too small is
    # refused before its baseline runs
    other = tuple("copy" if a == "qa" else a for a in common)
    more = llamaspec("tune", "gemma3-270m-ngram", "--budget", "0.05", *other)
    flat = " ".join(more.stderr.split())
    assert more.returncode == 2 and "an earlier run's timing" in flat, more.stderr
    assert "plain baseline" not in more.stdout


def test_an_f32_target_gets_the_strict_tier_without_asking(
    upstream_artifact, gemma_path, tmp_path
) -> None:
    """`verify --target FILE` with no --strict, on an F32 file (the embedded model's F32
    copy, which the strict tier above already makes): the header says F32, so the strict tier
    runs on the file itself (token identity, no threshold), and no oracle run beside it."""
    from llamaspec.models.embedded import EMBEDDED_SHA256
    from llamaspec.proof.reference import reference_copy

    f32 = reference_copy(gemma_path, EMBEDDED_SHA256)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"name": "code", "text": "def fibonacci(n):\n", "n_predict": 24})
        + "\n"
        + json.dumps({"name": "list", "text": "1, 2, 3, 4, 5, 6,", "n_predict": 16})
        + "\n"
    )
    proc = verify_cli(
        upstream_artifact, tmp_path, "--target", str(f32.path), "--prompts", str(prompts)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    name = f32.path.name
    assert f"{name} is F32: the strict tier (token identity, no threshold) on {name} itself" in said
    assert "only the oracle tier ran" not in said
    rep = _report(tmp_path, upstream_artifact, f"file-{f32.path.stem}")
    assert rep["tier"] == "strict" and rep["passed"] and rep["model"] == name
    assert rep["reference_sha256"] == f32.sha256  # the file itself is the reference
    (m,) = rep["methods"]
    assert m["method"] == "ngram-mod" and m["failed"] == 0 and m["identical"] == 2 * 2, m
    assert not list(tmp_path.glob("verify-*-oracle.json"))
