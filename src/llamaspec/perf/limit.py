"""The engine's speculation ceiling: synthetic acceptance swept against a perfect engine.

With a free draft (an n-gram lookup) and acceptance decided by a coin instead of by the
target (upstream's `--spec-synth-rates`, benchmarking only: its output is not valid), each
position of a draft of γ tokens is accepted with probability α given the ones before it.
A round then emits on average L(α, γ) = (1 − α^(γ+1)) / (1 − α) tokens (the accepted ones
and the target's own).

The ceiling is not fitted to those runs. For every draft length γ, the verification step
itself is timed on its own, as plain decodes are, at both ends (`step_cost`): a server whose
every round drafts exactly γ tokens and accepts them all (γ + 1 emitted: r_acc(γ)), and one
whose every round drafts γ and rejects them all (the same batch verified, 1 emitted:
r_rej(γ)), each taking turns with the plain server, so that r = that round's time ÷ the
plain decodes timed around it. The server works per emitted token, so a round that accepted
k of its g drafted tokens is priced linearly between the two ends, r_rej(g) + (r_acc(g) −
r_rej(g)) · k ÷ g plain decodes. A perfect engine of those measured costs spends a plain
decode on each step without a draft and that (plus the draft's own cost) on each drafted
round; over a run's own counts its speedup is

    ceiling = emitted / (plain steps + drafts · r_rej(g) + accepted · (r_acc(g) − r_rej(g)) ÷ g
                         + draft cost × drafted),

g the run's mean drafted per round; at full coverage it is L(α, γ) ÷ (r_rej + (r_acc − r_rej)
(L − 1) ÷ γ) (`perfect_bound`). A point is above its ceiling beyond noise when its lowest
per-repetition speedup exceeds the ceiling at the cheapest repetition of the step by more
than the step's server, started again, ran from itself (the point runs in a server process
of its own); the report says so and why. Acceptance is given both ways: per drafted token
(accepted ÷ drafted) and the block mean (the α whose L(α, γ) is the measured tokens per
round).

`recipe_ceilings` sets bench reports (perf.bench_report's JSON) against the same measured
steps, at each workload's own draft length, counts and draft cost (the bench cost model's
`draft_cost_ratio`). perf.limit_report writes the report.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.server_help import help_flags
from llamaspec.perf import bench, reliability
from llamaspec.perf.bench_report import Sample
from llamaspec.perf.ceiling import (
    RecipeCeiling,
    StepCost,
    alpha_for_length,
    bound,
    described,
    mean_length,
    perfect_bound,
    perfect_speedup,
    process_noise,
    read_bench,
    recipe_ceilings,
    recipe_lengths,
    round_cost,
    round_ms,
    round_price,
    rounded,
    sample_ms,
    step_cost,
    step_ratios,
)
from llamaspec.perf.workloads import WORKLOADS, Workload
from llamaspec.progress import bar
from llamaspec.runtime.client import running, server_help

DEFAULT_ALPHAS = (0.0, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95)
DEFAULT_LENGTHS = (1, 2, 4, 8)
DEFAULT_TOKENS = 64
DEFAULT_REPETITIONS = 2
# Repetitions of each end of each length's verification step, in each of STEP_PROCESSES
# server processes (their spread, within a process and between processes, is the noise the
# report states): on this kind of machine the same flags started again ran a few percent
# apart, which one process alone cannot show.
STEP_REPETITIONS = 2
STEP_PROCESSES = 2
# Plain samples of one point further apart than this (fastest ÷ slowest): a stalled server.
STALL = 1.5
# The highest α a sweep takes: at 1 every draft is accepted and L is γ + 1 for any cost.
MAX_ALPHA = 1.0
# The longest draft a sweep takes: the longest a recipe may ask for (`draft_n_max` in
# config/recipes.py); the step passes γ to the engine as the ngram-mod draft maximum, and
# the synthetic rates are γ numbers on its command line.
MAX_LENGTH = 256
# Where upstream llama.cpp gained synthetic acceptance (`--spec-synth-len`,
# `--spec-synth-rates`, benchmarking only).
SYNTH_ORIGIN = "upstream llama.cpp PR #27711 (the default pin b11312 has it)"
# A copy-heavy prompt: the target copies a module it was shown, so n-gram lookups find a
# draft on most steps whatever the coin decides.
PROMPT = WORKLOADS["copy"].turns[0]


# --- the arithmetic ----------------------------------------------------------------------


def synth_rates(alpha: float, gamma: int) -> tuple[float, ...]:
    """The engine's `--spec-synth-rates` for α and γ: position i (from 0) is reached and
    accepted with the unconditional probability α^(i+1) — exactly γ values, non-increasing,
    within [0, 1], as the engine requires."""
    check_alpha(alpha)
    check_length(gamma)
    return tuple(alpha ** (i + 1) for i in range(gamma))


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
    """γ must be a whole number of drafted tokens, from 1 to MAX_LENGTH."""
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
        raise LlamaspecError(
            f"Draft length γ = {gamma} is not a whole number of 1 or more: a round drafts at "
            "least one token for synthetic acceptance to decide on. Give lengths such as "
            f"{','.join(map(str, DEFAULT_LENGTHS))}."
        )
    if gamma > MAX_LENGTH:
        raise LlamaspecError(
            f"Draft length γ = {gamma} is above {MAX_LENGTH}, the longest draft a recipe may "
            "ask for (draft_n_max): the engine is given γ as its n-gram draft maximum and γ "
            "synthetic rates on its command line. Give lengths such as "
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
    """What a sweep measures: every α × γ, `repetitions` times, `tokens` tokens a sample, and
    each length's verification step `step_repetitions` times."""

    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    repetitions: int = DEFAULT_REPETITIONS
    tokens: int = DEFAULT_TOKENS
    threads: int | None = None  # -t for both servers; None: the engine's default
    server_args: tuple[str, ...] = ()  # more llama-server arguments for both servers
    step_repetitions: int = STEP_REPETITIONS

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
        if self.repetitions < 1 or self.tokens < 8 or self.step_repetitions < 1:
            raise LlamaspecError(
                f"A ceiling sweep needs 1 or more repetitions and 8 or more tokens a sample "
                f"(asked: {self.repetitions} repetition(s), {self.tokens} tokens)."
            )

    def configurations(self) -> list[tuple[float, int]]:
        return [(a, g) for g in sorted(set(self.lengths)) for a in sorted(set(self.alphas))]


