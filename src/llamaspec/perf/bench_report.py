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
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llamaspec.perf import crossover, reliability


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
    returned: int | None = None  # tokens the clients received (None: a report from before)


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
    # the machine's load around the run (perf.reliability.HostLoad.to_json()); None: not taken
    host_load: Mapping[str, Any] | None = None
    # perf.reliability.Verdict.to_json() on this report: reliable, reasons, notes, flagged
    reliability: Mapping[str, Any] = field(default_factory=dict)

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
            "workloads": [_cell_json(cell) for cell in self.workloads],
            "cost_model": None if self.cost_model is None else dict(self.cost_model),
            "wall_seconds": self.wall_seconds,
            "host_load": None if self.host_load is None else dict(self.host_load),
            "reliability": dict(self.reliability),
        }


def _cell_json(cell: Cell) -> dict:
    """A cell as JSON; a sample's `returned` only where it was counted, so that a report
    from before it reads back byte for byte."""
    out = asdict(cell)
    for which in ("plain", "spec", "warm"):
        for sample in out[which]:
            if sample["returned"] is None:
                del sample["returned"]
    return out


HEAD = (
    "workload",
    "clients",
    "tok/s plain",
    "tok/s spec",
    "speedup (min–max)",
    "drafted",
    "accepted",
    "acc. per draft",
    "expected",
    "measured/expected",
)
_NO_EXPOSURE = "not recorded (a report from before first-exposure runs)"
# Where the method keeps state across requests: the same workload again on the same server.
WARM_HEAD = ("warm speedup (min–max)", "warm acc. per draft", "warm expected")


# The renderers below read a report's JSON form (`BenchReport.to_json()`, or a report file).


def head(report: Mapping[str, Any]) -> tuple[str, ...]:
    return HEAD + WARM_HEAD if report.get("keeps_state") else HEAD


