"""What `llamaspec limit` measured, written down: reports/limit-<artifact>.json (the
`LimitReport`'s `to_json()`), a Markdown page beside it and, where matplotlib is installed,
a PNG plot (measured speedup and its ceiling against α per token, one colour per draft
length). The
renderers read the JSON form, so a report file read back renders the same. `run` is the
command whole: the model, the bench reports read, `limit.sweep`, then `write`."""

from __future__ import annotations

import json
import statistics
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
    "α per token",
    "α block mean",
    "tokens/round",
    "drafted share",
    "tok/s plain",
    "tok/s synthetic",
    "speedup (lowest)",
    "ceiling (at cheapest step)",
    "speedup ÷ ceiling",
    "round, plain decodes",
)
STEP_HEAD = (
    "γ",
    "all accepted: step ms",
    "plain decode ms",
    "r_acc, plain decodes",
    "r_acc lowest–highest",
    "all rejected: step ms",
    "plain decode ms",
    "r_rej, plain decodes",
    "r_rej lowest–highest",
    "c_γ = (r_acc − 1) ÷ γ",
)
RECIPE_HEAD = (
    "bench report",
    "workload",
    "speedup (lowest)",
    "α per token",
    "α block mean",
    "γ",
    "draft cost",
    "step r_acc / r_rej",
    "ceiling (at cheapest step)",
    "speedup ÷ ceiling",
    "at the bench's own steps",
)


def _processes(report: Mapping[str, Any]) -> int:
    """How many server processes timed each end of a step (1 in reports before they were
    counted)."""
    steps = report.get("steps") or []
    return max((len(s["accepted"].get("processes") or ()) for s in steps), default=0) or 1


