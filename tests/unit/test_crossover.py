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
    assert "paid at every client count" in (clients_note(_recipe(None), []) or "")
    bare = Recipe(name="r", pair="p", description="d", spec=SpecSettings(types=("draft",)))
    assert clients_note(bare, []) is None
