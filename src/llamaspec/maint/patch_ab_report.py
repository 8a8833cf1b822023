"""The report of `llamaspec patches ab` (maint/patch_ab.py): JSON as measured, a Markdown
table of patched ÷ stock per scenario, and a PNG of the same ratios (where matplotlib is
installed). The title names the two builds; every command line is in it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from llamaspec.perf import reliability


def stem(report: Mapping[str, Any], out_dir: Path) -> Path:
    return out_dir / f"patches-ab-{report['patched']['id']}-vs-{report['stock']['id']}"


def _x(value: float | None) -> str:
    return f"{value:.2f}×" if isinstance(value, (int, float)) else "–"


def _goal(row: Mapping[str, Any]) -> str:
    return "met" if row.get("goal_met") else "**missed**"


def markdown(report: Mapping[str, Any]) -> str:
    rel = report["reliability"]
    p, s = report["patched"], report["stock"]
    machine = report["machine"]
    machine = machine.get("description", machine) if isinstance(machine, Mapping) else machine
    lines = [
        f"# Patched vs stock: {p['id']} vs {s['id']}",
        "",
        f"{report['engine']} {str(report['commit'])[:12]} ({report['backend']}), "
        f"{machine}, {report['date']}. Patched: the default build, with "
        f"{', '.join(p['patches']) or 'no patch'} applied; stock: the same pin built with "
        f"`--no-default-patches`. {report['repetitions']} repetition(s), the arms in turn "
        f"(order reversed every repetition); exposure: {report['exposure']}. Measure: "
        f"{report['measure']}. Wall time of the run: {report['wall_seconds']} s.",
        "",
    ]
    if report["repetitions"] < 2:
        lines.append(
            "Reliability: **not judged**: one repetition gives no spread to judge; run "
            "`--repetitions 3` for figures to quote."
        )
    elif rel["reliable"]:
        lines.append(
            "Reliability: **reliable** (patched ÷ stock per repetition within "
            f"{rel['spread_max']}× of each other; the machine was quiet enough)."
        )
    else:
        lines.append("Reliability: **UNRELIABLE**: " + "; ".join(rel["reasons"]))
    lines += [
        "",
        "| scenario | patch | traffic | stock tok/s | patched tok/s | patched ÷ stock "
        "(per repetition) | plain tok/s | stock ÷ plain | patched ÷ plain | goal |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["scenarios"]:
        arms = row["arms"]
        plain = arms.get("plain")
        per = ", ".join(f"{r:.2f}" for r in row["patched_over_stock_by_repetition"])
        lines.append(
            f"| {row['name']} | {row['patch'] or '(health)'} | {'; '.join(row['traffic'])} "
            f"| {arms['stock']['tps_median']} | {arms['patched']['tps_median']} "
            f"| **{_x(row['patched_over_stock'])}** ({per}) "
            f"| {plain['tps_median'] if plain else '–'} "
            f"| {_x(row['over_plain'].get('stock'))} | {_x(row['over_plain'].get('patched'))} "
            f"| {_goal(row)}: {row['goal']} |"
        )
    lines += ["", "## Drafting per arm", ""]
    lines += ["| scenario | arm | tokens | drafted | accepted |", "|---|---|---|---|---|"]
    for row in report["scenarios"]:
        for arm, a in row["arms"].items():
            lines.append(
                f"| {row['name']} | {arm} | {a['tokens']} | {a['drafted']} | {a['accepted']} |"
            )
    lines += ["", "## Questions and commands", ""]
    for row in report["scenarios"]:
        kind = "reference" if row.get("family") else "recipe"
        lines += [f"**{row['name']}** ({kind} `{row['recipe']}`): {row['question']}", ""]
        lines += [f"- {arm}: `{cmd}`" for arm, cmd in row["commands"].items()]
        if row["reasons"]:
            lines.append(f"- unreliable: {'; '.join(row['reasons'])}")
        lines.append("")
    load = report["host_load"]
    lines.append(
        f"Host load: {reliability.before_text(load)}; during {load['during']}; after "
        f"{load['after']} (1-minute averages); {load['cpus']} CPUs."
    )
    return "\n".join(lines) + "\n"


def plot(report: Mapping[str, Any], path: Path) -> bool:
    """patched ÷ stock per scenario, each repetition a dot, the median a bar."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["scenarios"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows)), 4))
    for i, row in enumerate(rows):
        ax.bar(i, row["patched_over_stock"] or 0.0, color="#4c72b0", alpha=0.7)
        per = row["patched_over_stock_by_repetition"]
        ax.scatter([i] * len(per), per, color="black", s=12, zorder=3)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("patched ÷ stock (tokens/s of wall time)")
    ax.set_title(f"{report['patched']['id']} vs stock {report['stock']['id']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(report: Mapping[str, Any], out_dir: Path, console: Console) -> Path:
    """The report as .json, .md and .png; the table's verdict on the console."""
    base = stem(report, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = base.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(base.with_suffix(".json"))
    base.with_suffix(".md").write_text(markdown(report))
    plotted = plot(report, base.with_suffix(".png"))
    for row in report["scenarios"]:
        console.print(
            f"patches ab: {row['name']}: patched ÷ stock {_x(row['patched_over_stock'])} "
            f"(goal {'met' if row['goal_met'] else 'missed'}: {row['goal']})"
        )
    verdict = "reliable" if report["reliability"]["reliable"] else "UNRELIABLE"
    if report["repetitions"] < 2:
        verdict = "reliability not judged (one repetition)"
    made = ".json, .md and .png" if plotted else ".json and .md (no matplotlib: no plot)"
    console.print(f"patches ab: {verdict}; wrote {base}{made}")
    return base
