"""Speedup benchmark: the same binary with and without speculation, on three workloads.

Writes reports/bench-<recipe>-<artifact>.json, a Markdown table and a PNG bar chart.
Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from llamaspec.engine.build import Artifact
from llamaspec.models import dialects
from llamaspec.proof import smoke, verify
from llamaspec.proof.client import Server, running
from llamaspec.proof.smoke import Prompt

CODE_REWRITE = Prompt("code-rewrite", verify.VERIFY_PROMPTS[3].text, 160)
PROSE = Prompt(
    "prose",
    "Write a short story about a lighthouse keeper who finds a message in a bottle. "
    "Describe the sea, the weather and what the message says.\n\n",
    160,
)


@dataclass
class Sample:
    tokens_per_second: float
    tokens: int
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0


@dataclass
class WorkloadResult:
    workload: str
    plain: list[Sample] = field(default_factory=list)
    spec: list[Sample] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def expected_speedup(a: float, g: int, c: float) -> float:
    """(1 − a^(g+1)) / ((1 − a)(g·c + 1)) for acceptance a, draft length g, cost ratio c."""
    if a >= 1.0:
        return (g + 1) / (g * c + 1)
    return (1 - a ** (g + 1)) / ((1 - a) * (g * c + 1))


_DRAFTS = re.compile(r"^llamacpp:spec_decode_num_drafts_total\s+([0-9.e+]+)", re.M)


def _drafts_counter(server: Server) -> float | None:
    try:
        text = httpx.get(server.url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    m = _DRAFTS.search(text)
    return float(m.group(1)) if m else None


def _measure(server: Server, prompt: Prompt) -> tuple[Sample, str]:
    """One request: its sample (drafts counted from /metrics) and the generated text."""
    before = _drafts_counter(server)
    c = smoke.complete(server, prompt)
    after = _drafts_counter(server)
    drafts = int(after - before) if before is not None and after is not None else 0
    sample = Sample(
        c.predicted_per_second, len(c.tokens), c.draft_n or 0, c.draft_accepted or 0, drafts
    )
    return sample, c.text


def _sample(server: Server, prompt: Prompt) -> Sample:
    return _measure(server, prompt)[0]


def conversation(server: Server, turns: Sequence[str], n_predict: int) -> list[Sample]:
    """The four-turn coding conversation: each turn carries the history and past answers."""
    history, samples = "", []
    for turn in turns:
        prompt = Prompt("turn", f"{history}User: {turn}\nAssistant:", n_predict)
        sample, text = _measure(server, prompt)
        samples.append(sample)
        history = f"{prompt.text}{text}\n"
    return samples


def _median_tps(samples: Sequence[Sample]) -> float:
    return statistics.median(s.tokens_per_second for s in samples) if samples else 0.0


def summarize(w: WorkloadResult, g: int, cost_ratio: float) -> dict:
    plain, spec = _median_tps(w.plain), _median_tps(w.spec)
    drafted = sum(s.drafted for s in w.spec)
    accepted = sum(s.accepted for s in w.spec)
    drafts = sum(s.drafts for s in w.spec)
    a = accepted / drafted if drafted else 0.0
    expected = expected_speedup(a, g, cost_ratio)
    speedup = spec / plain if plain else 0.0
    return {
        "plain_tps_median": round(plain, 2),
        "spec_tps_median": round(spec, 2),
        "plain_tps_spread": [
            round(min(s.tokens_per_second for s in w.plain), 2),
            round(max(s.tokens_per_second for s in w.plain), 2),
        ],
        "spec_tps_spread": [
            round(min(s.tokens_per_second for s in w.spec), 2),
            round(max(s.tokens_per_second for s in w.spec), 2),
        ],
        "speedup": round(speedup, 3),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": round(a, 4),
        "mean_accepted_length": round(accepted / drafts, 3) if drafts else None,
        "expected_speedup": round(expected, 3),
        "measured_over_expected": round(speedup / expected, 3) if expected else None,
    }


def bench(
    artifact: Artifact,
    dialect: str,
    target: Path,
    settings: dialects.SpecSettings,
    recipe: str,
    out_dir: Path,
    console: Console,
    repetitions: int = 3,
) -> dict:
    """Run every workload `repetitions` times with and without speculation; write reports."""
    spec_argv = dialects.spec_args(dialect, settings)
    base = [*smoke.base_args(target), "--metrics"]
    workloads = ("code-rewrite", "prose", "conversation")
    results = {w: WorkloadResult(w) for w in workloads}
    steps = 2 * repetitions * len(workloads) + 1
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("bench", total=steps)
        # draft/target cost ratio: tokens/s of the draft model alone vs the target alone
        cost_ratio = 1.0
        for mode, extra in (("plain", []), ("spec", spec_argv)):
            with running(
                artifact.server,
                [*base, *extra],
                out_dir / f"bench-{recipe}-{artifact.id}-logs" / f"{mode}.log",
            ) as srv:
                if mode == "plain" and settings.draft_model and settings.draft_model != target:
                    with running(
                        artifact.server,
                        [*smoke.base_args(settings.draft_model)],
                        out_dir / f"bench-{recipe}-{artifact.id}-logs" / "draft-alone.log",
                    ) as dsrv:
                        d = _sample(dsrv, PROSE)
                        t = _sample(srv, PROSE)
                        cost_ratio = t.tokens_per_second / d.tokens_per_second
                bar.advance(task)
                for _ in range(repetitions):
                    for w in workloads:
                        bar.update(task, description=f"bench {mode} {w}")
                        if w == "conversation":
                            samples = conversation(srv, verify.CHAT_TURNS, 96)
                            tps = statistics.fmean(s.tokens_per_second for s in samples)
                            agg = Sample(
                                tps,
                                sum(s.tokens for s in samples),
                                sum(s.drafted for s in samples),
                                sum(s.accepted for s in samples),
                                sum(s.drafts for s in samples),
                            )
                        else:
                            agg = _sample(srv, CODE_REWRITE if w == "code-rewrite" else PROSE)
                        getattr(results[w], mode).append(agg)
                        bar.advance(task)
    for w in results.values():
        w.summary = summarize(w, settings.n_max, cost_ratio)
    report = {
        "recipe": recipe,
        "artifact_id": artifact.id,
        # file arguments by name only: reports are shared, this machine's paths are not
        "spec_args": [Path(a).name if Path(a).is_file() else a for a in spec_argv],
        "draft_length": settings.n_max,
        "cost_ratio": round(cost_ratio, 3),
        "repetitions": repetitions,
        "workloads": [asdict(w) for w in results.values()],
    }
    write(report, out_dir, console)
    return report


def write(report: dict, out_dir: Path, console: Console) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"bench-{report['recipe']}-{report['artifact_id']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    head = (
        "workload",
        "tok/s plain",
        "tok/s spec",
        "speedup",
        "drafted",
        "accepted",
        "acceptance",
        "mean acc. len",
        "expected",
        "measured/expected",
    )
    rows = []
    for w in report["workloads"]:
        s = w["summary"]
        rows.append(
            (
                w["workload"],
                f"{s['plain_tps_median']:.1f}",
                f"{s['spec_tps_median']:.1f}",
                f"{s['speedup']:.2f}×",
                str(s["drafted"]),
                str(s["accepted"]),
                f"{s['acceptance']:.0%}",
                str(s["mean_accepted_length"]),
                f"{s['expected_speedup']:.2f}×",
                str(s["measured_over_expected"]),
            )
        )
    md = [
        f"# Bench: {report['recipe']} on {report['artifact_id']}",
        "",
        f"Speculation: `{' '.join(report['spec_args'])}`; draft length {report['draft_length']}, "
        f"draft/target cost ratio {report['cost_ratio']}; medians of "
        f"{report['repetitions']} repetitions.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    _plot(report, stem.with_suffix(".png"))
    table = Table(title=f"bench: {report['recipe']} ({report['artifact_id']})")
    for h in head:
        table.add_column(h)
    for r in rows:
        table.add_row(*r)
    console.print(table)
    console.print(f"bench: wrote {stem}.json, .md and .png")
    return stem


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [w["workload"] for w in report["workloads"]]
    speedups = [w["summary"]["speedup"] for w in report["workloads"]]
    expected = [w["summary"]["expected_speedup"] for w in report["workloads"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], speedups, width=0.4, label="measured")
    ax.bar([x + 0.2 for x in xs], expected, width=0.4, label="expected", alpha=0.6)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("speedup (spec ÷ plain tok/s)")
    ax.set_title(f"{report['recipe']} — {report['artifact_id']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
