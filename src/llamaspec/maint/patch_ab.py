"""`llamaspec patches ab`: the project's engine patches measured against the stock server of
the same pin, in one run.

Two builds of one pin take turns: the default build, which carries the patch queue, and
`build --no-default-patches`, the stock server. Each scenario names the patch it measures
(none for a health row: a workload no patch should slow), a recipe (or, for a patch no
shipped recipe's model reaches here, a reference family of proof.refmodels with the
speculation to serve it) and its traffic: phases of a built-in workload with some clients at
once and request fields (such as `speculative.n_max`). Every sample starts a
fresh server, so it is a first exposure; the arms run one after another with their order
reversed every repetition, so drift on a shared machine hits both. A plain arm (the patched
binary without its speculative flags) runs where a scenario's goal is stated against plain
decoding. The measure is tokens per second of wall time over the scenario's traffic
(prompt processing included); patched ÷ stock is taken per repetition, and its median is
the scenario's figure. Its spread and the machine's load decide whether the run is reliable
(`perf.reliability`'s thresholds). patch_ab_report writes the report.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact, load_artifact
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.models import dialects
from llamaspec.models.server_help import server_help
from llamaspec.perf import bench, bench_plans, reliability
from llamaspec.perf.bench import BenchPlan
from llamaspec.perf.workloads import WORKLOADS
from llamaspec.progress import bar
from llamaspec.proof.refmodels import registry
from llamaspec.runtime.client import running

STOCK, PATCHED, PLAIN = "stock", "patched", "plain"
# a hybrid reference served as verify serves it: one KV stream per slot, no flash attention
HYBRID_SERVING = ("--no-kv-unified", "-fa", "off")
OFF = (("speculative.n_max", 0),)  # a request that turns drafting off (patch 0001)


@dataclass(frozen=True)
class Phase:
    """Part of a scenario's traffic: `clients` run `workload` at once, each request with
    `fields` added."""

    workload: str
    clients: int = 1
    fields: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in self.fields)
        return f"{self.workload} ×{self.clients}" + (f" ({extra})" if extra else "")


@dataclass(frozen=True)
class Scenario:
    """One question about one patch, asked of both builds with the same traffic."""

    name: str
    patch: str  # the catalog patch it measures; "" for a health row
    question: str
    recipe: str
    phases: tuple[Phase, ...]
    goal: str
    plain: bool = True  # also run the plain arm
    drop_type: bool = False  # the recipe's speculation without its --spec-type
    patched_args: tuple[str, ...] = ()  # server flags of the patched arm only (a new option)
    # a reference family (proof.refmodels) served with `family_spec` instead of a recipe: for
    # patches whose models no recipe ships here (the recipe field then names the family)
    family: str = ""
    family_spec: dialects.SpecSettings | None = None

    @property
    def clients(self) -> int:
        return max(p.clients for p in self.phases)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "request-control-mixed",
        "server-request-spec-n-max",
        "Traffic that comes in bursts: one client (drafting pays), then four at once "
        "(drafting loses on this CPU); the four send speculative.n_max 0.",
        "gemma3-270m-q4-draft",
        (Phase("copy", 1), Phase("copy", 4, OFF)),
        "patched at least as fast as the better of stock (all speculative) and plain",
    ),
    *(
        Scenario(
            f"busy-max-{n}-clients",
            "server-spec-busy-max",
            f"The real draft pair on qa with {n} client(s) at once; patched stops drafting "
            "while more than 2 slots are busy (the pair's bench won at 1 and 2 clients, lost "
            "from 4).",
            "gemma3-270m-q4-draft",
            (Phase("qa", n),),
            "patched at least as fast as the better of stock (always drafting) and plain",
            patched_args=(dialects.SERVER_FLAGS["busy_max"], "2"),
        )
        for n in (1, 2, 4, 8)
    ),
    Scenario(
        "mtp-hybrid-4-clients",
        "recurrent-rollback-planes-move",
        "draft-mtp on the random Qwen3.5-style MoE hybrid reference, four clients at once "
        "on three workloads, four times over (the patch copies the snapshots of the states a "
        "ubatch moves; a random model's drafts do not pay, so there is no plain goal).",
        "qwen35moe-mtp",
        tuple(Phase(w, 4) for _ in range(4) for w in ("qa", "code-edit", "summarization")),
        "no slower than stock",
        plain=False,
        family="qwen35moe-mtp",
        family_spec=dialects.SpecSettings("mtp", n_max=3, p_min=0.0),
    ),
    Scenario(
        "draft-without-type",
        "spec-type-from-plain-draft",
        "The real pair's draft model given with -md and no --spec-type.",
        "gemma3-270m-q4-draft",
        (Phase("copy", 1),),
        "patched drafts (stock loads the draft and runs plain)",
        plain=False,
        drop_type=True,
    ),
    Scenario(
        "ngram-mod-defaults-copy",
        "",
        "ngram-mod at its defaults on the copy workload.",
        "gemma3-270m-ngram",
        (Phase("copy", 1),),
        "no slower than stock",
    ),
    Scenario(
        "q4-draft-code-edit",
        "",
        "The real draft pair's recipe on code-edit (a health workload).",
        "gemma3-270m-q4-draft",
        (Phase("code-edit", 1),),
        "no slower than stock",
        plain=False,
    ),
    Scenario(
        "ngram-mod-defaults-qa",
        "",
        "ngram-mod at its defaults on qa (the health matrix's other workload).",
        "gemma3-270m-ngram",
        (Phase("qa", 1),),
        "no slower than stock",
        plain=False,
    ),
)


def select(names: Sequence[str]) -> tuple[Scenario, ...]:
    """The named scenarios in catalog order (all of them when none are named)."""
    known = {s.name: s for s in SCENARIOS}
    for n in names:
        if n not in known:
            raise LlamaspecError(
                f"Unknown A/B scenario {n!r}.{did_you_mean(n, known)} Scenarios: "
                f"{', '.join(known)}. Pass --scenario NAME (repeatable) or leave it out for all."
            )
    return tuple(s for s in SCENARIOS if not names or s.name in names)


@dataclass(frozen=True)
class ArmRun:
    """One arm's sample of one scenario: tokens, wall seconds and speculation counters."""

    tokens: int
    wall: float
    drafted: int
    accepted: int
    returned: int

    @property
    def tps(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else 0.0


def without_spec_type(argv: Sequence[str], dialect: str) -> list[str]:
    """`argv` without the dialect's spec-type option and its value: a draft model given so is
    loaded, and drafted with only where the engine infers a type from it (upstream #25345)."""
    flag = dialects.find_dialect(dialect).flags.get("spec_type")
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif flag is not None and a == flag:
            skip = True
        elif flag is None or not a.startswith(f"{flag}="):
            out.append(a)
    return out


def arm_args(p: BenchPlan, s: Scenario, arm: str, dialect: str) -> list[str]:
    """The server arguments of one arm: the recipe's plain flags with slots for the
    scenario's clients, its speculative flags (not for the plain arm), the scenario's own
    flags for the patched arm, and --metrics."""
    base = bench.with_slots(p.plain_args, s.clients)
    if arm == PLAIN:
        return [*base, "--metrics"]
    spec = without_spec_type(p.spec_args, dialect) if s.drop_type else p.spec_args
    extra = s.patched_args if arm == PATCHED else ()
    return [*base, *spec, *extra, "--metrics"]


def _sample(artifact: Artifact, args: Sequence[str], s: Scenario, log: Path) -> ArmRun:
    """A fresh server for `args`, the scenario's phases in order, summed."""
    tokens = drafted = accepted = got = 0
    wall = 0.0
    with running(artifact.server, args, log) as srv:
        for ph in s.phases:
            sample = bench.run(srv, WORKLOADS[ph.workload], ph.clients, dict(ph.fields))
            tokens += sample.tokens
            wall += sample.wall_seconds
            drafted += sample.drafted
            accepted += sample.accepted
            got += sample.returned or 0
    return ArmRun(tokens, round(wall, 3), drafted, accepted, got)


def family_plan(
    s: Scenario, patched: Artifact, stock: Artifact, dialect: str, console: Console
) -> BenchPlan:
    """A reference family's target served plainly and with the scenario's flags; both builds
    must be able to serve the family (one paragraph otherwise)."""
    pair = None
    for a in (patched, stock):
        engine = str(a.manifest.get("engine"))
        pair = registry.pair_for(s.family, engine, dialect, server_help(a.server), console.print)
    assert pair is not None and s.family_spec is not None
    plain = ("-m", str(pair.target), "-c", "4096", "--no-warmup", *HYBRID_SERVING)
    spec = tuple(dialects.spec_args(dialect, s.family_spec))
    types = (s.family_spec.method,)
    return BenchPlan(s.family, plain, spec, types, pair.target, None, s.family_spec.n_max + 1)


def check_pair(patched: Artifact, stock: Artifact) -> None:
    """The two builds are one pin, one backend, one set of flags; only patches differ."""
    mp, ms = patched.manifest, stock.manifest
    for key in ("engine", "commit", "backend"):
        if mp.get(key) != ms.get(key):
            raise LlamaspecError(
                f"--stock {stock.id} is not the same build as {patched.id} without patches: "
                f"its {key} is {ms.get(key)!r}, not {mp.get(key)!r}. Build the stock server "
                "with the same options plus --no-default-patches (e.g. `llamaspec build "
                "--no-default-patches --no-smoke`) and pass its id."
            )
    applied = _applied(stock)
    if applied:
        raise LlamaspecError(
            f"--stock {stock.id} carries patches ({', '.join(applied)}): it is not stock. "
            "Build it with --no-default-patches and pass that build's id."
        )
    if patched.id == stock.id:
        raise LlamaspecError(
            f"--stock names the same build as --artifact ({patched.id}): give the build of the "
            "same pin made with --no-default-patches."
        )


def run(
    patched: Artifact,
    dist: Path,
    stock_id: str,
    scenarios: Sequence[Scenario],
    out_dir: Path,
    console: Console,
    *,
    repetitions: int = 3,
) -> Path:
    """`llamaspec patches ab`: measure, then write the report; its path without suffix."""
    from llamaspec.maint import patch_ab_report

    stock = load_artifact(dist, stock_id)
    report = measure(patched, stock, scenarios, out_dir, console, repetitions=repetitions)
    return patch_ab_report.write(report, out_dir, console)


def measure(
    patched: Artifact,
    stock: Artifact,
    scenarios: Sequence[Scenario],
    out_dir: Path,
    console: Console,
    *,
    repetitions: int = 3,
) -> dict[str, Any]:
    """Run every scenario `repetitions` times on both builds (and plain where asked); the
    report's JSON form (patch_ab_report writes it)."""
    check_pair(patched, stock)
    dialect = dialects.dialect_for(patched, console.print)
    plans: dict[str, BenchPlan] = {}
    for s in scenarios:
        if s.recipe in plans:
            continue
        if s.family:
            plans[s.recipe] = family_plan(s, patched, stock, dialect, console)
        else:
            recipe, target, draft = bench_plans.recipe_models(s.recipe, console)
            plan = bench_plans.recipe_plan(patched, recipe, target, draft, console)
            bench_plans.recipe_plan(stock, recipe, target, draft, console)  # stock accepts it
            plans[s.recipe] = plan
    logs = out_dir / f"patches-ab-{patched.id}-logs"
    arms = {s.name: [STOCK, PATCHED, *([PLAIN] if s.plain else [])] for s in scenarios}
    runs: dict[tuple[str, str], list[ArmRun]] = {
        (s.name, a): [] for s in scenarios for a in arms[s.name]
    }
    by_arm = {STOCK: stock, PATCHED: patched, PLAIN: patched}
    load_before, before_from = reliability.sample_before()
    during: list[float] = []
    started = time.monotonic()
    steps = repetitions * sum(len(a) for a in arms.values())
    with bar(console) as progress:
        task = progress.add_task("patches ab", total=steps)
        for rep in range(repetitions):
            for s in scenarios:
                order = arms[s.name] if rep % 2 == 0 else arms[s.name][::-1]
                for arm in order:
                    progress.update(task, description=f"{s.name}: {arm} ({rep + 1})")
                    args = arm_args(plans[s.recipe], s, arm, dialect)
                    log = logs / f"{s.name}-{arm}-{rep + 1}.log"
                    runs[(s.name, arm)].append(_sample(by_arm[arm], args, s, log))
                    progress.advance(task)
            if (now := reliability.load_now()) is not None:
                during.append(now)
    host = reliability.HostLoad(
        os.cpu_count() or 1,
        reliability.server_threads(next(iter(plans.values())).plain_args) if plans else None,
        load_before,
        tuple(during),
        reliability.load_now(),
        before_from,
    )
    rows = [
        summarize(s, {a: runs[(s.name, a)] for a in arms[s.name]}, plans[s.recipe], dialect)
        for s in scenarios
    ]
    load = reliability.load_reason(host)
    reasons = [f"{r['name']}: {why}" for r in rows for why in r["reasons"]]
    if load:
        reasons.append(load)
    return {
        "patched": {"id": patched.id, "patches": _applied(patched)},
        "stock": {"id": stock.id, "patches": _applied(stock)},
        "engine": patched.manifest.get("engine"),
        "commit": patched.manifest.get("commit"),
        "backend": patched.manifest.get("backend"),
        "machine": toolchain.machine(),
        "date": dt.date.today().isoformat(),
        "repetitions": repetitions,
        "exposure": "first: every sample starts its server afresh",
        "measure": "tokens per second of wall time over the scenario's traffic "
        "(prompt processing included)",
        "scenarios": rows,
        "host_load": host.to_json(),
        "wall_seconds": round(time.monotonic() - started, 1),
        "reliability": {
            "reliable": not reasons,
            "reasons": reasons,
            "spread_max": reliability.SPREAD_MAX,
        },
    }


def _applied(artifact: Artifact) -> list[str]:
    return [p["id"] for p in artifact.manifest.get("patches", ()) if p.get("status") == "applied"]


def _arm(samples: Sequence[ArmRun]) -> dict[str, Any]:
    tps = [x.tps for x in samples]
    return {
        "tps_by_repetition": [round(t, 2) for t in tps],
        "tps_median": round(statistics.median(tps), 2) if tps else 0.0,
        "tokens": sum(x.tokens for x in samples),
        "returned": sum(x.returned for x in samples),
        "drafted": sum(x.drafted for x in samples),
        "accepted": sum(x.accepted for x in samples),
    }


def _ratios(top: Sequence[ArmRun], bottom: Sequence[ArmRun]) -> list[float]:
    """top ÷ bottom per repetition (bench's per-repetition speedup)."""
    per = reliability.per_repetition([b.tps for b in bottom], [a.tps for a in top])
    return [round(r, 3) for r in per]


def summarize(
    s: Scenario, runs: Mapping[str, Sequence[ArmRun]], p: BenchPlan, dialect: str
) -> dict[str, Any]:
    """One scenario's row: each arm's speeds, patched ÷ stock per repetition and its median,
    the speedups over plain, and why the row is unreliable (if it is)."""
    ratios = _ratios(runs[PATCHED], runs[STOCK])
    spread = reliability.spread(ratios)
    reasons = []
    if spread is not None and spread > reliability.SPREAD_MAX:
        reasons.append(
            f"patched ÷ stock per repetition {ratios} spread {spread:.2f}× "
            f"(> {reliability.SPREAD_MAX}×): the machine, not the patch"
        )
    for arm, samples in runs.items():
        got, counted = sum(x.returned for x in samples), sum(x.tokens for x in samples)
        if counted and got / counted < reliability.RETURNED_FLOOR:
            reasons.append(f"{arm}: clients received {got} of the {counted} tokens counted")
    over_plain = {}
    if PLAIN in runs:
        for arm in (STOCK, PATCHED):
            per = _ratios(runs[arm], runs[PLAIN])
            over_plain[arm] = round(statistics.median(per), 3) if per else None
    return {
        "name": s.name,
        "patch": s.patch,
        "question": s.question,
        "goal": s.goal,
        "recipe": s.recipe,
        "family": s.family,
        "traffic": [ph.describe() for ph in s.phases],
        "commands": {arm: bench.shown(arm_args(p, s, arm, dialect)) for arm in runs},
        "arms": {arm: _arm(samples) for arm, samples in runs.items()},
        "patched_over_stock_by_repetition": ratios,
        "patched_over_stock": round(statistics.median(ratios), 3) if ratios else None,
        "spread": round(spread, 3) if spread is not None else None,
        "over_plain": over_plain,
        "reasons": reasons,
        "goal_met": goal_met(s, runs),
    }


def goal_met(s: Scenario, runs: Mapping[str, Sequence[ArmRun]]) -> bool:
    """Whether the scenario's goal holds. A drop_type scenario: patched drafted and stock did
    not. Otherwise patched must not be slower than stock (and, in a scenario with a plain
    arm, than plain too) beyond noise, where slower beyond noise means slower in every
    repetition: a median below 1 that some repetition contradicts is the machine."""
    if s.drop_type:
        return sum(x.drafted for x in runs[PATCHED]) > 0 and not any(x.drafted for x in runs[STOCK])
    others = [STOCK, *([PLAIN] if PLAIN in runs else [])]
    return not any(
        all(r < 1.0 for r in _ratios(runs[PATCHED], runs[o])) and runs[o] for o in others
    )
