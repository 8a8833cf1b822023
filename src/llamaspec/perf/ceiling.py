"""The arithmetic of the speculation ceiling (perf/limit.py measures, this prices).

L(α, γ) and S(α, γ, c) in closed form; a drafted round's time within a run; the
verification step timed on its own at both ends (`StepCost`: a round of γ drafted tokens all
accepted, γ + 1 emitted, and one all rejected, 1 emitted, each over the plain decodes timed
around it); a round that accepted k of g drafted tokens priced linearly between the two
(`round_price`); the speedup a perfect engine of those measured costs would give over a
run's own counts (`perfect_speedup`); and bench reports (perf.bench_report's JSON) set
against it (`recipe_ceilings`)."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaspec.errors import LlamaspecError
from llamaspec.perf import costmodel
from llamaspec.perf.bench_report import Sample, unreliable_cells
from llamaspec.perf.workloads import WORKLOADS


def mean_length(alpha: float, gamma: float) -> float:
    """L(α, γ): tokens a round emits on average, the target's own one included."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def bound(alpha: float, gamma: float, c: float) -> float:
    """S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1)): the speedup of rounds of γ drafted
    tokens, each accepted with probability α after the ones before it, when a round costs
    γc + 1 plain decodes."""
    return mean_length(alpha, gamma) / (gamma * c + 1.0)


def alpha_for_length(length: float, gamma: float) -> float:
    """The α whose L(α, γ) is `length` (bisection; L rises with α from 1 to γ + 1)."""
    if length <= 1.0:
        return 0.0
    if length >= gamma + 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_length(mid, gamma) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def round_ms(tokens: int, ms: float, drafts: int, accepted: int, plain_ms: float) -> float | None:
    """The milliseconds of one drafted round in a run of `tokens` tokens over `ms`.

    The first token comes from the prompt pass; of the rest, each drafted round emitted its
    accepted tokens plus one, and every other token was a plain step, priced at `plain_ms`."""
    if drafts < 1 or tokens < 2 or ms <= 0:
        return None
    plain_steps = max(tokens - 1 - accepted - drafts, 0)
    return max(ms - plain_steps * plain_ms, 0.0) / drafts


def round_cost(round_time: float, plain_ms: float, gamma: float) -> float | None:
    """The c of one round: (round ÷ plain decode − 1) ÷ γ, so that a round is γc + 1 decodes."""
    if plain_ms <= 0 or gamma <= 0:
        return None
    return (round_time / plain_ms - 1.0) / gamma


def fit_c(rounds: Iterable[tuple[float, float]]) -> float | None:
    """One c for (γ, c of a round at γ) pairs: the least-squares slope through the origin of
    γc against γ, i.e. Σ γ²c ÷ Σ γ²."""
    pairs = [(g, c) for g, c in rounds if g > 0]
    den = sum(g * g for g, _ in pairs)
    return sum(g * g * c for g, c in pairs) / den if den else None