@dataclass(frozen=True)
class Point:
    """One α × γ configuration: its samples (plain and synthetic, taking turns), what they
    imply, and its ceiling from the measured verification steps."""

    alpha: float  # asked for
    length: int  # γ: tokens each draft has
    rates: tuple[float, ...]
    plain: tuple[Sample, ...]
    spec: tuple[Sample, ...]
    plain_tps: float
    spec_tps: float
    speedup: float  # median synthetic ÷ median plain
    speedup_low: float  # the lowest repetition's synthetic ÷ its plain
    plain_ms_per_token: float
    round_ms: float | None  # one drafted round (draft + verification), in this run
    alpha_per_token: float | None  # accepted ÷ drafted
    measured_alpha: float | None  # block mean: the α whose L(α, γ) is the tokens per round
    mean_length: float | None  # tokens a drafted round emitted, the target's own included
    coverage: float  # share of the generated tokens that drafted rounds emitted
    c: float | None  # this run's own round: round = (γc + 1) plain decodes
    ceiling: float | None = None  # the perfect engine at the median measured step
    ceiling_high: float | None = None  # … at the cheapest repetition of the step
    over_ceiling: float | None = None  # speedup ÷ ceiling
    above: bool = False  # speedup_low > ceiling_high × (1 + process noise): beyond noise
    note: str = ""  # why, where above


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
    steps: tuple[StepCost, ...]
    c: float | None  # a one-number summary of the steps' c_γ (least squares); no row uses it
    overhead_ms: float | None  # the line through step − plain decode: its intercept
    per_token_ms: float | None  # … and its slope
    plain_ms_per_token: float | None
    recipes: tuple[RecipeCeiling, ...] = ()
    wall_seconds: float = 0.0
    load: tuple[float, ...] = ()  # 1-minute load averages: at the start and after each server

    @property
    def noise(self) -> dict[str, float | None]:
        """The spread the report states: of the step between repetitions, and of a
        point's per-repetition speedups against its median."""
        step = max((s.spread for s in self.steps), default=None)
        procs = max((s.process_spread for s in self.steps), default=None)
        pts = [(p.speedup - p.speedup_low) / p.speedup for p in self.points if p.speedup > 0]
        return {
            "step": rounded(step, 4),
            "step_processes": rounded(procs, 4),
            "speedup": rounded(max(pts, default=None), 4),
        }

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
            "steps": [{**asdict(s), "c": round(s.c, 4)} for s in self.steps],
            "noise": self.noise,
            "above": sum(p.above for p in self.points),
            "c": rounded(self.c, 4),
            "overhead_ms": rounded(self.overhead_ms, 3),
            "per_token_ms": rounded(self.per_token_ms, 3),
            "plain_ms_per_token": rounded(self.plain_ms_per_token, 3),
            "points": [asdict(p) for p in self.points],
            "recipes": [asdict(r) for r in self.recipes],
            "wall_seconds": self.wall_seconds,
            "load": list(self.load),
        }


