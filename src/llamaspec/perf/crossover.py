"""Speculation priced by concurrency: speed at each client count of a bench report and the
crossover, the client count from which speculation loses.

A bench report measures every workload at each client count it was given (`--concurrency`),
plain and speculative in turn within each repetition, first exposure (bench's reliability
check judges the run). Here, per client count: the summed tokens per second of plain and
speculative decoding over the workloads, the speedup (the geometric mean of the workloads'
speedups) and the range of the per-repetition speedups; the crossover is the lowest client
count whose speedup is below 1 (None when speculation wins at every count measured), and a
loss whose repetitions straddle 1 says so (within the run's noise). perf.bench_report puts
it into the report; a recipe's measured data (`measured.crossover`) quotes it, and `recipe
show`, `serve` and `recipe monitor` use it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from llamaspec.perf import reliability


@dataclass(frozen=True)
class Level:
    """One client count of a bench report."""

    clients: int
    workloads: int
    plain_tps: float  # summed over the workloads' medians
    spec_tps: float
    speedup: float  # geometric mean of the workloads' speedups
    low: float  # the lowest and highest per-repetition speedup of any workload
    high: float
    predicted: float | None = None  # the batching model's speedup (`predict`), where priced

    @property
    def loses(self) -> bool:
        return self.speedup < 1.0

    @property
    def within_noise(self) -> bool:
        """Whether the repetitions put this level on both sides of 1."""
        return self.low < 1.0 < self.high


@dataclass(frozen=True)
class Pricing:
    """Speed by client count and the crossover, from one bench report."""

    levels: tuple[Level, ...]
    crossover: int | None  # the lowest client count where speculation loses; None: none
    reliable: bool
    predicted_crossover: int | None = None  # the model's; None: it predicts none (or no model)
    priced: bool = False  # whether the report had the cost model the prediction needs

    @property
    def pays_up_to(self) -> int | None:
        """The highest client count below the crossover (None when it loses at the first)."""
        below = [
            lv.clients
            for lv in self.levels
            if self.crossover is None or lv.clients < self.crossover
        ]
        return max(below) if below else None

    def to_json(self) -> dict[str, Any]:
        return {
            "levels": [asdict(lv) for lv in self.levels],
            "crossover": self.crossover,
            "pays_up_to": self.pays_up_to,
            "reliable": self.reliable,
            "predicted_crossover": self.predicted_crossover,
            "priced": self.priced,
        }

    def sentence(self) -> str:
        """What a user reads: where speculation pays, where it loses."""
        shown = ", ".join(f"{lv.clients}: {lv.speedup:.2f}×" for lv in self.levels)
        if self.crossover is None:
            text = f"speculation pays at every client count measured ({shown})"
        elif self.pays_up_to is None:
            text = f"speculation loses from {self.crossover} client(s) on ({shown})"
        else:
            text = (
                f"speculation pays up to {self.pays_up_to} client(s) and loses from "
                f"{self.crossover} ({shown})"
            )
        return text + ("" if self.reliable else "; from a run marked unreliable")


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def price(report: Mapping[str, Any]) -> Pricing | None:
    """The pricing of a bench report with two client counts or more (None otherwise, or
    where a count has no speedup measured)."""
    counts = sorted({int(w["concurrency"]) for w in report.get("workloads", ())})
    if len(counts) < 2:
        return None
    levels = []
    for k in counts:
        cells = [w for w in report["workloads"] if int(w["concurrency"]) == k]
        speedups = [float(w["summary"]["speedup"]) for w in cells if w["summary"].get("speedup")]
        if not speedups:
            return None
        reps = [x for w in cells for x in reliability.cell_speedups(w)] or speedups
        levels.append(
            Level(
                k,
                len(cells),
                round(sum(float(w["summary"]["plain_tps_median"]) for w in cells), 2),
                round(sum(float(w["summary"]["spec_tps_median"]) for w in cells), 2),
                round(_geomean(speedups), 3),
                round(min(reps), 3),
                round(max(reps), 3),
            )
        )
    predicted = predict(report, counts)
    levels = [Level(**{**asdict(lv), "predicted": predicted.get(lv.clients)}) for lv in levels]
    crossover = next((lv.clients for lv in levels if lv.loses), None)
    guess = next((k for k in counts if predicted.get(k, 1.0) < 1.0), None)
    verdict = report.get("reliability") or {}
    return Pricing(
        tuple(levels), crossover, bool(verdict.get("reliable", False)), guess, bool(predicted)
    )


def _curve(cost_model: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The cost of evaluating n tokens in one step relative to one, as the cost model
    measured it: its batches of k tokens after a cached prefix, timed at every k up to the
    draft length + 1 (its verification steps, timed at seven lengths only, jumped from 0.93
    at k = 2 to 2.54 at k = 3 on the 2-core machine: too coarse to price k-slot batches),
    else those verification steps."""
    raw = cost_model.get("batch_ratio") or cost_model.get("verify_ratio") or {}
    points = {1.0: 1.0, **{float(k): float(v) for k, v in raw.items()}}
    return sorted(points.items())