def fit_overhead(extra: Iterable[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(fixed ms per round, ms per drafted token) from (γ, round − plain decode in ms) pairs:
    the least-squares line's intercept and slope. With a single γ the whole extra is the
    round's fixed cost and the per-token cost is unknown (None)."""
    pairs = list(extra)
    if not pairs:
        return None, None
    gammas = {g for g, _ in pairs}
    if len(gammas) < 2:
        return statistics.fmean(e for _, e in pairs), None
    mg = statistics.fmean(g for g, _ in pairs)
    me = statistics.fmean(e for _, e in pairs)
    slope = sum((g - mg) * (e - me) for g, e in pairs) / sum((g - mg) ** 2 for g, _ in pairs)
    return me - slope * mg, slope


@dataclass(frozen=True)
class Timed:
    """One end of the verification step timed on its own: per repetition, the round's ms,
    the plain decode timed around it and their ratio."""

    step_ms: tuple[float, ...]
    decode_ms: tuple[float, ...]  # a plain decode (ms per token), timed around each step
    ratios: tuple[float, ...]  # step ÷ decode
    ratio: float  # the median
    low: float  # the cheapest repetition
    high: float
    processes: tuple[float, ...] = ()  # the median of each server process that timed it

    @property
    def spread(self) -> float:
        """(high − low) ÷ median: the step's noise between repetitions, in one server
        process and across the processes that timed it."""
        return (self.high - self.low) / self.ratio if self.ratio > 0 else 0.0

    @property
    def process_spread(self) -> float:
        """(highest − lowest process median) ÷ median: how far apart the same server,
        started again, ran (0 with one process)."""
        if len(self.processes) < 2 or self.ratio <= 0:
            return 0.0
        return (max(self.processes) - min(self.processes)) / self.ratio


@dataclass(frozen=True)
class StepCost:
    """The verification step of γ drafted tokens timed on its own at both ends: every
    drafted token accepted (γ + 1 emitted: r_acc) and every one rejected (1 emitted: r_rej),
    in plain decodes. A round emits what it accepts, and the server works per emitted token,
    so a round that accepted k of γ is priced between them (`round_price`)."""

    length: int  # γ
    accepted: Timed
    rejected: Timed

    @property
    def c(self) -> float:
        """c_γ = (r_acc − 1) ÷ γ: a fully accepted round costs γ c_γ + 1 plain decodes."""
        return (self.accepted.ratio - 1.0) / self.length

    @property
    def spread(self) -> float:
        """The larger noise of the two ends."""
        return max(self.accepted.spread, self.rejected.spread)

    @property
    def process_spread(self) -> float:
        """The larger spread between server processes of the two ends."""
        return max(self.accepted.process_spread, self.rejected.process_spread)


def timed(plain: Sequence[Sample], steps: Sequence[Sample]) -> Timed | None:
    """One end of a step from its samples and the plain ones taken in turns with them: with
    one plain sample more than step ones (plain, step, plain, …, plain), each step is set
    against the mean of the plain decodes just before and just after it, else against the
    one just before it. None where no repetition had a drafted round."""
    per_token = [sample_ms(p) / p.tokens if p.tokens else 0.0 for p in plain]
    if len(per_token) == len(steps) + 1:
        around = [(a + b) / 2 for a, b in itertools.pairwise(per_token)]
    else:
        around = per_token
    rounds, decodes = [], []
    for d, f in zip(around, steps, strict=False):
        r = round_ms(f.tokens, sample_ms(f), f.drafts, f.accepted, d)
        if r is not None and d > 0:
            rounds.append(r)
            decodes.append(d)
    if not rounds:
        return None
    ratios = tuple(round(s / d, 4) for s, d in zip(rounds, decodes, strict=True))
    return Timed(
        tuple(round(s, 3) for s in rounds),
        tuple(round(d, 3) for d in decodes),
        ratios,
        round(statistics.median(ratios), 4),
        min(ratios),
        max(ratios),
    )


Samples = tuple[Sequence[Sample], Sequence[Sample]]  # (plain, step) samples, taking turns


def timed_runs(runs: Sequence[Samples]) -> Timed | None:
    """One end timed by several server processes (each its own `Samples`): every
    repetition of every process pooled, each process's median kept. A process's speed is
    part of the noise: the same flags started again can run a few percent apart."""
    parts = [t for plain, steps in runs if (t := timed(plain, steps)) is not None]
    if not parts:
        return None
    ratios = tuple(r for t in parts for r in t.ratios)
    return Timed(
        tuple(x for t in parts for x in t.step_ms),
        tuple(x for t in parts for x in t.decode_ms),
        ratios,
        round(statistics.median(ratios), 4),
        min(ratios),
        max(ratios),
        tuple(t.ratio for t in parts),
    )


def step_cost(
    length: int, accepted: Sequence[Samples], rejected: Sequence[Samples]
) -> StepCost | None:
    """A length's step from its all-accepted and all-rejected samples, per server process,
    each with the plain samples taken in turns with them (`timed_runs`). None where either
    end had no drafted round."""
    acc, rej = timed_runs(accepted), timed_runs(rejected)
    if acc is None or rej is None:
        return None
    return StepCost(length, acc, rej)


def step_ratios(
    costs: Sequence[StepCost], gamma: float, which: str = "ratio"
) -> tuple[float, float] | None:
    """(r_acc, r_rej) for a round of γ drafted tokens, in plain decodes, each linear in γ + 1
    between the lengths measured, with a plain decode at γ = 0 (`which`: "ratio" for the
    medians, "low" for the cheapest repetitions); None where nothing was measured."""
    if not costs:
        return None
    ends = []
    for end in ("accepted", "rejected"):
        table = {1: 1.0, **{c.length + 1: float(getattr(getattr(c, end), which)) for c in costs}}
        ends.append(costmodel.ratio(table, gamma + 1.0))
    return ends[0], ends[1]


def process_noise(costs: Sequence[StepCost], gamma: float) -> float:
    """How far the same step server, started again, ran from itself at the lengths timed on
    either side of γ (the larger): the spread a point, timed in a server process of its own,
    carries against steps timed in others."""
    below = [c for c in costs if c.length <= gamma]
    above = [c for c in costs if c.length >= gamma]
    near = [max(below, key=lambda c: c.length)] if below else []
    near += [min(above, key=lambda c: c.length)] if above else []
    return max((c.process_spread for c in near), default=0.0)


def round_price(r_acc: float, r_rej: float, accepted: float, gamma: float) -> float:
    """A round that drafted γ tokens and accepted `accepted` of them, in plain decodes:
    r_rej + (r_acc − r_rej) · accepted ÷ γ, linear in the tokens it emits between the two
    ends that were timed."""
    return r_rej + (r_acc - r_rej) * accepted / gamma if gamma > 0 else 1.0


def perfect_bound(alpha: float, gamma: float, r_acc: float, r_rej: float) -> float:
    """The perfect engine at full coverage: L(α, γ) tokens a round over a round that
    accepted L − 1 of γ on average, r_rej + (r_acc − r_rej)(L − 1) ÷ γ plain decodes. With
    r_rej = r_acc it is S(α, γ, c_γ), c_γ = (r_acc − 1) ÷ γ."""
    length = mean_length(alpha, gamma)
    return length / round_price(r_acc, r_rej, length - 1.0, gamma)


def perfect_speedup(
    emitted: float,
    drafts: float,
    drafted: float,
    accepted: float,
    r_acc: float,
    r_rej: float,
    draft_cost: float,
) -> float | None:
    """The speedup of a perfect engine of measured costs over a run's own counts: `emitted`
    tokens after each request's first, a plain decode for each step without a draft, each
    drafted round priced by `round_price` at the run's mean draft length g (in all,
    drafts · r_rej + accepted · (r_acc − r_rej) ÷ g), and `draft_cost` for each drafted
    token."""
    if emitted <= 0:
        return None
    plain_steps = max(emitted - accepted - drafts, 0.0)
    rounds = 0.0
    if drafts > 0:
        rounds = drafts * round_price(r_acc, r_rej, accepted / drafts, drafted / drafts)
    units = plain_steps + rounds + draft_cost * drafted
    return emitted / units if units > 0 else None


def described(steps: Sequence[StepCost]) -> tuple[float | None, float | None, float | None]:
    """(one-number c, fixed ms, ms per drafted token): the least-squares summaries of the
    all-accepted steps, for reading them at a glance; no ceiling uses them."""
    c = fit_c((s.length, s.c) for s in steps)
    extra = [
        (s.length, statistics.median(s.accepted.step_ms) - statistics.median(s.accepted.decode_ms))
        for s in steps
    ]
    fixed, per_token = fit_overhead(extra)
    return c, fixed, per_token


def rounded(x: float | None, n: int) -> float | None:
    return None if x is None else round(x, n)


def sample_ms(s: Sample) -> float:
    return s.tokens / s.tokens_per_second * 1000.0 if s.tokens_per_second > 0 else 0.0


@dataclass(frozen=True)
class RecipeCeiling:
    """A shipped recipe's bench report against the ceiling: its measured speedup ÷ the
    perfect engine's at its own counts, draft length and draft cost (one client)."""

    source: str  # the bench report's file name
    recipe: str
    workload: str
    speedup: float | None
    acceptance: float | None  # block mean: α from the mean accepted length at γ
    length: float | None  # γ: mean tokens per draft
    draft_cost: float | None
    ceiling: float | None
    ratio: float | None
    note: str = ""  # why a figure is missing, or why a row is above its ceiling
    extrapolated: bool = False  # γ beyond the longest step measured
    unreliable: bool = False  # the bench report's own verdict does not trust this speedup
    alpha_per_token: float | None = None  # accepted ÷ drafted
    step_ratio: float | None = None  # r_acc at γ: the all-accepted step, in plain decodes
    step_ratio_rejected: float | None = None  # r_rej at γ: the all-rejected step
    ceiling_high: float | None = None  # at the cheapest repetition of the step
    speedup_low: float | None = None  # the bench's lowest repetition
    above: bool = False  # beyond noise
    # the same perfect engine at the steps the bench run itself timed (its cost model's
    # `verify_ratio`, all accepted: a round is priced at it whatever it accepted), beside
    # the sweep's: a second reading, taken with the speedup
    bench_ceiling: float | None = None
    bench_ratio: float | None = None


def _usable(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    cells = report.get("workloads")
    if not isinstance(cells, list):
        return []
    return [c for c in cells if isinstance(c, Mapping) and c.get("concurrency", 1) == 1]


def recipe_lengths(reports: Iterable[Mapping[str, Any]]) -> set[int]:
    """The whole draft lengths around each one-client workload's mean draft length, so that
    its step is measured on both sides rather than extrapolated."""
    out: set[int] = set()
    for report in reports:
        for cell in _usable(report):
            s = cell.get("summary") or {}
            if s.get("drafts") and s.get("drafted"):
                g = s["drafted"] / s["drafts"]
                out |= {max(1, math.floor(g)), max(1, math.ceil(g))}
    return out


def _requests(cell: Mapping[str, Any]) -> int:
    """Requests whose first token came from the prompt pass: repetitions × turns."""
    reps = len(cell.get("spec") or []) or 1
    w = WORKLOADS.get(str(cell.get("workload")))
    return reps * (len(w.turns) if w else 1)


def _own_steps(cost_model: Any) -> dict[float, float]:
    """The verification steps a bench run timed itself, in plain decodes ({} where none)."""
    raw = cost_model.get("verify_ratio") if isinstance(cost_model, Mapping) else None
    if not isinstance(raw, Mapping) or not raw:
        return {}
    return {1: 1.0, **{int(k): float(v) for k, v in raw.items()}}


def recipe_ceilings(
    name: str, report: Mapping[str, Any], steps: Sequence[StepCost]
) -> list[RecipeCeiling]:
    """A bench report's one-client workloads against the perfect engine of the measured
    steps plus its draft's cost, over the workload's own counts: drafts · r_rej(g) +
    accepted · (r_acc(g) − r_rej(g)) ÷ g + plain steps + draft cost · drafted, g the mean
    drafted per round; a γ past the longest step measured is marked `extrapolated`.

    Reads perf.bench_report's JSON: per workload `summary.speedup`, `tokens`, `drafts`,
    `drafted`, `accepted` (and `speedup_by_repetition` for the noise); the draft cost is
    `cost_model.draft_cost_ratio`. A missing field gives a row that says which."""
    recipe = str(report.get("recipe", "?"))
    cost_model = report.get("cost_model")
    draft_cost = cost_model.get("draft_cost_ratio") if isinstance(cost_model, Mapping) else None
    out = []
    distrusted = unreliable_cells(report)
    cells = _usable(report)
    if not cells:
        return [
            RecipeCeiling(name, recipe, "—", None, None, None, None, None, None, "no `workloads`")
        ]
    longest = max((s.length for s in steps), default=0)
    for cell in cells:
        s = cell.get("summary") or {}
        keys = ("speedup", "tokens", "drafts", "drafted", "accepted")
        missing = [k for k in keys if s.get(k) is None]
        if draft_cost is None:
            missing.append("cost_model.draft_cost_ratio (a bench run with --no-cost-model)")
        if not steps:
            missing.append("the sweep's measured steps (no drafted round was timed)")
        workload = str(cell.get("workload", "?"))
        speedup = s.get("speedup")
        if not missing and not s["drafts"]:
            missing.append("drafts (no drafted step: nothing to set against the ceiling)")
        if missing:
            note = "missing: " + "; ".join(missing)
            out.append(
                RecipeCeiling(
                    name, recipe, workload, speedup, None, None, draft_cost, None, None, note
                )
            )
            continue
        assert draft_cost is not None
        gamma = s["drafted"] / s["drafts"]
        emitted = s["tokens"] - _requests(cell)
        r, low = step_ratios(steps, gamma), step_ratios(steps, gamma, "low")
        assert r is not None and low is not None
        args = (emitted, s["drafts"], s["drafted"], s["accepted"])
        ceiling = perfect_speedup(*args, *r, float(draft_cost))
        high = perfect_speedup(*args, *low, float(draft_cost))
        lows = [float(x) for x in s.get("speedup_by_repetition") or [speedup]]
        own = _own_steps(cost_model)
        at = costmodel.ratio(own, gamma + 1.0) if own else None
        mine = perfect_speedup(*args, at, at, float(draft_cost)) if at is not None else None
        # the bench ran in server processes of its own: beyond the step's own restarts
        above = high is not None and min(lows) > high * (1.0 + process_noise(steps, gamma))
        out.append(
            RecipeCeiling(
                name,
                recipe,
                workload,
                float(speedup),
                round(alpha_for_length(1.0 + s["accepted"] / s["drafts"], gamma), 4),
                round(gamma, 3),
                float(draft_cost),
                rounded(ceiling, 4),
                round(float(speedup) / ceiling, 4) if ceiling else None,
                "above its ceiling beyond noise: the bench timed its own steps at another "
                "moment than the sweep"
                if above
                else "",
                extrapolated=gamma > longest,
                unreliable=(workload, 1) in distrusted,
                alpha_per_token=round(s["accepted"] / s["drafted"], 4) if s["drafted"] else None,
                step_ratio=round(r[0], 4),
                step_ratio_rejected=round(r[1], 4),
                ceiling_high=rounded(high, 4),
                speedup_low=min(lows),
                above=above,
                bench_ceiling=rounded(mine, 4),
                bench_ratio=round(float(speedup) / mine, 4) if mine else None,
            )
        )
    return out


def read_bench(path: Path) -> dict:
    """A bench report file (JSON), or a one-paragraph error naming what is wrong with it."""
    if not path.is_file():
        raise LlamaspecError(
            f"--bench {path}: no such file. Give a reports/bench-<recipe>-<artifact>.json that "
            "`llamaspec bench` wrote (bench the recipe first)."
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LlamaspecError(
            f"--bench {path}: not a readable bench report ({exc}). Give a "
            "reports/bench-<recipe>-<artifact>.json that `llamaspec bench` wrote."
        ) from None
    if not isinstance(data, dict) or "workloads" not in data or "recipe" not in data:
        raise LlamaspecError(
            f"--bench {path}: a JSON file, but not a bench report (it has no `recipe` and "
            "`workloads`). Give a reports/bench-<recipe>-<artifact>.json that `llamaspec bench` "
            "wrote."
        )
    return data