# --- from samples to points ----------------------------------------------------------------


def point(alpha: float, gamma: int, plain: Sequence[Sample], spec: Sequence[Sample]) -> Point:
    """A configuration's samples → its speedup, round time, acceptance and own c."""
    plain_tps = statistics.median(s.tokens_per_second for s in plain) if plain else 0.0
    spec_tps = statistics.median(s.tokens_per_second for s in spec) if spec else 0.0
    per_token = [sample_ms(s) / s.tokens for s in plain if s.tokens]
    plain_ms = statistics.median(per_token) if per_token else 0.0
    rounds = [
        r
        for s in spec
        if (r := round_ms(s.tokens, sample_ms(s), s.drafts, s.accepted, plain_ms)) is not None
    ]
    rt = statistics.median(rounds) if rounds else None
    drafts = sum(s.drafts for s in spec)
    drafted = sum(s.drafted for s in spec)
    accepted = sum(s.accepted for s in spec)
    tokens = sum(max(s.tokens - 1, 0) for s in spec)
    length = 1.0 + accepted / drafts if drafts else None
    # drafts may come out shorter than γ (n-gram lookups near the end of a budget)
    g = drafted / drafts if drafts else float(gamma)
    pairs = [
        s.tokens_per_second / p.tokens_per_second
        for p, s in zip(plain, spec, strict=False)
        if p.tokens_per_second > 0
    ]
    speedup = spec_tps / plain_tps if plain_tps else 0.0
    return Point(
        alpha=alpha,
        length=gamma,
        rates=synth_rates(alpha, gamma),
        plain=tuple(plain),
        spec=tuple(spec),
        plain_tps=round(plain_tps, 3),
        spec_tps=round(spec_tps, 3),
        speedup=round(speedup, 4),
        speedup_low=round(min(pairs, default=speedup), 4),
        plain_ms_per_token=round(plain_ms, 4),
        round_ms=rounded(rt, 4),
        alpha_per_token=rounded(accepted / drafted, 4) if drafted else None,
        measured_alpha=rounded(alpha_for_length(length, g), 4) if length else None,
        mean_length=rounded(length, 4),
        coverage=round(min((accepted + drafts) / tokens, 1.0), 4) if tokens else 0.0,
        c=rounded(round_cost(rt, plain_ms, g), 5) if rt is not None else None,
    )


def _why(p: Point, gamma: float, price: float) -> str:
    """Why a point beat its ceiling beyond noise, from what was measured: its plain server
    stalled (its plain samples far apart), or its rounds cost less than the timed steps
    price a round of its acceptance at even against its fastest plain sample, or else the
    machine's speed moved between timings."""
    tps = [s.tokens_per_second for s in p.plain if s.tokens_per_second > 0]
    if len(tps) > 1 and max(tps) > STALL * min(tps):
        return (
            f"its plain samples ran at {min(tps):.1f}–{max(tps):.1f} tok/s: the plain server "
            "stalled in one of them, which makes the speedup read high"
        )
    fastest = min((sample_ms(s) / s.tokens for s in p.plain if s.tokens), default=0.0)
    own = p.round_ms / fastest if p.round_ms is not None and fastest > 0 else None
    if own is not None and own < price:
        return (
            f"its drafted rounds took {own:.2f} plain decodes (against its fastest plain "
            f"sample), below the {price:.2f} that the cheapest timed steps price a round of "
            f"its acceptance at (γ = {gamma:g}): its rounds ran cheaper than the steps timed "
            "on their own"
        )
    return (
        "its rounds cost no less than the timed steps price them, so its plain decodes ran "
        "slower than the steps': the machine's speed moved between the two timings"
    )


