"""Speculation priced by concurrency (issue 53): speed by client count from a bench report,
the crossover where speculation loses, and where a recipe shows it."""

from __future__ import annotations

from llamaspec.config import Crossover, Measured, Recipe, SpecSettings
from llamaspec.perf import crossover
from llamaspec.runtime.serve import clients_note


def _cell(workload: str, clients: int, plain: list[float], spec: list[float]) -> dict:
    med = sorted(spec)[len(spec) // 2] / sorted(plain)[len(plain) // 2]
    return {
        "workload": workload,
        "concurrency": clients,
        "plain": [{"tokens_per_second": x} for x in plain],
        "spec": [{"tokens_per_second": x} for x in spec],
        "summary": {
            "plain_tps_median": sorted(plain)[len(plain) // 2],
            "spec_tps_median": sorted(spec)[len(spec) // 2],
            "speedup": round(med, 3),
        },
    }


def _report(reliable: bool = True) -> dict:
    cells = [
        _cell("copy", 1, [50, 52], [100, 104]),
        _cell("qa", 1, [50, 50], [60, 62]),
        _cell("copy", 2, [90, 92], [120, 124]),
        _cell("qa", 2, [90, 90], [80, 96]),
        _cell("copy", 4, [150, 150], [140, 160]),
        _cell("qa", 4, [150, 150], [100, 110]),
        _cell("copy", 8, [200, 200], [120, 130]),
        _cell("qa", 8, [200, 200], [110, 120]),
    ]
    return {"workloads": cells, "concurrency": [1, 2, 4, 8],
            "reliability": {"reliable": reliable}}  # fmt: skip


def test_the_crossover_is_the_lowest_client_count_where_speculation_loses() -> None:
    p = crossover.price(_report())
    assert p is not None and [lv.clients for lv in p.levels] == [1, 2, 4, 8]
    one, two, four, eight = p.levels
    assert (one.plain_tps, one.spec_tps) == (102.0, 166.0)
    assert one.speedup > 1 and two.speedup > 1 and four.speedup < 1 and eight.speedup < 1
    assert (p.crossover, p.pays_up_to, p.reliable) == (4, 2, True)
    assert four.low < 1 < four.high and four.within_noise  # copy's repetitions straddle 1
    assert not eight.within_noise
    assert "pays up to 2 client(s) and loses from 4" in p.sentence()
    assert p.to_json()["crossover"] == 4 and len(p.to_json()["levels"]) == 4
    md = "\n".join(crossover.markdown(p))
    assert "## Many clients" in md and "**4 clients**" in md and "loses (within noise)" in md


def test_no_crossover_where_speculation_always_wins_or_one_count_only() -> None:
    winning = _report(reliable=False)
    winning["workloads"] = [c for c in winning["workloads"] if c["concurrency"] <= 2]
    p = crossover.price(winning)
    assert p is not None and p.crossover is None and p.pays_up_to == 2
    assert p.sentence().startswith("speculation pays at every client count measured")
    assert p.sentence().endswith("from a run marked unreliable")
    single = {"workloads": [c for c in _report()["workloads"] if c["concurrency"] == 1]}
    assert crossover.price(single) is None


def test_a_bench_report_with_several_client_counts_has_a_many_clients_section() -> None:
    r = _report()
    assert crossover.price(r) is not None
    md = "\n".join(crossover.markdown(crossover.price(r)))  # type: ignore[arg-type]
    assert "| 8 | 400.0 | 250.0 |" in md


def _recipe(clients: int | None) -> Recipe:
    cross = Crossover(clients=clients, measured=(1, 2, 4, 8), report="reports/bench-x.json")
    measured = Measured(hardware="2 cores", engine="llama.cpp 0c1e570", result="1.5x",
                        report="reports/bench-x.md", crossover=cross)  # fmt: skip
    return Recipe(name="r", pair="p", description="d", spec=SpecSettings(types=("draft",)),
                  measured=measured)  # fmt: skip


def test_show_and_serve_say_where_speculation_stops_paying() -> None:
    note = clients_note(_recipe(4), ["llama-server", "-np", "8"])
    assert note is not None and "loses from 4 busy slots on" in note
    assert "measured at 1, 2, 4, 8 clients on 2 cores (reports/bench-x.json)" in note
    assert note.endswith("This command serves 8 slots, so a busy server reaches it")
    assert "serves" not in (clients_note(_recipe(4), ["llama-server", "-np", "2"]) or "")
    assert "paid at every count, measured at" in (clients_note(_recipe(None), []) or "")
    bare = Recipe(name="r", pair="p", description="d", spec=SpecSettings(types=("draft",)))
    assert clients_note(bare, []) is None


def test_every_recipe_crossover_is_its_reports() -> None:
    """A recipe's `measured.crossover` is what its bench report gives, at the counts it
    measured (so a re-measured report and the recipe cannot drift apart)."""
    import json
    from pathlib import Path

    from llamaspec.config import load_recipes

    root = Path(__file__).resolve().parents[2]
    for recipe in load_recipes(root).values():
        cross = recipe.measured.crossover if recipe.measured else None
        if cross is None:
            continue
        priced = crossover.price(json.loads((root / cross.report).read_text()))
        assert priced is not None, recipe.name
        assert priced.crossover == cross.clients, recipe.name
        assert tuple(lv.clients for lv in priced.levels) == cross.measured, recipe.name


def test_the_batching_model_prices_each_client_count_from_the_cost_model() -> None:
    r = _report()
    for c in r["workloads"]:
        # 10 steps (40 tokens, 30 of them accepted drafts): 4 tokens and 5 evaluated a step
        c["summary"].update(tokens=40, drafts=10, drafted=40, accepted=30)
    assert crossover.predict(r, [1, 2]) == {}  # no cost model: nothing modelled
    r["cost_model"] = {"batch_ratio": {"2": 1.2, "5": 1.5, "9": 2.3}, "draft_cost_ratio": 0.1}
    model = crossover.predict(r, [1, 2, 4, 8])
    # k = 1: 4 · R(1) / (R(5) + 1·4·0.1) = 4 / 1.9
    assert model[1] == round(4 / 1.9, 3)
    # k = 2: R(2) = 1.2; R(10) extends the last slope (0.2 a token): 2.5; drafting 2·4·0.1
    assert model[2] == round(4 * 1.2 / (2.5 + 0.8), 3)
    assert model[1] > model[2] > model[4] > model[8]
    p = crossover.price(r)
    assert p is not None and p.priced and p.levels[0].predicted == model[1]
    assert p.predicted_crossover == next(k for k in (1, 2, 4, 8) if model[k] < 1)
    assert "Modelled (not measured)" in "\n".join(crossover.markdown(p))