def _cost(curve: list[tuple[float, float]], n: float) -> float:
    """`curve` at n tokens: linear between measured points, and past the last one along
    the slope of the last two (the measured range ends at the draft length + 1)."""
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if n <= x1:
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = curve[-2], curve[-1]
    return y1 + max((y1 - y0) / (x1 - x0), 0.0) * (n - x1)


def predict(report: Mapping[str, Any], counts: Sequence[int]) -> dict[int, float]:
    """The batching model's speedup at each client count (empty without a cost model).

    From each workload's one-client cell: a slot generates `tokens` in S = tokens −
    accepted steps (a step yields its accepted tokens and one more), so t = tokens ÷ S per
    step, and evaluates v = 1 + drafted ÷ S tokens per step on average (a step without a
    draft evaluates one). At k busy slots a plain step evaluates k tokens in one batch
    (cost R(k), R the cost model's curve, R(1) = 1) and yields k; an average speculative
    step evaluates k·v tokens in one batch, drafts k·(v − 1) tokens at c each slot by slot
    (the server drafts for one slot at a time), and yields k·t. So
    speedup(k) = t·R(k) / (R(k·v) + k·(v − 1)·c), the geometric mean over the workloads.
    An n-gram drafter costs nothing (c = 0)."""
    cm = report.get("cost_model") or {}
    curve = _curve(cm)
    if len(curve) < 2:
        return {}
    c = float(cm.get("draft_cost_ratio") or 0.0)
    low = min(counts)
    steps = []
    for w in report.get("workloads", ()):
        s = w["summary"]
        tokens, accepted = float(s.get("tokens") or 0), float(s.get("accepted") or 0)
        if int(w["concurrency"]) == low and tokens > accepted:
            n = tokens - accepted
            steps.append((tokens / n, 1 + float(s.get("drafted") or 0) / n))
    if not steps:
        return {}
    out = {}
    for k in counts:
        plain = _cost(curve, k)
        per = [t * plain / (_cost(curve, k * v) + k * (v - 1) * c) for t, v in steps]
        out[k] = round(_geomean(per), 3)
    return out


def markdown(p: Pricing) -> list[str]:
    """The report's "many clients" section."""
    rows = [
        f"| {lv.clients} | {lv.plain_tps:.1f} | {lv.spec_tps:.1f} | {lv.speedup:.2f}× | "
        f"{lv.low:.2f}–{lv.high:.2f}× | "
        + ("loses" + (" (within noise)" if lv.within_noise else "") if lv.loses else "pays")
        + f" | {'–' if lv.predicted is None else f'{lv.predicted:.2f}×'} |"
        for lv in p.levels
    ]
    return [
        "",
        "## Many clients",
        "",
        "Tokens per second summed over the workloads (first exposure, medians), the speedup "
        "as the geometric mean of the workloads' speedups, and the range of every "
        "repetition's own speedup.",
        "",
        "| clients | plain tok/s | speculative tok/s | speedup | repetitions | | modelled |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Crossover: "
        + (
            f"**{p.crossover} clients**, the lowest count where speculation loses"
            if p.crossover is not None
            else "none: speculation pays at every count measured"
        )
        + ("" if p.reliable else " (the run is marked unreliable: see its verdict)")
        + ". "
        + (
            "Modelled (not measured): the cost model's step costs priced for k busy slots "
            "(a plain step evaluates k tokens in one batch; an average speculative step k "
            "times the tokens one slot's average step evaluated, drafting slot by slot), "
            "with each workload's one-client steps; past the largest batch the cost model "
            "timed it extends the last slope. Its crossover: "
            + (f"{p.predicted_crossover} clients." if p.predicted_crossover else "none.")
            if p.priced
            else "No modelled column: the run had no cost model (`--no-cost-model`)."
        ),
    ]