def with_ceilings(points: Sequence[Point], steps: Sequence[StepCost]) -> tuple[Point, ...]:
    """Each point with the perfect engine's speedup over its own counts (a free draft; each
    round priced between the all-rejected and all-accepted steps by what it accepted), at
    the median steps and at their cheapest repetitions, and whether it is above beyond
    noise."""
    out = []
    for p in points:
        drafts = sum(s.drafts for s in p.spec)
        if not drafts or not steps:
            out.append(p)
            continue
        drafted = sum(s.drafted for s in p.spec)
        accepted = sum(s.accepted for s in p.spec)
        emitted = sum(max(s.tokens - 1, 0) for s in p.spec)
        g = drafted / drafts
        r, low = step_ratios(steps, g), step_ratios(steps, g, "low")
        assert r is not None and low is not None
        ceiling = perfect_speedup(emitted, drafts, drafted, accepted, *r, 0.0)
        high = perfect_speedup(emitted, drafts, drafted, accepted, *low, 0.0)
        if ceiling is None or high is None:
            out.append(p)
            continue
        # the point ran in a server process of its own: a step's server started again
        # ran this far from itself, so only a margin beyond that is beyond noise
        margin = process_noise(steps, g)
        above = p.speedup_low > high * (1.0 + margin)
        note = _why(p, g, round_price(*low, accepted / drafts, g)) if above else ""
        out.append(
            replace(
                p,
                ceiling=round(ceiling, 4),
                ceiling_high=round(high, 4),
                over_ceiling=round(p.speedup / ceiling, 4),
                above=above,
                note=note,
            )
        )
    return tuple(out)


# --- the measurement -----------------------------------------------------------------------


def _args(model: Path, plan: LimitPlan) -> list[str]:
    threads = ["-t", str(plan.threads)] if plan.threads else []
    return ["-m", str(model), "-c", "4096", "-np", "1", *threads, *plan.server_args, "--metrics"]