def _x(value: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{unit}"


def _flag(above: bool, ratio: float | None) -> str:
    if above:
        return " **above beyond noise**"
    return " (above, within noise)" if ratio is not None and ratio > 1.0 else ""


def rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for p in report["points"]:
        own = None if p["c"] is None else 1.0 + p["c"] * p["length"]
        out.append(
            (
                str(p["length"]),
                f"{p['alpha']:g}",
                _x(p.get("alpha_per_token"), ".3f"),
                _x(p["measured_alpha"], ".3f"),
                _x(p["mean_length"]),
                _x(p["coverage"], ".0%"),
                f"{p['plain_tps']:.1f}",
                f"{p['spec_tps']:.1f}",
                f"{p['speedup']:.2f}× ({p['speedup_low']:.2f}×)",
                _x(p["ceiling"], unit="×") + f" ({_x(p['ceiling_high'], unit='×')})",
                _x(p["over_ceiling"]) + _flag(p["above"], p["over_ceiling"]),
                _x(own),
            )
        )
    return out


def _end(t: Mapping[str, Any]) -> tuple[str, ...]:
    """One end of a step: its median ms, plain decode ms, ratio and spread."""
    return (
        f"{statistics.median(t['step_ms']):.1f}",
        f"{statistics.median(t['decode_ms']):.1f}",
        f"{t['ratio']:.3f}",
        f"{t['low']:.3f}–{t['high']:.3f}",
    )


def step_rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [
        (str(s["length"]), *_end(s["accepted"]), *_end(s["rejected"]), f"{s['c']:.3f}")
        for s in report["steps"]
    ]


def recipe_rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for r in report["recipes"]:
        if r["note"] and r["ratio"] is None:
            out.append((r["source"], r["workload"], _x(r["speedup"], unit="×"), r["note"]))
            continue
        out.append(
            (
                r["source"],
                r["workload"],
                _x(r["speedup"], unit="×") + f" ({_x(r.get('speedup_low'), unit='×')})",
                _x(r.get("alpha_per_token"), ".3f"),
                _x(r["acceptance"], ".3f"),
                _x(r["length"], ".1f") + (" (extrapolated)" if r.get("extrapolated") else ""),
                _x(r["draft_cost"], ".3f"),
                _x(r.get("step_ratio"), ".3f") + " / " + _x(r.get("step_ratio_rejected"), ".3f"),
                _x(r["ceiling"], unit="×") + f" ({_x(r.get('ceiling_high'), unit='×')})",
                _x(r["ratio"])
                + _flag(bool(r.get("above")), r["ratio"])
                + (" unreliable bench" if r.get("unreliable") else ""),
                _x(r.get("bench_ceiling"), unit="×") + f" → {_x(r.get('bench_ratio'))}",
            )
        )
    return out


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in body:
        cells = list(r) if len(r) == len(head) else [*r, *[""] * (len(head) - len(r))]
        md.append("| " + " | ".join(cells) + " |")
    return md


def verdict(report: Mapping[str, Any]) -> str:
    """One line: how many points exceed their ceiling, within and beyond noise."""
    pts = [p for p in report["points"] if p["ceiling"] is not None]
    over = sum(1 for p in pts if p["over_ceiling"] is not None and p["over_ceiling"] > 1.0)
    beyond = sum(1 for p in pts if p["above"])
    return (
        f"{over} of {len(pts)} points measured above their ceiling at the median step, "
        f"{beyond} beyond noise"
    )


def _load(report: Mapping[str, Any]) -> list[str]:
    load = report.get("load") or []
    if not load:
        return []
    return [
        f"- host load (1-minute averages, {report['machine'].get('cores', '?')} cores; the "
        f"sweep's own server adds up to its threads): {load[0]:.2f} at the start, "
        f"{min(load):.2f}–{max(load):.2f} over the sweep"
    ]


def markdown(report: Mapping[str, Any]) -> str:
    m = report["machine"]
    plan = report["plan"]
    noise = report["noise"]
    md = [
        f"# Speculation ceiling: {report['artifact_id']}",
        "",
        f"- machine: {m['description']}",
        f"- engine: {report['engine']} {report['commit']} ({report['backend']}), artifact "
        f"`{report['artifact_id']}`, {report['date']}; model {report['model']}",
        f"- synthetic acceptance (benchmarking only: the output is not valid) on ngram-mod "
        f"drafts of exactly γ tokens; medians of {plan['repetitions']} repetition(s) of "
        f"{plan['tokens']} tokens, greedy, plain and synthetic servers taking turns",
        "- ceiling: the speedup of a perfect engine of the measured costs over each run's own "
        "counts: a plain decode for each step without a draft, and for each drafted round "
        "of g tokens that accepted k of them r_rej(g) + (r_acc(g) − r_rej(g)) · k ÷ g plain "
        "decodes (+ the draft's cost per drafted token for a bench report). The verification "
        "step is timed on its own at its two ends: r_acc, a server whose every round drafts "
        "exactly γ tokens and accepts them all (γ + 1 tokens emitted), and r_rej, one whose "
        "every round drafts the same γ, verifies them in one batch and rejects them all (1 "
        f"emitted); {plan['step_repetitions']} samples of each in each of "
        f"{_processes(report)} server processes started in turn, each sample between two "
        "plain samples and set against their mean decode. The server works per emitted token, so "
        "a round is priced linearly in what it accepted between the two ends; nothing is "
        "fitted. At full coverage the ceiling is L / (r_rej + (r_acc − r_rej)(L − 1) ÷ γ) "
        "with L = (1 − α^(γ+1)) / (1 − α), one pair of ratios per length",
        "- α per token: accepted ÷ drafted; α block mean: the α whose (1 − α^(γ+1)) / (1 − α) "
        "is the measured tokens per round",
        f"- noise: the step's ratios r_acc and r_rej spread by up to "
        f"{_x(noise['step'], '.0%')} of their medians between repetitions (the same server "
        "started again ran up to "
        f"{_x(noise.get('step_processes'), '.0%')} away from itself), a point's lowest "
        "repetition lay up to "
        f"{_x(noise['speedup'], '.0%')} below its median speedup. A row is above its "
        "ceiling beyond noise only when its lowest repetition's speedup exceeds the ceiling "
        "at the cheapest repetitions of the steps (in brackets) by more than the step's "
        "server, started again, ran from itself at that length: the point runs in a server "
        "process of its own",
        *_load(report),
        f"- {verdict(report)}",
        f"- summaries of the all-accepted steps (no ceiling uses them): least-squares c = "
        f"{_x(report['c'], '.4f')}; step − plain decode ≈ "
        f"{_x(report['overhead_ms'], '.2f', ' ms')} + "
        f"{_x(report['per_token_ms'], '.2f', ' ms')} per drafted token; plain decode "
        f"{_x(report['plain_ms_per_token'], '.2f', ' ms')} per token (median of the points)",
        "",
        "## The verification step, timed on its own",
        "",
        *_table(STEP_HEAD, step_rows(report)),
        "",
        "## Synthetic acceptance against the ceiling",
        "",
        *_table(HEAD, rows(report)),
    ]
    notes = [p for p in report["points"] if p["note"]]
    if notes:
        md += ["", "Rows above their ceiling beyond noise:", ""]
        md += [f"- γ = {p['length']}, α = {p['alpha']:g}: {p['note']}" for p in notes]
    if report["recipes"]:
        md += [
            "",
            "## Shipped recipes against the ceiling",
            "",
            "Each bench report's one-client workloads: measured speedup ÷ the perfect "
            "engine's over the workload's own counts, at its mean draft length g's measured "
            "steps (each end interpolated between the lengths timed): drafts · r_rej(g) + "
            "accepted · (r_acc(g) − r_rej(g)) ÷ g + plain steps + the draft's cost per "
            "drafted token (the bench cost model's `draft_cost_ratio`, 0 for n-gram drafts). "
            "A ratio marked "
            "*unreliable bench* comes from a speedup its own bench report does not trust "
            "(its verdict names why): shown, not a headline. The last column is the same "
            "perfect engine at the verification steps the bench run timed itself (its cost "
            "model's `verify_ratio`, taken at the time of its speedup; all accepted, so there "
            "a round is priced at it whatever it accepted), and the ratio to it.",
            "",
            *_table(RECIPE_HEAD, recipe_rows(report)),
        ]
        above = [r for r in report["recipes"] if r.get("above")]
        md += [f"\n- {r['workload']} ({r['source']}): {r['note']}" for r in above]
    md += ["", "Commands:", ""]
    md += [f"- {what}: `{cmd}`" for what, cmd in report["commands"].items()]
    return "\n".join(md) + "\n"


def plot(report: Mapping[str, Any], path: Path) -> bool:
    """Measured speedup (filled) and its ceiling (hollow, joined) against α per token, one
    colour per γ."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lengths = sorted({p["length"] for p in report["points"]})
    for i, g in enumerate(lengths):
        pts = [p for p in report["points"] if p["length"] == g]
        pts.sort(key=lambda p: p.get("alpha_per_token") or 0.0)
        colour = f"C{i}"
        xs = [p.get("alpha_per_token") or 0.0 for p in pts]
        ax.scatter(xs, [p["speedup"] for p in pts], color=colour, label=f"γ={g} measured", zorder=3)
        ceil = [(x, p["ceiling"]) for x, p in zip(xs, pts, strict=True) if p["ceiling"]]
        if ceil:
            ax.plot(
                [x for x, _ in ceil],
                [c for _, c in ceil],
                color=colour,
                marker="o",
                markerfacecolor="none",
                label=f"γ={g} ceiling",
            )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("acceptance α per drafted token (accepted ÷ drafted)")
    ax.set_ylabel("speedup (synthetic ÷ plain tok/s)")
    ax.legend(fontsize=8, ncol=2)
    fig.suptitle(
        f"speculation ceiling — {report['artifact_id']} ({report['engine']} "
        f"{(report['commit'] or '')[:12]}) — {report['model']}\n{verdict(report)} — "
        f"{report['machine']['description']}",
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
    return write_json(result.to_json(), out_dir, console, stem_name)


def write_json(
    report: Mapping[str, Any], out_dir: Path, console: Console, stem_name: str | None = None
) -> Path:
    """`write` for a report already in its JSON form (a sweep read back renders the same)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / (stem_name or f"limit-{report['artifact_id']}")
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(report))
    plotted = plot(report, stem.with_name(stem.name + ".png"))
    for title, head, body in (
        ("the verification step, all accepted and all rejected", STEP_HEAD, step_rows(report)),
        (f"speculation ceiling ({report['artifact_id']})", HEAD, rows(report)),
        ("shipped recipes against the ceiling", RECIPE_HEAD, recipe_rows(report)),
    ):
        if not body:
            continue
        table = Table(title=title)
        for h in head:
            table.add_column(h)
        for r in body:
            table.add_row(*(list(r) + [""] * (len(head) - len(r))))
        console.print(table)
    console.print(f"limit: {verdict(report)}")
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
    # a sweep of another target, or at other server threads, is a report of its own (the
    # steps belong to one model and one setting)
    stem = f"limit-{artifact.id}" + (f"-{model.stem}" if model else "")
    stem += f"-t-{plan.threads}" if plan.threads else ""
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
