"""Pure parts of bench and tune: workloads, the cost model, provenance, candidates, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec import config
from llamaspec.engine import toolchain
from llamaspec.errors import LlamaspecError
from llamaspec.perf import bench, bench_plans, bench_report, costmodel, tune, tune_report, workloads

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- workloads


def test_workloads_cover_spec_bench_categories_and_code_edit() -> None:
    categories = " ".join(w.category for w in workloads.WORKLOADS.values())
    for spec_bench in (
        "multi-turn conversation",
        "translation",
        "summarization",
        "question answering",
        "mathematical reasoning",
        "retrieval-augmented",
        "code edit",
    ):
        assert spec_bench in categories
    for w in workloads.WORKLOADS.values():
        assert 32 <= w.n_predict <= 256 and w.turns
    assert len(workloads.WORKLOADS["conversation"].turns) >= 3
    assert set(workloads.TUNE_MIX) <= set(workloads.WORKLOADS)


def test_copy_workload_is_the_measured_copy_heavy_prompt() -> None:
    copy = workloads.WORKLOADS["copy"]
    assert 1700 <= len(workloads.INVENTORY_MODULE) <= 1900
    assert copy.n_predict == 256
    assert workloads.INVENTORY_MODULE in copy.turns[0]
    assert "Here is the same module again, unchanged:" in copy.turns[0]


def test_conversation_turns_carry_the_history() -> None:
    conv = workloads.WORKLOADS["conversation"]
    first = conv.prompt("", 0)
    assert first.startswith("User: ") and first.endswith("Assistant:")
    second = conv.prompt(first + " an answer\n", 1)
    assert second.startswith(first) and conv.turns[1] in second
    qa = workloads.WORKLOADS["qa"]
    assert qa.prompt("ignored", 0) == qa.turns[0]


def test_unknown_workload_says_did_you_mean() -> None:
    assert [w.name for w in workloads.select(["copy", "qa", "copy"])] == ["copy", "qa"]
    assert len(workloads.select(None)) == len(workloads.WORKLOADS)
    with pytest.raises(LlamaspecError, match=r"Unknown workload 'cpy'\. Did you mean 'copy'\?"):
        workloads.select(["cpy"])


# ---------------------------------------------------------------- cost model


def test_batch_ratio_interpolates_and_extrapolates() -> None:
    costs = {1: 10.0, 2: 12.0, 4: 16.0}
    assert costmodel.ratio(costs, 1) == 1.0
    assert costmodel.ratio(costs, 3) == pytest.approx(1.4)
    assert costmodel.ratio(costs, 6) == pytest.approx(2.0)  # slope of the last segment
    assert costmodel.batch_points(9) == [1, 2, 3, 4, 5, 6, 8, 9]
    with pytest.raises(ValueError):
        costmodel.ratio({2: 1.0}, 2)


def test_expected_speedup_counts_plain_steps_drafts_and_draft_cost() -> None:
    c = costmodel.SpecCounters(drafts=10, drafted=40, accepted=30, available=True)
    costs = {1: 10.0, 5: 15.0}
    # 100 tokens: 10 speculative steps (40 drafted, 30 accepted) emit 40, 60 plain steps
    assert costmodel.expected_speedup(100, c, costs, 0.0) == pytest.approx(100 / (60 + 15))
    assert costmodel.expected_speedup(100, c, costs, 0.1) == pytest.approx(100 / (60 + 15 + 4))
    assert costmodel.expected_speedup(100, costmodel.SpecCounters(), costs, 0.0) == 1.0


def test_metrics_parsing_and_per_position_histogram() -> None:
    text = (
        "# HELP llamacpp:spec_decode_num_drafts_total x\n"
        "llamacpp:spec_decode_num_drafts_total 10\n"
        "llamacpp:spec_decode_num_draft_tokens_total 40\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 24\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8\n'
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 7\n'
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 4\n'
    )
    c = costmodel.parse_metrics(text)
    assert (c.drafts, c.drafted, c.accepted, c.available) == (10, 40, 24, True)
    assert c.per_pos == [8, 7, 0, 4]
    assert costmodel.acceptance_by_position(c) == [0.8, 0.7, 0.0, 0.4]
    assert not costmodel.parse_metrics("llamacpp:prompt_tokens_total 3\n").available
    delta = c - costmodel.SpecCounters(5, 20, 12, [4, 3], True)
    assert (delta.drafts, delta.per_pos) == (5, [4, 4, 0, 4])
    hist = costmodel.accepted_length_histogram(costmodel.SpecCounters(10, 40, 20, [8, 6, 4, 2]))
    assert hist == [2, 2, 2, 2, 2] and sum(hist) == 10


def test_plain_decoding_limit_and_the_gap_sentence() -> None:
    assert costmodel.decode_limit(250_000_000, 10e9) == pytest.approx(40.0)
    assert costmodel.decode_limit(0, 10e9) == 0.0
    assert "agree" in costmodel.where_the_rest_goes(0.95)
    # the gap is put down to what drafts: an n-gram lookup's state, or a draft model's cache
    assert "n-gram state" in costmodel.where_the_rest_goes(0.7, by_steps=True, drafts=50)
    by_model = costmodel.where_the_rest_goes(0.7, by_steps=True, drafts=50, draft_model=True)
    assert "draft model reading each prompt" in by_model and "n-gram" not in by_model
    assert "drafting" in costmodel.where_the_rest_goes(0.6)
    assert "no speculative counters" in costmodel.where_the_rest_goes(None)
    assert "drafts of uneven length" in costmodel.where_the_rest_goes(0.6, by_steps=True)
    assert "Only 4 drafted step(s)" in costmodel.where_the_rest_goes(1.31, True, drafts=4)
    assert "within 10%" in costmodel.where_the_rest_goes(1.05, True, drafts=4)
    assert "vary in length" in costmodel.where_the_rest_goes(1.31, True, drafts=40)
    m = toolchain.machine()
    assert m["cores"] >= 1 and m["cpu"] in m["description"]


def test_a_verification_step_is_priced_from_a_fully_accepted_run() -> None:
    # 97 tokens: the first from the prompt pass, 6 plain steps, 10 drafted steps of 8 + 1
    delta = costmodel.SpecCounters(drafts=10, drafted=80, accepted=80, available=True)
    timings = {"predicted_n": 97, "predicted_ms": 6 * 10.0 + 10 * 55.0}
    assert costmodel.verify_step_ms(timings, delta, 10.0) == pytest.approx(55.0)
    assert costmodel.verify_step_ms(timings, costmodel.SpecCounters(1, 8, 8), 10.0) is None
    costs = costmodel.BatchCosts({1: 4.0, 9: 8.0}, decode_ms=10.0, prefix_tokens=30)
    assert costs.step_costs() == {1: 4.0, 9: 8.0}  # prompt batches until steps are timed
    costs.verify_ms = {9: 55.0}
    assert costs.step_costs() == {1: 1.0, 9: 5.5} and costs.verify_ratios() == {9: 5.5}
    # each step over the plain decode timed with it, not the cost phase's earlier one
    costs.verify_decode_ms = {9: 11.0}
    assert costs.step_costs() == {1: 1.0, 9: 5.0} and costs.verify_ratios() == {9: 5.0}
    assert costmodel.batch_points(20, costmodel.VERIFY_POINTS) == [2, 3, 5, 9, 17, 20]


def test_synthetic_steps_are_rendered_only_where_the_build_has_them() -> None:
    from llamaspec.models import dialects

    help_text = "--spec-type TYPE\n--spec-ngram-mod-n-min N\n--spec-synth-rates P0,P1\n"
    argv = dialects.synthetic_steps("upstream", help_text, 3)
    assert argv is not None and argv[-2:] == ["--spec-synth-rates", "1,1,1"]
    assert argv[argv.index("--spec-ngram-mod-n-min") + 1] == "3"
    assert argv[argv.index("--spec-ngram-mod-n-max") + 1] == "3"
    assert dialects.synthetic_steps("upstream", "--spec-type TYPE\n", 3) is None
    assert dialects.synthetic_steps("ik-legacy", help_text, 3) is None


# ---------------------------------------------------------------- provenance


def test_measured_needs_a_report_and_reported_needs_a_source() -> None:
    base = {"pair": "p", "description": "d", "spec": {"types": ["ngram-mod"]}}
    with pytest.raises(LlamaspecError, match="measured.report"):
        config.parse(
            config.Recipe,
            {**base, "name": "x", "measured": {"hardware": "h", "engine": "e", "result": "r"}},
            "x.yaml",
        )
    with pytest.raises(LlamaspecError, match="reported.source"):
        config.parse(
            config.Recipe, {**base, "name": "x", "reported": {"setup": "s", "result": "r"}}, "x"
        )
    with pytest.raises(LlamaspecError, match="measured.source"):  # the old key is gone
        config.parse(
            config.Recipe,
            {
                **base,
                "name": "x",
                "measured": {
                    "hardware": "h",
                    "engine": "e",
                    "result": "r",
                    "report": "a.md",
                    "source": "measured",
                },
            },
            "x",
        )


def test_every_recipe_keeps_measured_and_reported_apart() -> None:
    for recipe in config.load_recipes(ROOT).values():
        if recipe.measured:
            assert (ROOT / recipe.measured.report).is_file(), recipe.name
            assert "reported" not in recipe.measured.hardware, recipe.name
        if recipe.reported:
            assert recipe.reported.source and recipe.reported.setup, recipe.name
    by_name = config.load_recipes(ROOT)
    assert "none found" in by_name["qwen3.5-27b"].reported.source
    assert by_name["llama-3.1-8b"].reported.source.startswith("https://")


def test_the_docs_pairs_table_says_measured_or_reported() -> None:
    readme = (ROOT / "docs/guides/pairs-and-recipes.md").read_text()
    rows = {ln.split("|")[1].strip(" `"): ln for ln in readme.splitlines() if ln.startswith("| `")}
    assert "measured here · reported elsewhere" in readme
    for recipe in config.load_recipes(ROOT).values():
        row = rows[recipe.pair]
        if recipe.measured:
            assert f"measured (`{recipe.name}`)" in row and recipe.measured.report in row
        if recipe.reported:
            assert f"reported (`{recipe.name}`)" in row, recipe.name


# ---------------------------------------------------------------- tune


def test_candidates_follow_what_the_binary_and_pair_offer() -> None:
    flags = {"--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m"}
    cands = tune.candidates(
        {"draft", "ngram-mod", "ngram-map-k", "ngram-simple", "mtp"},
        has_draft=False,
        has_mtp=False,
        stacks=True,
        help_flags=flags,
    )
    types = [tuple(c.spec["types"]) for c in cands]
    assert ("draft",) not in types and ("mtp",) not in types
    # each type at its defaults first, then the knobs
    assert types[:3] == [("ngram-mod",), ("ngram-map-k",), ("ngram-simple",)]
    sized = [c for c in cands if c.extra]
    assert sized and all(c.extra[0] == "--spec-ngram-map-k-size-n" for c in sized)
    assert not any(c.extra for c in cands if c.spec["types"] == ["ngram-simple"])
    assert len({c.key for c in cands}) == len(cands)
    with_draft = tune.candidates(
        {"draft", "ngram-mod", "mtp"}, has_draft=True, has_mtp=True, stacks=True, help_flags=set()
    )
    kinds = {tuple(c.spec["types"]) for c in with_draft}
    assert {("draft",), ("mtp",), ("draft", "ngram-mod")} <= kinds
    legacy = tune.candidates(
        {"draft"}, has_draft=True, has_mtp=False, stacks=False, help_flags=set()
    )
    assert all(c.spec["types"] == ["draft"] for c in legacy)
    assert {c.spec["draft_p_min"] for c in legacy} == set(tune.DRAFT_P_MIN)


def test_apply_sets_the_candidates_settings_on_the_recipe() -> None:
    recipe = config.load_recipes(ROOT)["gemma3-270m-ngram"]
    c = tune.Candidate(
        "x",
        {"types": ["ngram-map-k"]},
        ("--spec-ngram-map-k-size-n", "6", "--spec-ngram-map-k-size-m", "16"),
    )
    tuned = tune.apply(recipe, "llama.cpp", c, name="gemma3-270m-ngram-tuned")
    assert tuned.name == "gemma3-270m-ngram-tuned" and tuned.spec.types == ("ngram-map-k",)
    assert tuned.server.extra[-4:] == c.extra and tuned.pair == recipe.pair
    again = tune.apply(tuned, "llama.cpp", tune.Candidate("y", {"types": ["ngram-mod"]}))
    assert again.server.extra == ()  # earlier size flags do not leak into the next candidate
    assert tune.strip_ngram_sizes(["-fa", "on", "--spec-ngram-simple-size-n", "4"]) == ("-fa", "on")
    written = tune.apply(recipe, "llama.cpp", tune.Candidate(tune.AS_WRITTEN, {"types": []}))
    assert written.spec == recipe.spec


def test_state_resumes_only_the_same_run(tmp_path: Path) -> None:
    path = tmp_path / "tune.state.json"
    state = tune_report.State.load(path, "key-a")
    state.baseline = {"copy": 70.0, "_seconds": 12.0}
    state.done["c1"] = tune_report.CandidateResult("one", {}, (), passed=True, score=1.5)
    state.done["c2"] = tune_report.CandidateResult("two", {}, (), passed=False, score=0.0)
    state.save()
    again = tune_report.State.load(path, "key-a")
    assert again.baseline == state.baseline and set(again.done) == {"c1", "c2"}
    assert tune_report.State.load(path, "key-b").done == {}  # another recipe, build or mix
    assert tune_report.State.load(path, "key-a", fresh=True).done == {}
    path.write_text("{not json")
    assert tune_report.State.load(path, "key-a").done == {}
    assert tune_report.best(again.done) is None  # no candidate timed twice yet
    again.second["c1"] = tune_report.PassTiming({"copy": 1.2}, 1.2)
    again.save()
    resumed = tune_report.State.load(path, "key-a")
    assert resumed.second == again.second
    resumed.done["c1"] = tune_report.both_passes(resumed.done["c1"], resumed.second["c1"])
    assert tune_report.best(resumed.done).label == "one"


def test_winner_is_chosen_on_both_passes() -> None:
    """Pass 1's best can lose: the leaders are timed again and the winner has the best
    geometric mean of both scores; the report shows both figures and their spread."""

    def timed(label: str, score: float) -> tune_report.CandidateResult:
        return tune_report.CandidateResult(label, {}, (), True, score, speedups={"qa": score})

    done = {
        "lucky": timed("lucky", 2.0),
        "steady": timed("steady", 1.8),
        "third": timed("third", 1.5),
        "fourth": timed("fourth", 1.4),
        "bad": tune_report.CandidateResult("bad", {}, (), False, 0.0, refused=True, check="x"),
    }
    # at least three, refused never
    assert tune_report.leaders(done) == ["lucky", "steady", "third"]
    second = {
        "lucky": tune_report.PassTiming({"qa": 1.2}, 1.2),
        "steady": tune_report.PassTiming({"qa": 1.8}, 1.8),
        "third": tune_report.PassTiming({"qa": 1.5}, 1.5),
    }
    for k, v in second.items():
        done[k] = tune_report.both_passes(done[k], v)
    win = tune_report.best(done)
    assert win.label == "steady" and win.final_score == pytest.approx(1.8)
    assert done["lucky"].spread == pytest.approx(0.8)
    assert done["lucky"].final_score == pytest.approx((2.0 * 1.2) ** 0.5, rel=1e-3)
    assert tune_report._verdict(done["bad"]).startswith("refused, not timed")
    assert tune.second_pass_seconds(10.0, 2, 3) == pytest.approx(3 * (22.0 + 10.0))


def test_score_budget_and_refusals() -> None:
    assert tune_report.score({"a": 2.0, "b": 0.5}) == pytest.approx(1.0)
    assert tune_report.score({"a": 2.0, "b": 0.0}) == 0.0
    assert tune.fits(100, 50, 200) and not tune.fits(180, 50, 200)
    msg = tune.too_small(1, 45, 40)
    assert "too small for one candidate" in msg and "--budget 2" in msg
    assert "an earlier run's timing" in tune.too_small(1, 45, 40, estimated=True)
    with pytest.raises(LlamaspecError, match="not a file"):
        bench_plans.adhoc_recipe(Path("/nonexistent/t.gguf"), None, ["ngram-mod"], None)


def test_adhoc_recipe_checks_types_and_draft(tmp_path: Path) -> None:
    target = tmp_path / "My Model.Q4.gguf"
    target.write_bytes(b"GGUF")
    r = bench_plans.adhoc_recipe(target, None, ["ngram-mod"], 12)
    assert r.spec.types == ("ngram-mod",) and r.spec.draft_n_max == 12
    assert r.name == "adhoc-my-model.q4"
    with pytest.raises(LlamaspecError, match="Did you mean 'ngram-mod'"):
        bench_plans.adhoc_recipe(target, None, ["ngram-mode"], None)
    with pytest.raises(LlamaspecError, match="add --draft FILE"):
        bench_plans.adhoc_recipe(target, None, ["draft"], None)
    with pytest.raises(LlamaspecError, match="needs --spec TYPE"):
        bench_plans.adhoc_recipe(target, None, [], None)


def test_supported_types_come_from_the_dialect_and_help() -> None:
    up = bench_plans.supported_types(
        "upstream", "--spec-type none,draft-simple,ngram-mod,ngram-simple\n"
    )
    assert up == {"draft", "ngram-mod", "ngram-simple"}
    assert "ngram-map-k" in bench_plans.supported_types("upstream", "no list here")


def test_the_report_says_what_priced_the_steps() -> None:
    report = json.loads(
        (ROOT / "reports" / "bench-gemma3-270m-ngram-llamacpp-cpu-9036434bcbf5.json").read_text()
    )
    report["cost_model"]["verify_ratio"] = {}
    md = bench_report.markdown(report)
    assert "the prediction prices steps with the prompt batches above" in md
    report["cost_model"]["verify_ratio"] = {"2": 1.3, "9": 3.1}
    md = bench_report.markdown(report)
    assert "timed just before it: k=2: 1.3, k=9: 3.1; the prediction prices steps" in md


def test_a_verification_point_whose_server_fails_is_left_out() -> None:
    from contextlib import contextmanager

    from llamaspec.errors import LlamaspecError

    tried = []

    @contextmanager
    def refuses(k: int):
        tried.append(k)
        raise LlamaspecError(f"llama-server died at k = {k}")
        yield  # pragma: no cover

    ticks = []
    got = costmodel.measure_verify(refuses, "p", lambda: 10.0, 9, progress=lambda: ticks.append(1))
    assert got == {} and tried == [2, 3, 5, 9] and len(ticks) == 4


def test_a_candidate_that_fails_the_fast_check_is_refused_and_never_timed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The check comes first; a failure returns before any server is started or timed."""
    from types import SimpleNamespace

    from llamaspec.proof import verify

    plan = bench.BenchPlan("r", ("-m", "t.gguf"), ("--spec-type", "ngram-mod"), ("ngram-mod",),
                           tmp_path / "t.gguf", None, 17)  # fmt: skip
    monkeypatch.setattr(tune, "apply", lambda recipe, engine, c: recipe)
    monkeypatch.setattr(bench_plans, "recipe_plan", lambda *a, **k: plan)
    failed = SimpleNamespace(passed=False, detail="code: first difference at token 3")
    monkeypatch.setattr(verify, "fast_check", lambda *a, **k: failed)

    def never(*_a, **_k):
        raise AssertionError("a refused candidate was timed")

    monkeypatch.setattr(tune, "running", never)
    monkeypatch.setattr(bench, "run", never)
    c = tune.Candidate("ngram-mod 4/2/16", {"types": ["ngram-mod"]})
    r = tune._measure(
        None, None, "llama.cpp", c, plan.target, plan.target, None, "upstream", "",
        (), None, 0, tmp_path, Console(),
    )  # fmt: skip
    assert r.refused and not r.passed and r.speedups is None and r.score == 0.0
    assert tune_report._verdict(r) == "refused, not timed: code: first difference at token 3"
    assert tune_report.leaders({"x": r}) == []