def _full_samples(
    plain_srv: Any,
    spec_srv: Any,
    workload: Workload,
    n: int,
    tick: Callable[[str], None],
    end: str = "all accepted",
) -> tuple[list[Sample], list[Sample]]:
    """`n` samples of one end of the step, each between two plain ones (n + 1 plain)."""
    tick("plain (1)")
    plain = [bench.run(plain_srv, workload, 1)]
    full: list[Sample] = []
    for rep in range(n):
        tick(f"{end} ({rep + 1})")
        full.append(bench.run(spec_srv, workload, 1))
        tick(f"plain ({rep + 2})")
        plain.append(bench.run(plain_srv, workload, 1))
    return plain, full


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

    A plain server runs throughout; each length first gets its verification step timed at
    both ends (a server whose drafts of γ tokens are all accepted, then one whose drafts are
    all rejected), then each configuration a server of
    its own, each taking turns with the plain one sample by sample. The lengths that the
    `bench_reports` ((name, bench report JSON) pairs) drafted at get their step timed too,
    and the reports are set against the ceiling. `say` gets a line per server (or, with
    `console`, a progress bar shows them). Raises before starting anything when the build
    has no synthetic acceptance."""
    dialect, help_text = check_build(artifact, say)
    logs = logs or Path("reports") / f"limit-{artifact.id}-logs"
    base = _args(model, plan)
    commands = {"plain": bench.shown(base)}
    configs = plan.configurations()
    lengths = sorted(set(plan.lengths) | recipe_lengths(r for _, r in bench_reports))
    started = time.monotonic()
    load = [reliability.load_now()]
    points: list[Point] = []
    steps: list[StepCost] = []
    # a point: plain and synthetic per repetition; a step: two ends of 2n + 1 samples each
    total = len(configs) * plan.repetitions * 2
    total += len(lengths) * 2 * STEP_PROCESSES * (2 * plan.step_repetitions + 1)
    # without a console, `say` gets a line per server and nothing else shows
    with (
        running(artifact.server, base, logs / "plain.log") as plain_srv,
        bar(console or Console(quiet=True)) as pb,
    ):
        task = pb.add_task("limit", total=total)

        def ticker(label: str) -> Callable[[str], None]:
            if console is None:
                say(f"limit: {label}")

            def tick(what: str) -> None:
                pb.update(task, description=f"{label} {what}")
                pb.advance(task)

            return tick

        for gamma in lengths:
            # several rounds a sample, however long the draft
            w = Workload("limit-step", "copy-heavy", (PROMPT,), max(plan.tokens, 4 * (gamma + 1)))
            ends = []
            for end, rates, tag in (
                ("all accepted", None, "accepted"),
                ("all rejected", synth_rates(0.0, gamma), "rejected"),
            ):
                step_args = dialects.synthetic_steps(dialect, help_text, gamma, rates)
                assert step_args is not None  # check_synthetic passed
                args = [*base, *step_args]
                commands[f"step {end}, γ={gamma}"] = bench.shown(args)
                tick = ticker(f"γ={gamma}")
                runs = []
                for n in range(1, STEP_PROCESSES + 1):
                    log = logs / f"step-{tag}-g{gamma}-{n}.log"
                    with running(artifact.server, args, log) as srv:
                        label = f"{end}, server {n}"
                        reps = plan.step_repetitions
                        runs.append(_full_samples(plain_srv, srv, w, reps, tick, label))
                ends.append(runs)
                load.append(reliability.load_now())
            if (cost := step_cost(gamma, *ends)) is not None:
                steps.append(cost)
            if gamma not in plan.lengths:
                continue
            workload = Workload("limit", "copy-heavy", (PROMPT,), plan.tokens)
            for alpha in sorted(set(plan.alphas)):
                synth = dialects.synthetic_steps(
                    dialect, help_text, gamma, synth_rates(alpha, gamma)
                )
                assert synth is not None
                args = [*base, *synth]
                commands[f"α={alpha:g}, γ={gamma}"] = bench.shown(args)
                tick = ticker(f"α={alpha:g} γ={gamma}")
                plain: list[Sample] = []
                spec: list[Sample] = []
                log = logs / f"synth-a{alpha:g}-g{gamma}.log"
                with running(artifact.server, args, log) as spec_srv:
                    for rep in range(plan.repetitions):
                        tick(f"plain ({rep + 1})")
                        plain.append(bench.run(plain_srv, workload, 1))
                        tick(f"synthetic ({rep + 1})")
                        spec.append(bench.run(spec_srv, workload, 1))
                points.append(point(alpha, gamma, plain, spec))
                load.append(reliability.load_now())
    recipes = [r for name, rep in bench_reports for r in recipe_ceilings(name, rep, steps)]
    c, fixed, per_token = described(steps)
    plain_ms = [p.plain_ms_per_token for p in points if p.plain_ms_per_token > 0]
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
        points=with_ceilings(points, steps),
        steps=tuple(steps),
        c=c,
        overhead_ms=fixed,
        per_token_ms=per_token,
        plain_ms_per_token=statistics.median(plain_ms) if plain_ms else None,
        recipes=tuple(recipes),
        wall_seconds=round(time.monotonic() - started, 1),
        load=tuple(round(x, 2) for x in load if x is not None),
    )


__all__ = [
    "LimitPlan",
    "LimitReport",
    "Point",
    "RecipeCeiling",
    "StepCost",
    "alpha_for_length",
    "bound",
    "check_build",
    "check_synthetic",
    "mean_length",
    "offers_synthetic",
    "perfect_bound",
    "perfect_speedup",
    "point",
    "process_noise",
    "read_bench",
    "recipe_ceilings",
    "round_price",
    "step_cost",
    "step_ratios",
    "sweep",
    "synth_rates",
    "with_ceilings",
]
