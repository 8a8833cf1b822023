"""The engine's speculation ceiling: synthetic acceptance swept against the bound.

With a free draft (an n-gram lookup) and acceptance decided by a coin instead of by the
target (upstream's `--spec-synth-rates`, benchmarking only: its output is not valid), each
position of a draft of γ tokens is accepted with probability α given the ones before it.
A round then emits on average

    L(α, γ) = (1 − α^(γ+1)) / (1 − α)

tokens (the accepted ones and the target's own), and if a round costs (γc + 1) plain
decodes, the speedup is at most

    S(α, γ, c) = (1 − α^(γ+1)) / ((1 − α)(γc + 1)).

`sweep` measures it on a built server: for every α × γ, a server whose drafts are exactly γ
tokens (ngram-mod with n_min = n_max = γ on a copy-heavy prompt) and whose position i is
accepted with the unconditional probability α^(i+1), beside a plain server, the two taking
turns. From each configuration's timings it takes the time of a drafted round (steps
without a draft are priced as plain decodes), the acceptance α̂ that its measured L implies,
and the round's cost over a plain decode; `c` is fitted to all of them (least squares
through the origin of round ÷ plain − 1 against γ), and a line through (γ, round − plain
decode, in ms) gives the fixed cost of a verification round (its intercept) and the cost
per drafted token (its slope). Each point's measured speedup is then set beside
S(α̂, γ, c at γ): the line's cost at γ where more than one length was swept (a fixed cost
weighs on short drafts more), else the one c.

`recipe_ceilings` reads bench reports (perf.bench_report's JSON) and divides each
workload's measured speedup by the ceiling at its own acceptance, draft length and draft
cost: S(α̂, γ, c at γ + the draft's cost). perf.limit_report writes the report.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.server_help import help_flags
from llamaspec.perf import bench
from llamaspec.perf.bench_report import Sample, unreliable_cells
from llamaspec.perf.workloads import WORKLOADS, Workload
from llamaspec.progress import bar
from llamaspec.runtime.client import running, server_help

DEFAULT_ALPHAS = (0.0, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95)
DEFAULT_LENGTHS = (1, 2, 4, 8)
DEFAULT_TOKENS = 64
DEFAULT_REPETITIONS = 2
# The highest α a sweep takes: at 1 every draft is accepted and L is γ + 1 for any cost.
MAX_ALPHA = 1.0
# Where upstream llama.cpp gained synthetic acceptance (`--spec-synth-len`,
# `--spec-synth-rates`, benchmarking only).
SYNTH_ORIGIN = "upstream llama.cpp PR #27711 (the default pin b11312 has it)"
# A copy-heavy prompt: the target copies a module it was shown, so n-gram lookups find a
# draft on most steps whatever the coin decides.
PROMPT = WORKLOADS["copy"].turns[0]


# --- the arithmetic ----------------------------------------------------------------------


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


def synth_rates(alpha: float, gamma: int) -> tuple[float, ...]:
    """The engine's `--spec-synth-rates` for α and γ: position i (from 0) is reached and
    accepted with the unconditional probability α^(i+1) — exactly γ values, non-increasing,
    within [0, 1], as the engine requires."""
    check_alpha(alpha)
    check_length(gamma)
    return tuple(alpha ** (i + 1) for i in range(gamma))


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


# --- checks --------------------------------------------------------------------------------


def check_alpha(alpha: float) -> float:
    """α must be a probability below 1 (at 1 every draft is accepted: no bound to test)."""
    if not (isinstance(alpha, int | float) and math.isfinite(alpha) and 0.0 <= alpha < MAX_ALPHA):
        raise LlamaspecError(
            f"Synthetic acceptance α = {alpha} is outside [0, 1): α is the chance that a "
            "drafted token is accepted after the ones before it, so give values such as "
            f"{','.join(f'{a:g}' for a in DEFAULT_ALPHAS)} (1 itself accepts every draft and "
            "measures nothing the bound does not already say)."
        )
    return float(alpha)


def check_length(gamma: int) -> int:
    """γ must be a whole number of drafted tokens, 1 or more."""
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise LlamaspecError(
            f"Draft length γ = {gamma} is not a whole number of 1 or more: a round drafts at "
            "least one token for synthetic acceptance to decide on. Give lengths such as "
            f"{','.join(map(str, DEFAULT_LENGTHS))}."
        )
    return gamma


def offers_synthetic(dialect: str, help_text: str) -> bool:
    """Whether a build can be swept: its --help takes synthetic acceptance rates and its
    dialect has the ngram-mod drafts the sweep gives them to."""
    d = dialects.find_dialect(dialect)
    rates = d.flags.get("synth_rates")
    return rates is not None and rates in help_flags(help_text) and "ngram-mod" in d.types


def check_synthetic(dialect: str, help_text: str, where: str) -> None:
    """Refuse a build without synthetic acceptance before anything starts."""
    d = dialects.find_dialect(dialect)
    rates = d.flags.get("synth_rates")
    if not offers_synthetic(dialect, help_text):
        listed = "no such flag in the dialect" if rates is None else f"its --help has no {rates}"
        raise LlamaspecError(
            f"The speculation ceiling needs synthetic acceptance, which {where} (dialect "
            f"{d.name!r}: {d.pins}) lacks ({listed}): the sweep lets a coin accept n-gram "
            f"drafts at a chosen rate, a benchmarking-only feature of {SYNTH_ORIGIN}. "
            "Build llama.cpp at its default pin (`llamaspec build`) or a later one, and pass "
            "that artifact with --artifact."
        )


def check_build(artifact: Artifact, say: Callable[[str], None]) -> tuple[str, str]:
    """(the build's dialect, its --help) once `check_synthetic` accepts it."""
    help_text = server_help(artifact.server)
    dialect = dialects.dialect_for(artifact, say)
    where = f"{artifact.id} ({artifact.manifest.get('engine')} "
    where += f"{str(artifact.manifest.get('commit') or 'local')[:12]})"
    check_synthetic(dialect, help_text, where)
    return dialect, help_text


# --- the frozen values ---------------------------------------------------------------------


@dataclass(frozen=True)
class LimitPlan:
    """What a sweep measures: every α × γ, `repetitions` times, `tokens` tokens a sample."""

    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    repetitions: int = DEFAULT_REPETITIONS
    tokens: int = DEFAULT_TOKENS
    threads: int | None = None  # -t for both servers; None: the engine's default
    server_args: tuple[str, ...] = ()  # more llama-server arguments for both servers

    def __post_init__(self) -> None:
        if not self.alphas or not self.lengths:
            raise LlamaspecError(
                "A ceiling sweep needs at least one α and one draft length (defaults: α "
                f"{','.join(f'{a:g}' for a in DEFAULT_ALPHAS)}, lengths "
                f"{','.join(map(str, DEFAULT_LENGTHS))})."
            )
        for a in self.alphas:
            check_alpha(a)
        for g in self.lengths:
            check_length(g)
        if self.repetitions < 1 or self.tokens < 8:
            raise LlamaspecError(
                f"A ceiling sweep needs 1 or more repetitions and 8 or more tokens a sample "
                f"(asked: {self.repetitions} repetition(s), {self.tokens} tokens)."
            )

    def configurations(self) -> list[tuple[float, int]]:
        return [(a, g) for g in sorted(set(self.lengths)) for a in sorted(set(self.alphas))]


@dataclass(frozen=True)
class Point:
    """One α × γ configuration: its samples (plain and synthetic, taking turns) and what
    they imply; `bound` and `over_bound` are filled once c is fitted over all points."""

    alpha: float  # asked for
    length: int  # γ: tokens each draft has
    rates: tuple[float, ...]
    plain: tuple[Sample, ...]
    spec: tuple[Sample, ...]
    plain_tps: float
    spec_tps: float
    speedup: float
    plain_ms_per_token: float
    round_ms: float | None  # one drafted round (draft + verification)
    measured_alpha: float | None  # the α whose L(α, γ) is the measured mean round length
    mean_length: float | None  # tokens a drafted round emitted, the target's own included
    coverage: float  # share of the generated tokens that drafted rounds emitted
    c: float | None  # this point's own round cost: round = (γc + 1) plain decodes
    bound: float | None = None  # S(measured α, γ, the fitted c)
    over_bound: float | None = None  # measured speedup ÷ bound


@dataclass(frozen=True)
class RecipeCeiling:
    """A shipped recipe's bench report against the ceiling: its measured speedup ÷
    S(α̂, γ, c + draft cost) at its own acceptance and draft length (one client)."""

    source: str  # the bench report's file name
    recipe: str
    workload: str
    speedup: float | None
    acceptance: float | None  # α̂ from the mean accepted length at γ
    length: float | None  # γ: mean tokens per draft
    draft_cost: float | None
    ceiling: float | None
    ratio: float | None
    note: str = ""  # why a figure is missing
    extrapolated: bool = False  # γ beyond the sweep's longest draft
    unreliable: bool = False  # the bench report's own verdict does not trust this speedup


@dataclass(frozen=True)
class LimitReport:
    """What a sweep measured, where and how; `to_json()` is the report file's content."""

    artifact_id: str
    engine: str | None
    commit: str | None
    backend: str | None
    machine: Mapping[str, Any]
    date: str
    model: str
    plan: LimitPlan
    commands: Mapping[str, str]
    points: tuple[Point, ...]
    c: float | None  # fitted over every point
    overhead_ms: float | None  # the fixed cost of a verification round
    per_token_ms: float | None  # the cost of each drafted token in a round
    plain_ms_per_token: float | None
    recipes: tuple[RecipeCeiling, ...] = ()
    wall_seconds: float = 0.0

    @property
    def fit(self) -> Fit:
        longest = max(self.plan.lengths, default=0)
        return Fit(self.c, self.overhead_ms, self.per_token_ms, self.plain_ms_per_token, longest)

    def to_json(self) -> dict:
        return {
            "artifact_id": self.artifact_id,
            "engine": self.engine,
            "commit": self.commit,
            "backend": self.backend,
            "machine": dict(self.machine),
            "date": self.date,
            "model": self.model,
            "plan": asdict(self.plan),
            "commands": dict(self.commands),
            "c": _r(self.c, 4),
            "overhead_ms": _r(self.overhead_ms, 3),
            "per_token_ms": _r(self.per_token_ms, 3),
            "plain_ms_per_token": _r(self.plain_ms_per_token, 3),
            "points": [asdict(p) for p in self.points],
            "recipes": [asdict(r) for r in self.recipes],
            "wall_seconds": self.wall_seconds,
        }


def _r(x: float | None, n: int) -> float | None:
    return None if x is None else round(x, n)


# --- from samples to points ----------------------------------------------------------------


def _ms(s: Sample) -> float:
    return s.tokens / s.tokens_per_second * 1000.0 if s.tokens_per_second > 0 else 0.0


def point(alpha: float, gamma: int, plain: Sequence[Sample], spec: Sequence[Sample]) -> Point:
    """A configuration's samples → its speedup, round time, measured α and own c."""
    plain_tps = statistics.median(s.tokens_per_second for s in plain) if plain else 0.0
    spec_tps = statistics.median(s.tokens_per_second for s in spec) if spec else 0.0
    plain_ms = statistics.median(_ms(s) / s.tokens for s in plain if s.tokens) if plain else 0.0
    rounds = [
        r
        for s in spec
        if (r := round_ms(s.tokens, _ms(s), s.drafts, s.accepted, plain_ms)) is not None
    ]
    rt = statistics.median(rounds) if rounds else None
    drafts = sum(s.drafts for s in spec)
    drafted = sum(s.drafted for s in spec)
    accepted = sum(s.accepted for s in spec)
    tokens = sum(max(s.tokens - 1, 0) for s in spec)
    length = 1.0 + accepted / drafts if drafts else None
    # drafts may come out shorter than γ (n-gram lookups near the end of a budget)
    g = drafted / drafts if drafts else float(gamma)
    return Point(
        alpha=alpha,
        length=gamma,
        rates=synth_rates(alpha, gamma),
        plain=tuple(plain),
        spec=tuple(spec),
        plain_tps=round(plain_tps, 3),
        spec_tps=round(spec_tps, 3),
        speedup=round(spec_tps / plain_tps, 4) if plain_tps else 0.0,
        plain_ms_per_token=round(plain_ms, 4),
        round_ms=_r(rt, 4),
        measured_alpha=_r(alpha_for_length(length, g), 4) if length else None,
        mean_length=_r(length, 4),
        coverage=round(min((accepted + drafts) / tokens, 1.0), 4) if tokens else 0.0,
        c=_r(round_cost(rt, plain_ms, g), 5) if rt is not None else None,
    )


@dataclass(frozen=True)
class Fit:
    """What the rounds of a sweep say about the engine: one `c` for every γ, and the line
    round − plain decode = overhead_ms + per_token_ms · γ (ms)."""

    c: float | None
    overhead_ms: float | None  # the fixed cost of a verification round
    per_token_ms: float | None  # the cost of each drafted token in a round
    plain_ms: float | None  # a plain decode, ms per token
    longest: int = 0  # the longest draft swept

    def c_at(self, gamma: float) -> float | None:
        """The round cost at γ: from the line where it has a slope, else the one c."""
        if self.per_token_ms is None or self.overhead_ms is None or not self.plain_ms:
            return self.c
        return max((self.overhead_ms + self.per_token_ms * gamma) / (gamma * self.plain_ms), 0.0)


def fitted(points: Sequence[Point]) -> Fit:
    """The fit over every point that had drafted rounds."""
    c = fit_c((p.length, p.c) for p in points if p.c is not None)
    extra = [
        (p.length, p.round_ms - p.plain_ms_per_token) for p in points if p.round_ms is not None
    ]
    fixed, per_token = fit_overhead(extra)
    plain = [p.plain_ms_per_token for p in points if p.plain_ms_per_token > 0]
    longest = max((p.length for p in points), default=0)
    return Fit(c, fixed, per_token, statistics.median(plain) if plain else None, longest)


def with_bounds(points: Sequence[Point], fit: Fit) -> tuple[Point, ...]:
    """Each point with S(its measured α, γ, the fit's c at γ) and its speedup ÷ that bound."""
    out = []
    for p in points:
        c = fit.c_at(p.length)
        if c is None or p.measured_alpha is None:
            out.append(p)
            continue
        s = bound(p.measured_alpha, p.length, c)
        ratio = p.speedup / s if s > 0 else None
        out.append(replace(p, bound=round(s, 4), over_bound=_r(ratio, 4)))
    return tuple(out)


# --- bench reports against the ceiling -----------------------------------------------------


def recipe_ceilings(name: str, report: Mapping[str, Any], fit: Fit) -> list[RecipeCeiling]:
    """A bench report's one-client workloads against S(α̂, γ, the fit's c at γ + its draft
    cost); a γ longer than the sweep's longest is marked `extrapolated`.

    Reads perf.bench_report's JSON: per workload `summary.speedup`, `drafts`, `drafted`,
    `accepted`; the draft cost is `cost_model.draft_cost_ratio`. A missing field gives a
    row that says which, with no ratio."""
    recipe = str(report.get("recipe", "?"))
    cost_model = report.get("cost_model")
    draft_cost = cost_model.get("draft_cost_ratio") if isinstance(cost_model, Mapping) else None
    out = []
    distrusted = unreliable_cells(report)
    cells = report.get("workloads")
    if not isinstance(cells, list) or not cells:
        return [
            RecipeCeiling(name, recipe, "—", None, None, None, None, None, None, "no `workloads`")
        ]
    for cell in cells:
        if not isinstance(cell, Mapping) or cell.get("concurrency", 1) != 1:
            continue
        s = cell.get("summary") or {}
        missing = [k for k in ("speedup", "drafts", "drafted", "accepted") if s.get(k) is None]
        if draft_cost is None:
            missing.append("cost_model.draft_cost_ratio (a bench run with --no-cost-model)")
        if fit.c is None:
            missing.append("the sweep's c (no drafted round was measured)")
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
        gamma = s["drafted"] / s["drafts"]
        alpha = alpha_for_length(1.0 + s["accepted"] / s["drafts"], gamma)
        c = fit.c_at(gamma)
        assert c is not None and draft_cost is not None  # checked above
        ceiling = bound(alpha, gamma, c + float(draft_cost))
        out.append(
            RecipeCeiling(
                name,
                recipe,
                workload,
                float(speedup),
                round(alpha, 4),
                round(gamma, 3),
                float(draft_cost),
                round(ceiling, 4),
                round(float(speedup) / ceiling, 4) if ceiling > 0 else None,
                extrapolated=gamma > fit.longest,
                unreliable=(workload, 1) in distrusted,
            )
        )
    return out


def read_bench(path: Path) -> dict:
    """A bench report file (JSON), or a one-paragraph error naming what is wrong with it."""
    import json

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


# --- the measurement -----------------------------------------------------------------------


def _args(model: Path, plan: LimitPlan) -> list[str]:
    threads = ["-t", str(plan.threads)] if plan.threads else []
    return ["-m", str(model), "-c", "4096", "-np", "1", *threads, *plan.server_args, "--metrics"]


def sweep(
    artifact: Artifact,
    model: Path,
    plan: LimitPlan,
    say: Callable[[str], None],
    *,
    console: Console | None = None,
    logs: Path | None = None,
    bench_reports: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> LimitReport:
    """Sweep synthetic acceptance α × draft length γ on `artifact`'s server with `model`.

    A plain server runs throughout; each configuration gets a server of its own, and the
    two take turns sample by sample. `say` gets a line per configuration (or, with
    `console`, a progress bar shows them). `bench_reports` ((name, bench report JSON)
    pairs) are set against the fitted ceiling. Raises before starting anything when the
    build has no synthetic acceptance."""
    dialect, help_text = check_build(artifact, say)
    logs = logs or Path("reports") / f"limit-{artifact.id}-logs"
    workload = Workload("limit", "copy-heavy", (PROMPT,), plan.tokens)
    base = _args(model, plan)
    commands = {"plain": bench.shown(base)}
    configs = plan.configurations()
    started = time.monotonic()
    points: list[Point] = []
    total = len(configs) * plan.repetitions * 2
    # without a console, `say` gets a line per configuration and nothing else shows
    with (
        running(artifact.server, base, logs / "plain.log") as plain_srv,
        bar(console or Console(quiet=True)) as pb,
    ):
        task = pb.add_task("limit", total=total)
        for alpha, gamma in configs:
            synth = dialects.synthetic_steps(dialect, help_text, gamma, synth_rates(alpha, gamma))
            assert synth is not None  # check_synthetic passed
            args = [*base, *synth]
            commands[f"α={alpha:g}, γ={gamma}"] = bench.shown(args)
            label = f"α={alpha:g} γ={gamma}"
            if console is None:
                say(f"limit: {label}")
            plain: list[Sample] = []
            spec: list[Sample] = []
            log = logs / f"synth-a{alpha:g}-g{gamma}.log"
            with running(artifact.server, args, log) as spec_srv:
                for rep in range(plan.repetitions):
                    pb.update(task, description=f"{label} plain ({rep + 1})")
                    plain.append(bench.run(plain_srv, workload, 1))
                    pb.advance(task)
                    pb.update(task, description=f"{label} synthetic ({rep + 1})")
                    spec.append(bench.run(spec_srv, workload, 1))
                    pb.advance(task)
            points.append(point(alpha, gamma, plain, spec))
    fit = fitted(points)
    recipes = [r for name, rep in bench_reports for r in recipe_ceilings(name, rep, fit)]
    m = artifact.manifest
    return LimitReport(
        artifact_id=artifact.id,
        engine=m.get("engine"),
        commit=m.get("commit"),
        backend=m.get("backend"),
        machine=toolchain.machine(),
        date=dt.date.today().isoformat(),
        model=model.name,
        plan=plan,
        commands=commands,
        points=with_bounds(points, fit),
        c=fit.c,
        overhead_ms=fit.overhead_ms,
        per_token_ms=fit.per_token_ms,
        plain_ms_per_token=fit.plain_ms,
        recipes=tuple(recipes),
        wall_seconds=round(time.monotonic() - started, 1),
    )
