"""`patches ab` without a server: scenario choice, the pair check, per-repetition ratios,
goals and their noise rule, the arms' arguments, and the report's Markdown."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.maint import patch_ab, patch_ab_report
from llamaspec.maint.patch_ab import PATCHED, PLAIN, STOCK, ArmRun
from llamaspec.perf.bench import BenchPlan

PIN = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def _artifact(aid: str, patches: list[str], commit: str = PIN) -> Artifact:
    manifest = {
        "engine": "llama.cpp",
        "commit": commit,
        "backend": "cpu",
        "patches": [{"id": p, "status": "applied"} for p in patches],
    }
    return Artifact(aid, Path("/nonexistent") / aid, manifest, False)


def _runs(tps: list[float], drafted: int = 10) -> list[ArmRun]:
    return [ArmRun(int(t * 10), 10.0, drafted, drafted // 2, int(t * 10)) for t in tps]


def test_select_keeps_catalog_order_and_names_unknown_scenarios() -> None:
    assert patch_ab.select([]) == patch_ab.SCENARIOS
    names = [s.name for s in patch_ab.SCENARIOS]
    assert [s.name for s in patch_ab.select([names[2], names[0]])] == [names[0], names[2]]
    with pytest.raises(LlamaspecError, match="'nope'.*Scenarios: request-control-mixed"):
        patch_ab.select(["nope"])


def test_every_scenario_names_a_catalog_patch_or_is_a_health_row() -> None:
    from llamaspec import config

    ids = {p.id for p in config.load_series()}
    for s in patch_ab.SCENARIOS:
        assert s.patch == "" or s.patch in ids, s


def test_the_pair_must_be_one_pin_and_the_stock_build_unpatched() -> None:
    patched = _artifact("llamacpp-cpu-aaaa", ["server-request-spec-n-max"])
    patch_ab.check_pair(patched, _artifact("llamacpp-cpu-bbbb", []))
    with pytest.raises(LlamaspecError, match="commit.*--no-default-patches"):
        patch_ab.check_pair(patched, _artifact("llamacpp-cpu-bbbb", [], commit="f" * 40))
    with pytest.raises(LlamaspecError, match="carries patches \\(x\\)"):
        patch_ab.check_pair(patched, _artifact("llamacpp-cpu-bbbb", ["x"]))
    with pytest.raises(LlamaspecError, match="same build"):
        patch_ab.check_pair(patched, _artifact("llamacpp-cpu-aaaa", []))


def test_slower_beyond_noise_means_slower_in_every_repetition() -> None:
    s = patch_ab.select(["ngram-mod-defaults-copy"])[0]
    even = {STOCK: _runs([10, 10, 10]), PATCHED: _runs([9.5, 10.4, 9.9]), PLAIN: _runs([8, 8, 8])}
    assert patch_ab.goal_met(s, even)
    slower = {STOCK: _runs([10, 10, 10]), PATCHED: _runs([9.8, 9.9, 9.7]), PLAIN: _runs([8, 8, 8])}
    assert not patch_ab.goal_met(s, slower)
    # in a scenario with a plain arm, losing to plain in every repetition misses it too
    lost = {STOCK: _runs([10, 10, 10]), PATCHED: _runs([11, 11, 11]), PLAIN: _runs([12, 13, 12])}
    assert not patch_ab.goal_met(s, lost)


def test_a_draft_without_type_scenario_wants_patched_drafting_and_stock_idle() -> None:
    s = patch_ab.select(["draft-without-type"])[0]
    assert s.drop_type and not s.plain
    assert patch_ab.goal_met(s, {STOCK: _runs([10], drafted=0), PATCHED: _runs([14])})
    assert not patch_ab.goal_met(s, {STOCK: _runs([10]), PATCHED: _runs([14])})


def test_arm_arguments_plain_drops_speculation_and_drop_type_drops_only_the_type() -> None:
    plan = BenchPlan(
        "r", ("-m", "t.gguf", "-c", "4096", "-np", "1"),
        ("-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "8"),
        ("draft",), Path("t.gguf"), Path("d.gguf"), 9,
    )  # fmt: skip
    mixed, no_type = patch_ab.select(["request-control-mixed", "draft-without-type"])
    plain = patch_ab.arm_args(plan, mixed, PLAIN, "upstream")
    assert "-md" not in plain and plain[-1] == "--metrics"
    assert plain[plain.index("-np") + 1] == "4"  # slots for the scenario's most clients
    spec = patch_ab.arm_args(plan, no_type, PATCHED, "upstream")
    assert "--spec-type" not in spec and "-md" in spec and "--spec-draft-n-max" in spec
    assert patch_ab.without_spec_type(["--spec-type=ngram-mod", "-m", "x"], "upstream") == [
        "-m",
        "x",
    ]
    (busy,) = patch_ab.select(["busy-max-8-clients"])
    patched = patch_ab.arm_args(plan, busy, PATCHED, "upstream")
    stock = patch_ab.arm_args(plan, busy, STOCK, "upstream")
    assert patched[patched.index("--spec-busy-max") + 1] == "2"  # the new option: patched only
    assert "--spec-busy-max" not in stock and stock[stock.index("-np") + 1] == "8"


def test_summary_ratios_spread_and_the_report_table(tmp_path: Path) -> None:
    s = patch_ab.select(["request-control-mixed"])[0]
    plan = BenchPlan("r", ("-m", "t.gguf"), ("--spec-type", "ngram-mod"), ("ngram-mod",),
                     Path("t.gguf"), None, 9)  # fmt: skip
    runs = {STOCK: _runs([10, 10, 10]), PATCHED: _runs([12, 20, 11]), PLAIN: _runs([11, 11, 11])}
    row = patch_ab.summarize(s, runs, plan, "upstream")
    assert row["patched_over_stock_by_repetition"] == [1.2, 2.0, 1.1]
    assert row["patched_over_stock"] == 1.2
    assert row["reasons"] and "spread" in row["reasons"][0]  # 2.0 / 1.1 > 1.5
    assert row["over_plain"] == {"stock": 0.909, "patched": 1.091}
    report = {
        "patched": {"id": "llamacpp-cpu-aaaa", "patches": ["server-request-spec-n-max"]},
        "stock": {"id": "llamacpp-cpu-bbbb", "patches": []},
        "engine": "llama.cpp",
        "commit": PIN,
        "backend": "cpu",
        "machine": {"description": "a test machine"},
        "date": "2026-11-28",
        "repetitions": 3,
        "exposure": "first",
        "measure": "tokens per second of wall time",
        "scenarios": [row],
        "host_load": {"cpus": 2, "before": 0.1, "before_from": "busy", "during": [], "after": 1},
        "wall_seconds": 1.0,
        "reliability": {"reliable": False, "reasons": row["reasons"], "spread_max": 1.5},
    }
    md = patch_ab_report.markdown(report)
    assert "# Patched vs stock: llamacpp-cpu-aaaa vs llamacpp-cpu-bbbb" in md
    assert "UNRELIABLE" in md and "a test machine" in md
    assert "| request-control-mixed | server-request-spec-n-max |" in md
    assert "**1.20×** (1.20, 2.00, 1.10)" in md
    assert "speculative.n_max 0" in md  # the traffic names the request field


def test_a_reference_family_scenario_renders_its_speculation_for_the_dialect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The MTP-hybrid scenario serves a reference family, not a recipe: both builds must be
    able to serve it, and its speculative flags are rendered for the build's dialect."""
    (s,) = patch_ab.select(["mtp-hybrid-4-clients"])
    assert (s.family, s.recipe, s.plain) == ("qwen35moe-mtp", "qwen35moe-mtp", False)
    asked: list[str] = []

    class Pair:
        target = Path("qwen35moe-mtp.gguf")

    def pair_for(name: str, engine: str, dialect: str, help_text: str, say=None) -> Pair:
        asked.append(f"{name} {engine} {dialect}")
        return Pair()

    monkeypatch.setattr(patch_ab.registry, "pair_for", pair_for)
    monkeypatch.setattr(patch_ab, "server_help", lambda server: "")
    patched, stock = _artifact("p", ["x"]), _artifact("s", [])
    plan = patch_ab.family_plan(s, patched, stock, "upstream", Console(quiet=True))
    assert asked == ["qwen35moe-mtp llama.cpp upstream"] * 2  # each build is asked
    assert plan.spec_args == ("--spec-type", "draft-mtp", "--spec-draft-n-max", "3",
                              "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.0")  # fmt: skip
    args = patch_ab.arm_args(plan, s, PATCHED, "upstream")
    assert args[:2] == ["-m", "qwen35moe-mtp.gguf"] and "--no-kv-unified" in args
    assert args[args.index("-np") + 1] == "4" and args[-1] == "--metrics"