def _x(value: float | None, fmt: str = ".2f", unit: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{unit}"


def verdict(report: Mapping[str, Any]) -> Mapping[str, Any]:
    """The report's reliability verdict (judged now for a report from before verdicts;
    none for a fragment without its repetitions)."""
    if report.get("reliability"):
        return report["reliability"]
    return reliability.judge(report).to_json() if "repetitions" in report else {}


def _flagged(report: Mapping[str, Any], key: str = "flagged") -> set[tuple[str, int]]:
    """The cells whose first-exposure (`flagged`) or warm (`flagged_warm`) figures the
    verdict marks."""
    return {(f["workload"], f["concurrency"]) for f in verdict(report).get(key, ())}


def unreliable_cells(report: Mapping[str, Any]) -> set[tuple[str, int]]:
    """The (workload, clients) cells whose first-exposure speedup the verdict does not trust
    (none where the run is reliable)."""
    return set() if verdict(report).get("reliable", True) else _flagged(report)


def _speedup(value: float | None, per_rep: list[float], unreliable: bool) -> str:
    """A speedup with its repetitions' min–max (where the report has the samples), marked
    where the run or the cell cannot be trusted."""
    if value is None:
        return "—"
    text = f"{value:.2f}×"
    if per_rep:
        text += f" ({min(per_rep):.2f}–{max(per_rep):.2f})"
    return text + (" unreliable" if unreliable else "")


def hardware(report: Mapping[str, Any]) -> str:
    """The machine line that every absolute tok/s stands beside: CPU, cores, GPUs, the
    server's threads and the load around the run."""
    text = report["machine"]["description"]
    load = report.get("host_load")
    if not load:
        return text + "; server threads and load not recorded"
    t = load.get("server_threads")
    text += f"; server threads: {t if t else 'its default (all cores)'}"
    samples = [x for x in (load.get("before"), *load.get("during", ()), load.get("after"))
               if x is not None]  # fmt: skip
    if samples:
        text += (
            f"; load: {reliability.before_text(load)}, at most {max(samples)} during and "
            f"{load.get('after')} after (1-minute averages), on {load['cpus']} CPUs"
        )
    return text


def headline(report: Mapping[str, Any]) -> str:
    """One line: the first-exposure speedups at the lowest concurrency, or, for a run that
    cannot be trusted, that it cannot and why (no speedup then)."""
    v = verdict(report)
    if not v.get("reliable"):
        return "unreliable: " + "; ".join(v.get("reasons", ())) + " (no headline speedup)"
    low = min(report["concurrency"]) if report["concurrency"] else 1
    cells = [w for w in report["workloads"] if w["concurrency"] == low]
    values = [w["summary"]["speedup"] for w in cells if w["summary"].get("speedup")]
    if not values:
        return "no speedup measured"
    geo = math.exp(sum(math.log(x) for x in values) / len(values))
    per_rep = [x for w in cells for x in reliability.cell_speedups(w)]
    spread = f", repetitions {min(per_rep):.2f}–{max(per_rep):.2f}×" if per_rep else ""
    return (
        f"first exposure, {low} client{'s' if low != 1 else ''}: {min(values):.2f}–"
        f"{max(values):.2f}× by workload, geometric mean {geo:.2f}× (medians of "
        f"{report['repetitions']} repetitions{spread})"
    )


def rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    flagged, flagged_warm = _flagged(report), _flagged(report, "flagged_warm")
    for w in report["workloads"]:
        s = w["summary"]
        bad = (w["workload"], w["concurrency"]) in flagged
        pspread, sspread = s["plain_tps_spread"], s["spec_tps_spread"]
        row = (
            w["workload"],
            str(w["concurrency"]),
            f"{s['plain_tps_median']:.1f} ({pspread[0]:.0f}–{pspread[1]:.0f})",
            f"{s['spec_tps_median']:.1f} ({sspread[0]:.0f}–{sspread[1]:.0f})",
            _speedup(s["speedup"], reliability.cell_speedups(w), bad),
            str(s["drafted"]),
            str(s["accepted"]),
            _x(s["mean_accepted_length"]),
            _x(s["expected_speedup"], unit="×"),
            _x(s["measured_over_expected"]),
        )
        if report.get("keeps_state"):
            row += (
                _speedup(
                    s.get("warm_speedup"),
                    reliability.cell_speedups(w, "warm"),
                    bad or (w["workload"], w["concurrency"]) in flagged_warm,
                ),
                _x(s.get("warm_mean_accepted_length")),
                _x(s.get("warm_expected_speedup"), unit="×"),
            )
        out.append(row)
    return out


def verdict_lines(report: Mapping[str, Any]) -> list[str]:
    """The verdict as Markdown: the headline when the run can be trusted, else the reasons
    it cannot (and no headline); what could not be checked either way."""
    v = verdict(report)
    if v.get("reliable"):
        out = [f"**Headline** — {headline(report)}."]
    else:
        out = [
            "**Unreliable: no headline.** The speedups below are shown for the record and "
            "marked; rerun on a quiet machine. Reasons:",
            "",
            *(f"- {r}" for r in v.get("reasons", ())),
        ]
    warnings = v.get("warnings", ())
    if warnings:
        out += ["", "Warm figures marked unreliable (not the headline):", ""]
        out += [f"- {w}" for w in warnings]
    notes = v.get("notes", ())
    return out + (["", "Not checked: " + "; ".join(notes) + "."] if notes else [])


def _cost_model_line(report: Mapping[str, Any]) -> list[str]:
    """Without a cost model: what was skipped, and where the counters came from."""
    if report.get("cost_model"):
        return []
    came = {w["summary"].get("counters_from") for w in report["workloads"]} - {None}
    source = (
        f" (from {', '.join(sorted(came))})"
        if came
        else " (from the server's /metrics, or the replies' timings where it has none)"
    )
    return [
        "- cost model: skipped (`--no-cost-model`): no expected speedups and no plain-speed "
        f"estimate; the speculative counters were read as usual{source}: the drafted and "
        "accepted columns"
    ]


def markdown(report: Mapping[str, Any]) -> str:
    md = [
        f"# Bench: {report['recipe']} on {report['artifact_id']}",
        "",
        *verdict_lines(report),
        "",
        f"- machine: {hardware(report)} (every tok/s below was measured here)",
        f"- engine: {report['engine']} {report['commit']} ({report['backend']}), artifact "
        f"`{report['artifact_id']}`, {report['date']}",
        f"- speculation: `{' '.join(report['spec_args'])}` ({', '.join(report['types'])})",
        f"- models: {report['models']['target']}"
        + (f", draft {report['models']['draft']}" if report["models"]["draft"] else ""),
        f"- medians of {report['repetitions']} repetitions, plain and speculative in turn "
        "within each; tok/s spread: min–max; speedup spread: min–max of each repetition's own "
        "ratio; tokens/s is decode speed summed over clients; exact token budgets (EOS "
        "ignored), greedy",
        f"- exposure: {report.get('exposure', _NO_EXPOSURE)}"
        + (
            "; the headline speedup is first exposure, the warm columns are a prompt seen before"
            if report.get("keeps_state")
            else ""
        ),
        *_cost_model_line(report),
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
    priced = crossover.price(report)
    if priced is not None:
        md += crossover.markdown(priced)
    return "\n".join(md) + "\n"


def write(
    result: BenchReport, out_dir: Path, console: Console, stem_name: str | None = None
) -> Path:
    """The report as .json (`result.to_json()`), .md and .png, and its table on the console."""
    report = result.to_json()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / (stem_name or f"bench-{report['recipe']}-{report['artifact_id']}")
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(report))
    plotted = plot(report, stem.with_name(stem.name + ".png"))
    table = Table(
        title=f"bench: {report['recipe']} ({report['artifact_id']})",
        caption=f"tok/s on {hardware(report)}",
    )
    for h in head(report):
        table.add_column(h)
    for r in rows(report):
        table.add_row(*r)
    console.print(table)
    v = verdict(report)
    if v.get("reliable"):
        console.print(f"bench: {headline(report)}")
    else:
        console.print("bench: [bold red]unreliable[/]: no headline speedup; rerun on a quiet "
                      "machine. Reasons:")  # fmt: skip
        for r in v.get("reasons", ()):
            console.print(f"  - {r}", markup=False, highlight=False)
    for warning in v.get("warnings", ()):
        console.print(f"bench: warm figure marked unreliable: {warning}", markup=False,
                      highlight=False)  # fmt: skip
    for note in v.get("notes", ()):
        console.print(f"bench: not checked: {note}", markup=False, highlight=False)
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
    unreliable = "" if verdict(report).get("reliable") else "UNRELIABLE (see the report) — "
    fig.suptitle(
        f"{unreliable}{report['recipe']} — {report['artifact_id']} ({report['engine']} "
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
