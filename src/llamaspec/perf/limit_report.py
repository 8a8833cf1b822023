"""What `llamaspec limit` measured, written down: reports/limit-<artifact>.json (the
`LimitReport`'s `to_json()`), a Markdown page beside it and, where matplotlib is installed,
a PNG plot (measured speedup and the bound against α, one line per draft length). The
renderers read the JSON form, so a report file read back renders the same. `run` is the
command whole: the model, the bench reports read, `limit.sweep`, then `write`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llamaspec.engine.artifact import Artifact
from llamaspec.perf import limit
from llamaspec.perf.limit import LimitPlan, LimitReport

HEAD = (
    "γ",
    "α asked",
    "α measured",
    "tokens/round",
    "drafted share",
    "tok/s plain",
    "tok/s synthetic",
    "speedup",
    "bound S",
    "speedup ÷ S",
    "round ms",
    "c (own)",
)
RECIPE_HEAD = (
    "bench report",
    "workload",
    "speedup",
    "α measured",
    "γ",
    "draft cost",
    "ceiling",
    "speedup ÷ ceiling",
)


def _x(value: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{unit}"


def rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [
        (
            str(p["length"]),
            f"{p['alpha']:g}",
            _x(p["measured_alpha"], ".3f"),
            _x(p["mean_length"]),
            _x(p["coverage"], ".0%"),
            f"{p['plain_tps']:.1f}",
            f"{p['spec_tps']:.1f}",
            f"{p['speedup']:.2f}×",
            _x(p["bound"], unit="×"),
            _x(p["over_bound"]),
            _x(p["round_ms"], ".1f"),
            _x(p["c"], ".3f"),
        )
        for p in report["points"]
    ]


def recipe_rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for r in report["recipes"]:
        if r["note"]:
            out.append((r["source"], r["workload"], _x(r["speedup"], unit="×"), r["note"]))
            continue
        out.append(
            (
                r["source"],
                r["workload"],
                _x(r["speedup"], unit="×"),
                _x(r["acceptance"], ".3f"),
                _x(r["length"], ".1f") + (" (extrapolated)" if r.get("extrapolated") else ""),
                _x(r["draft_cost"], ".3f"),
                _x(r["ceiling"], unit="×"),
                _x(r["ratio"]) + (" unreliable bench" if r.get("unreliable") else ""),
            )
        )
    return out


def markdown(report: Mapping[str, Any]) -> str:
    m = report["machine"]
    plan = report["plan"]
    md = [
        f"# Speculation ceiling: {report['artifact_id']}",
        "",
        f"- machine: {m['description']}",
        f"- engine: {report['engine']} {report['commit']} ({report['backend']}), artifact "
        f"`{report['artifact_id']}`, {report['date']}; model {report['model']}",
        f"- synthetic acceptance (benchmarking only: the output is not valid) on ngram-mod "
        f"drafts of exactly γ tokens; medians of {plan['repetitions']} repetition(s) of "
        f"{plan['tokens']} tokens, greedy, plain and synthetic servers taking turns",
        "- bound: S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1)) at the measured α (the α "
        "whose mean tokens per round is the measured one) and c at γ: (fixed + per-token "
        "cost × γ) ÷ (γ × plain decode) where several lengths were swept, else the one c",
        f"- fitted c = {_x(report['c'], '.4f')} (a round costs γc + 1 plain decodes); fixed "
        f"cost per verification round {_x(report['overhead_ms'], '.2f', ' ms')}, per drafted "
        f"token {_x(report['per_token_ms'], '.2f', ' ms')}; plain decode "
        f"{_x(report['plain_ms_per_token'], '.2f', ' ms')} per token",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(r) + " |" for r in rows(report)),
    ]
    if report["recipes"]:
        md += [
            "",
            "## Shipped recipes against the ceiling",
            "",
            "Each bench report's one-client workloads: measured speedup ÷ S(α, γ, c + the "
            "draft's cost), at the workload's own acceptance and mean draft length, with c "
            "the fit above at that γ (extrapolated beyond the longest draft swept). A ratio "
            "marked *unreliable bench* comes from a speedup its own bench report does not "
            "trust (its verdict names why): shown, not a headline.",
            "",
            "| " + " | ".join(RECIPE_HEAD) + " |",
            "|" + "---|" * len(RECIPE_HEAD),
        ]
        for r in recipe_rows(report):
            cells = list(r) if len(r) == len(RECIPE_HEAD) else [*r[:3], r[3], *[""] * 4]
            md.append("| " + " | ".join(cells) + " |")
    md += ["", "Commands:", ""]
    md += [f"- {what}: `{cmd}`" for what, cmd in report["commands"].items()]
    return "\n".join(md) + "\n"


def plot(report: Mapping[str, Any], path: Path) -> bool:
    """Measured speedup (points) and the bound (lines) against α, one colour per γ."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lengths = sorted({p["length"] for p in report["points"]})
    c = report["c"]
    fit = limit.Fit(c, report["overhead_ms"], report["per_token_ms"], report["plain_ms_per_token"])
    for i, g in enumerate(lengths):
        pts = [p for p in report["points"] if p["length"] == g]
        colour = f"C{i}"
        ax.scatter(
            [p["measured_alpha"] or 0.0 for p in pts],
            [p["speedup"] for p in pts],
            color=colour,
            label=f"γ={g} measured",
            zorder=3,
        )
        cg = fit.c_at(g)
        if cg is not None:
            xs = [j / 100 for j in range(0, 100)]
            ax.plot(xs, [limit.bound(x, g, cg) for x in xs], color=colour, label=f"γ={g} bound S")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("acceptance α (measured)")
    ax.set_ylabel("speedup (synthetic ÷ plain tok/s)")
    ax.legend(fontsize=8, ncol=2)
    fig.suptitle(
        f"speculation ceiling — {report['artifact_id']} ({report['engine']} "
        f"{(report['commit'] or '')[:12]}) — {report['model']}\nc = {_x(c, '.3f')}, fixed "
        f"{_x(report['overhead_ms'], '.1f', ' ms')}/round — {report['machine']['description']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(
    result: LimitReport, out_dir: Path, console: Console, stem_name: str | None = None
) -> Path:
    """The report as .json, .md and .png (where matplotlib is), and its table on the console."""
    report = result.to_json()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / (stem_name or f"limit-{report['artifact_id']}")
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(report))
    plotted = plot(report, stem.with_name(stem.name + ".png"))
    table = Table(title=f"speculation ceiling ({report['artifact_id']})")
    for h in HEAD:
        table.add_column(h)
    for r in rows(report):
        table.add_row(*r)
    console.print(table)
    console.print(
        f"limit: c = {_x(report['c'], '.4f')}; fixed cost per verification round "
        f"{_x(report['overhead_ms'], '.2f', ' ms')}, per drafted token "
        f"{_x(report['per_token_ms'], '.2f', ' ms')}"
    )
    if report["recipes"]:
        rt = Table(title="shipped recipes against the ceiling")
        for h in RECIPE_HEAD:
            rt.add_column(h)
        for r in recipe_rows(report):
            rt.add_row(*(list(r) + [""] * (len(RECIPE_HEAD) - len(r))))
        console.print(rt)
    made = ".json, .md and .png" if plotted else ".json and .md (no matplotlib: no plot)"
    console.print(f"limit: wrote {stem}{made}")
    return stem


def run(
    artifact: Artifact,
    model: Path | None,
    plan: LimitPlan,
    benches: Sequence[Path],
    reports: Path,
    console: Console,
) -> LimitReport:
    """`llamaspec limit`: sweep `artifact` with `model` (default: the embedded one), set the
    bench reports `benches` against the ceiling, and write the report into `reports`."""
    from llamaspec.models.embedded import embedded_model

    read = [(b.name, limit.read_bench(b)) for b in benches]  # a bad file fails first
    limit.check_build(artifact, console.print)
    # a sweep of another target is a report of its own (c belongs to one model)
    stem = f"limit-{artifact.id}" + (f"-{model.stem}" if model else "")
    result = limit.sweep(
        artifact,
        model or embedded_model(console.print),
        plan,
        console.print,
        console=console,
        logs=reports / f"{stem}-logs",
        bench_reports=read,
    )
    write(result, reports, console, stem)
    return result
