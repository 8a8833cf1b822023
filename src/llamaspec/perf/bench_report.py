"""What `llamaspec bench` measured: the frozen report, and its renderings.

A `BenchReport` holds every `Cell` (one workload at one concurrency: its `Sample`s and their
summary); its `to_json()` is reports/bench-<name>-<artifact>.json. The renderers read that
JSON form, so a report file read back renders the same: `markdown` (the .md beside it),
`plot` (the .png: speedups and the accepted-length histogram, where matplotlib is
installed), and `head`/`rows` (the table, also printed on the console); `write` writes all
three. perf.bench runs the measurement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Sample:
    """One run of a workload on one server: all clients together."""

    tokens: int
    tokens_per_second: float  # Σ over clients of tokens ÷ decode time
    wall_seconds: float
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0
    per_pos: tuple[float, ...] = ()


@dataclass(frozen=True)
class Cell:
    """One workload at one concurrency: its samples and (once measured) their summary."""

    workload: str
    concurrency: int
    plain: tuple[Sample, ...] = ()
    spec: tuple[Sample, ...] = ()  # first exposure, a fresh server each
    warm: tuple[Sample, ...] = ()  # the same workload again (KEEPS_STATE)
    summary: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchReport:
    """What `bench` measured, where and how; `to_json()` is the report file's content (its
    fields are the report's keys, in the same order)."""

    recipe: str
    artifact_id: str
    engine: str | None
    commit: str | None
    backend: str | None
    machine: Mapping[str, Any]
    date: str
    types: tuple[str, ...]
    spec_args: tuple[str, ...]
    commands: Mapping[str, str]
    models: Mapping[str, str | None]  # target, draft: file names
    repetitions: int
    concurrency: tuple[int, ...]
    exposure: str
    keeps_state: tuple[str, ...]
    workloads: tuple[Cell, ...]
    cost_model: Mapping[str, Any] | None
    wall_seconds: float

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "artifact_id": self.artifact_id,
            "engine": self.engine,
            "commit": self.commit,
            "backend": self.backend,
            "machine": dict(self.machine),
            "date": self.date,
            "types": list(self.types),
            "spec_args": list(self.spec_args),
            "commands": dict(self.commands),
            "models": dict(self.models),
            "repetitions": self.repetitions,
            "concurrency": list(self.concurrency),
            "exposure": self.exposure,
            "keeps_state": list(self.keeps_state),
            "workloads": [asdict(cell) for cell in self.workloads],
            "cost_model": None if self.cost_model is None else dict(self.cost_model),
            "wall_seconds": self.wall_seconds,
        }


HEAD = (
    "workload",
    "clients",
    "tok/s plain",
    "tok/s spec",
    "speedup",
    "drafted",
    "accepted",
    "acc. per draft",
    "expected",
    "measured/expected",
)
_NO_EXPOSURE = "not recorded (a report from before first-exposure runs)"
# Where the method keeps state across requests: the same workload again on the same server.
WARM_HEAD = ("warm speedup", "warm acc. per draft", "warm expected")


# The renderers below read a report's JSON form (`BenchReport.to_json()`, or a report file).


def head(report: Mapping[str, Any]) -> tuple[str, ...]:
    return HEAD + WARM_HEAD if report.get("keeps_state") else HEAD