def test_bench_server_args_go_to_both_servers_and_must_be_known(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from llamaspec.engine.artifact import Artifact
    from llamaspec.models import server_help

    monkeypatch.setattr(server_help, "server_help", lambda _b: "-fa, --flash-attn [on|off]\n")
    art = Artifact("llamacpp-cpu-0123456789ab", tmp_path, {}, False)
    plan = bench.BenchPlan("r", ("-m", "t.gguf"), ("--spec-type", "ngram-mod"), ("ngram-mod",),
                           tmp_path / "t.gguf", None, 17)  # fmt: skip
    out = bench_plans.with_server_args(plan, ["-fa", "off"], art)
    assert out.plain_args == ("-m", "t.gguf", "-fa", "off") and out.spec_args == plan.spec_args
    with pytest.raises(LlamaspecError, match="has no option -fx. Did you mean '-fa'"):
        bench_plans.with_server_args(plan, ["-fx", "off"], art)


def test_host_bandwidth_bounds_only_a_cpu_report() -> None:
    report = json.loads(
        (ROOT / "reports" / "bench-gemma3-270m-ngram-llamacpp-cpu-9036434bcbf5.json").read_text()
    )
    assert "→ plain-decoding limit" in bench_report.markdown(report)
    costs = costmodel.BatchCosts(batch_ms={1: 2.0}, decode_ms=2.0, prefix_tokens=37)
    summary = costmodel.summary(costs, 0.0, 0.0, 253_000_000)
    assert summary["memory_bandwidth_gb_s"] is None and summary["plain_decode_limit_tps"] is None
    report["backend"] = "cuda"
    report["cost_model"].update(memory_bandwidth_gb_s=None, plain_decode_limit_tps=None)
    md = bench_report.markdown(report)
    assert "plain-decoding limit: not estimated (cuda backend" in md
    assert "→ plain-decoding limit" not in md


def test_bench_and_tune_reports_are_written_from_their_frozen_results() -> None:
    """The typed results rebuilt from the committed reports give each file back byte for
    byte: their fields are the report's keys, in the same order, and they are frozen."""
    from dataclasses import FrozenInstanceError, fields

    keys = [f.name for f in fields(bench_report.BenchReport)]
    current = [
        p
        for p in sorted((ROOT / "reports").glob("bench-*.json"))
        if list(json.loads(p.read_text())) == keys  # older reports have other keys
    ]
    assert current
    for path in current:
        raw = json.loads(path.read_text())
        cells = tuple(
            bench_report.Cell(
                w["workload"],
                w["concurrency"],
                *(tuple(bench_report.Sample(**s) for s in w[k]) for k in ("plain", "spec", "warm")),
                w["summary"],
            )
            for w in raw["workloads"]
        )
        report = bench_report.BenchReport(**{**raw, "workloads": cells})
        assert json.dumps(report.to_json(), indent=2) + "\n" == path.read_text(), path.name
    with pytest.raises(FrozenInstanceError):
        report.wall_seconds = 0.0  # type: ignore[misc]
    tuned = sorted((ROOT / "reports").glob("tune-*.json"))
    assert tuned
    for path in tuned:
        raw = json.loads(path.read_text())
        results = tuple(tune_report.CandidateResult.from_json(r) for r in raw["results"])
        win = raw["winner"] and tune_report.CandidateResult.from_json(raw["winner"])
        raw.pop("reliability", None)  # derived: to_json judges the run again
        report = tune_report.TuneReport(**{**raw, "results": results, "winner": win})
        assert json.dumps(report.to_json(), indent=2) + "\n" == path.read_text(), path.name
        assert report.winner in report.results and report.report_path is None
    with pytest.raises(FrozenInstanceError):
        report.winner = None  # type: ignore[misc]