def _x(value: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{unit}"


def rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for w in report["workloads"]:
        s = w["summary"]
        pspread, sspread = s["plain_tps_spread"], s["spec_tps_spread"]
        row = (
            w["workload"],
            str(w["concurrency"]),
            f"{s['plain_tps_median']:.1f} ({pspread[0]:.0f}–{pspread[1]:.0f})",
            f"{s['spec_tps_median']:.1f} ({sspread[0]:.0f}–{sspread[1]:.0f})",
            f"{s['speedup']:.2f}×",
            str(s["drafted"]),
            str(s["accepted"]),
            _x(s["mean_accepted_length"]),
            _x(s["expected_speedup"], unit="×"),
            _x(s["measured_over_expected"]),
        )
        if report.get("keeps_state"):
            row += (
                _x(s.get("warm_speedup"), unit="×"),
                _x(s.get("warm_mean_accepted_length")),
                _x(s.get("warm_expected_speedup"), unit="×"),
            )
        out.append(row)
    return out


def markdown(report: Mapping[str, Any]) -> str:
    m = report["machine"]
    md = [
        f"# Bench: {report['recipe']} on {report['artifact_id']}",
        "",
        f"- machine: {m['description']}",
        f"- engine: {report['engine']} {report['commit']} ({report['backend']}), artifact "
        f"`{report['artifact_id']}`, {report['date']}",
        f"- speculation: `{' '.join(report['spec_args'])}` ({', '.join(report['types'])})",
        f"- models: {report['models']['target']}"
        + (f", draft {report['models']['draft']}" if report["models"]["draft"] else ""),
        f"- medians of {report['repetitions']} repetitions (spread: min–max); tokens/s is "
        "decode speed summed over clients; exact token budgets (EOS ignored), greedy",
        f"- exposure: {report.get('exposure', _NO_EXPOSURE)}"
        + (
            "; the headline speedup is first exposure, the warm columns are a prompt seen before"
            if report.get("keeps_state")
            else ""
        ),
        "",
        "Commands (same binary, run side by side):",
        "",
    ]
    md += [f"- {what}: `{cmd}`" for what, cmd in report["commands"].items()]
    md += ["", "| " + " | ".join(head(report)) + " |", "|" + "---|" * len(head(report))]
    md += ["| " + " | ".join(r) + " |" for r in rows(report)]
    cm = report.get("cost_model")
    if cm:
        md += [
            "",
            "## Cost model (measured on this machine)",
            "",
            f"- target batch of k tokens ÷ one (T(k)/T(1), prompt path after a cached "
            f"{cm['prefix_tokens']}-token prefix): "
            + ", ".join(f"k={k}: {v}" for k, v in cm["batch_ratio"].items()),
            *(
                [
                    "- one verification step of k tokens (k − 1 drafted, all accepted, logits at "
                    "every position) ÷ a plain decode timed just before it: "
                    + ", ".join(f"k={k}: {v}" for k, v in cm["verify_ratio"].items())
                    + "; the prediction prices steps with these"
                ]
                if cm.get("verify_ratio")
                else ["- the prediction prices steps with the prompt batches above"]
            ),
            f"- one decoded token: {cm['decode_ms_per_token']} ms; draft cost per token ÷ "
            f"target decode: {cm['draft_cost_ratio']}",
            f"- memory bandwidth (numpy copy): {cm['memory_bandwidth_gb_s']} GB/s; target "
            f"{cm['model_bytes'] / 1e6:.0f} MB → plain-decoding limit "
            f"{cm['plain_decode_limit_tps']} tok/s"
            if cm.get("memory_bandwidth_gb_s")
            else f"- plain-decoding limit: not estimated ({report.get('backend')} backend: the "
            "weights are in device memory, whose bandwidth this bench does not measure)",
            "",
            "| workload | acceptance by draft position | accepted-length histogram | "
            "where the rest goes |",
            "|---|---|---|---|",
        ]
        for w in report["workloads"]:
            if w["concurrency"] != 1:
                continue
            s = w["summary"]
            pos = ", ".join(f"{x:.2f}" for x in s["acceptance_by_position"][:12]) or "—"
            hist = ", ".join(map(str, s["accepted_length_histogram"][:17])) or "—"
            md.append(f"| {w['workload']} | {pos} | {hist} | {s['where_the_rest_goes']} |")
    return "\n".join(md) + "\n"


def write(
    result: BenchReport, out_dir: Path, console: Console, stem_name: str | None = None
) -> Path:
    """The report as .json (`result.to_json()`), .md and .png, and its table on the console."""
    report = result.to_json()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / (stem_name or f"bench-{report['recipe']}-{report['artifact_id']}")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))
    plotted = plot(report, stem.with_suffix(".png"))
    table = Table(title=f"bench: {report['recipe']} ({report['artifact_id']})")
    for h in head(report):
        table.add_column(h)
    for r in rows(report):
        table.add_row(*r)
    console.print(table)
    for what, cmd in report["commands"].items():
        console.print(f"bench: {what}: {cmd}")
    made = ".json, .md and .png" if plotted else ".json and .md (no matplotlib: no plot)"
    console.print(f"bench: wrote {stem}{made}")
    return stem


def plot(report: Mapping[str, Any], path: Path) -> bool:
    """Speedup per workload (measured and expected) and the accepted-length histogram."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, hx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    names = sorted({w["workload"] for w in report["workloads"]}, key=_order(report))
    levels = report["concurrency"]
    width = 0.8 / (len(levels) + 1)
    xs = list(range(len(names)))
    by = {(w["workload"], w["concurrency"]): w["summary"] for w in report["workloads"]}
    for i, c in enumerate(levels):
        ax.bar(
            [x + i * width for x in xs],
            [by[(n, c)]["speedup"] for n in names],
            width=width,
            label=f"first exposure, {c} client{'s' if c > 1 else ''}",
        )
    warm = [by.get((n, min(levels)), {}).get("warm_speedup") or 0 for n in names]
    if any(warm):
        ax.scatter(
            [x + (len(levels) - 1) * width / 2 for x in xs],
            warm,
            marker="_",
            s=400,
            color="black",
            label=f"warm (same prompt again), {min(levels)} client(s)",
            zorder=3,
        )
    expected = [by.get((n, 1), {}).get("expected_speedup") or 0 for n in names]
    if any(expected):
        ax.bar(
            [x + len(levels) * width for x in xs],
            expected,
            width=width,
            label="expected (cost model, 1 client)",
            alpha=0.5,
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + width * len(levels) / 2 for x in xs], names, rotation=30, ha="right")
    ax.set_ylabel("speedup (spec ÷ plain tok/s)")
    ax.legend(fontsize=8)
    hist: list[int] = []
    for w in report["workloads"]:
        if w["concurrency"] == min(levels):
            for j, n in enumerate(w["summary"]["accepted_length_histogram"]):
                hist += [0] * (j + 1 - len(hist))
                hist[j] += n
    hx.bar(range(len(hist)), hist)
    hx.set_xlabel("draft tokens accepted in a step")
    hx.set_ylabel("steps (all workloads)")
    hx.set_title("accepted-length histogram")
    fig.suptitle(
        f"{report['recipe']} — {report['artifact_id']} ({report['engine']} "
        f"{(report['commit'] or '')[:12]}) — {report['machine']['description']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _order(report: Mapping[str, Any]) -> Callable[[str], int]:
    seen: list[str] = []
    for w in report["workloads"]:
        if w["workload"] not in seen:
            seen.append(w["workload"])
    return seen.index
