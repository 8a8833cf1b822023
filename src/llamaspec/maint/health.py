"""`llamaspec maint health`: one health row per upstream build, written as each completes.

For each pin of the list, in order: build it, run the strict tier for the draft and n-gram
types it offers, a first-exposure bench on the copy and qa workloads, and the
synthetic-acceptance sweep. Every step is a callable (`Steps`), so the runner is tested with
fakes; a step that fails is recorded with a one-line reason and the run goes on. After each
pin the whole report (health_report) is written again, so an interrupted run resumes from it
without rebuilding the pins it finished. `steps_for` gives the real steps: the build
pipeline, verify's strict tier, bench and the limit sweep.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.errors import LlamaspecError, choose
from llamaspec.maint import health_report
from llamaspec.maint.health_report import NO_SYNTH, WORKLOADS, HealthPin, HealthReport, Row

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.config import Engine
    from llamaspec.config.patches import Defect
    from llamaspec.engine.artifact import Artifact

Say = Callable[[str], None]
DEFAULT_RECIPE = "gemma3-270m-ngram"
LOGS = "health-logs"  # under the reports folder: each pin's verify and bench reports


@dataclass(frozen=True)
class Strict:
    """The strict tier's word on a build: the types it offers, and each method exact or not."""

    types: tuple[str, ...]
    exact: Mapping[str, bool]
    defects: Mapping[str, str] = field(default_factory=dict)  # defect id → status
    crashed: Mapping[str, str] = field(default_factory=dict)  # method → why its run failed
    one_slot: tuple[str, ...] = ()  # methods the build refused on more than one slot


@dataclass(frozen=True)
class Bench:
    """First-exposure speedups by workload, or why the bench does not apply to the build."""

    speedups: Mapping[str, float] = field(default_factory=dict)
    na: str = ""
    unreliable: str = ""  # bench's own verdict (perf.reliability): why it cannot be trusted


@dataclass(frozen=True)
class Steps:
    """What the runner does to each pin. `sweep` returns (c, per-round overhead ms), or None
    for a build without synthetic acceptance; `defects` says, for a pin that did not build,
    which catalogued defects are known at it. None skips a step."""

    build: Callable[[HealthPin], Artifact]
    strict: Callable[[Artifact], Strict] | None = None
    bench: Callable[[Artifact], Bench] | None = None
    sweep: Callable[[Artifact], tuple[float, float] | None] | None = None
    defects: Callable[[HealthPin], Mapping[str, str]] = lambda _pin: {}


def one_line(exc: BaseException) -> str:
    """A failure as one line: a LlamaspecError's message, else the exception's type too."""
    text = exc.message if isinstance(exc, LlamaspecError) else f"{type(exc).__name__}: {exc}"
    # a server's command line names this machine's paths: the step's log keeps it
    return " ".join(str(text).split(" Command: ")[0].split())


def judge(pin: HealthPin, steps: Steps, say: Say) -> Row:
    """Build → strict → bench → sweep for one pin; each failure recorded, the rest still run."""
    started = time.monotonic()
    row = Row(pin=pin)
    failures: dict[str, str] = {}
    try:
        artifact = steps.build(pin)
    except Exception as exc:  # a pin that does not build is a row that says why
        failures["build"] = one_line(exc)
        say(f"health: {pin.short} build failed: {failures['build']}")
        return replace(
            row,
            failures=failures,
            defects=steps.defects(pin),
            seconds=round(time.monotonic() - started, 1),
        )
    row = replace(row, artifact=artifact.id)
    say(f"health: {pin.short} built: {artifact.id}")
    for name in ("strict", "bench", "sweep"):
        step = getattr(steps, name)
        if step is None:
            continue
        say(f"health: {pin.short} {name} ...")
        try:
            got = step(artifact)
        except Exception as exc:  # a long run records every failure and goes on (^C stops it)
            failures[name] = one_line(exc)
            say(f"health: {pin.short} {name} failed: {failures[name]}")
            continue
        if name == "strict":
            row = replace(
                row,
                types=tuple(got.types),
                exact=dict(got.exact),
                defects=got.defects,
                crashed=dict(got.crashed),
                one_slot=tuple(got.one_slot),
            )
            bad = [m for m, e in got.exact.items() if not e and m not in got.crashed]
            say(
                f"health: {pin.short} strict: "
                + (f"NOT exact: {', '.join(bad)}" if bad else "exact")
                + (f"; crashed: {', '.join(got.crashed)}" if got.crashed else "")
            )
        elif name == "bench":
            row = replace(
                row, speedups=dict(got.speedups), bench_na=got.na, bench_unreliable=got.unreliable
            )
            shown = ", ".join(f"{w} {v:.2f}×" for w, v in got.speedups.items())
            mark = f" (unreliable: {got.unreliable})" if got.unreliable else ""
            say(f"health: {pin.short} bench: {shown or 'n/a: ' + got.na}{mark}")
        elif got is None:
            row = replace(row, synth_na=NO_SYNTH)
            say(f"health: {pin.short} sweep: {NO_SYNTH}")
        else:
            c, overhead = got
            row = replace(row, synth_c=float(c), overhead_ms=float(overhead))
            say(f"health: {pin.short} sweep: c {c:.3g}, per-round overhead {overhead:.2f} ms")
    if not row.defects:
        row = replace(row, defects=steps.defects(pin))
    return replace(row, failures=failures, seconds=round(time.monotonic() - started, 1))


def run(
    pins: Sequence[HealthPin],
    steps: Steps,
    out_dir: Path,
    say: Say,
    *,
    resume: bool = False,
    settings: Mapping | None = None,
    machine: Mapping | None = None,
    listed: Sequence[HealthPin] = (),
) -> HealthReport:
    """Every pin in order, merged into the report under `out_dir`: rows of the health list
    (`listed`, in its order) that this run does not judge are kept from it, and a pin that
    fails to build where it built before keeps its earlier row (a broken toolchain does not
    wipe a matrix). The report is rewritten after each pin; with `resume` the pins it already
    holds are kept, not rebuilt. Rows made with other settings are not mixed in: that is one
    paragraph before anything is built."""
    js, _md = health_report.paths(out_dir)
    earlier = health_report.read(js) if js.is_file() else None
    done = {r.pin.key: r for r in earlier.rows} if earlier else {}
    order = [*listed, *(p for p in pins if p not in listed)]
    chosen = {p.key for p in pins}
    kept_keys = {p.key for p in order if p.key in done and (resume or p.key not in chosen)}
    settings = dict(settings or {})
    if earlier and kept_keys and dict(earlier.settings) != settings:
        raise LlamaspecError(
            f"{js} holds rows measured with other settings ({_settings(earlier.settings)}) "
            f"than this run's ({_settings(settings)}), and this run would keep "
            f"{len(kept_keys)} of them beside its own. Run with the same settings, give "
            "another --reports folder, or judge every pin of the list (no --pins, no "
            "--engine) to replace them all."
        )
    new: dict[str, Row] = {}

    def merged() -> tuple[Row, ...]:
        return tuple(r for p in order if (r := new.get(p.key) or done.get(p.key)) is not None)

    report = HealthReport(rows=(), settings=settings, machine=dict(machine or {}))
    for i, pin in enumerate(pins, 1):
        kept = done.get(pin.key)
        if resume and kept is not None:
            say(f"health: [{i}/{len(pins)}] {pin.short} {pin.label}: done in an earlier run; kept")
            continue
        say(f"health: [{i}/{len(pins)}] {pin.engine} {pin.short} {pin.label} ({pin.date})")
        row = judge(pin, steps, say)
        if not row.built and kept is not None and kept.built:
            why = row.failures.get("build", "build failed")
            say(f"health: {pin.short} did not build this time ({why}); its earlier row is kept")
        else:
            new[pin.key] = row
        report = replace(report, rows=merged())
        health_report.write(report, out_dir)
    report = replace(report, rows=merged(), complete=True)
    health_report.write(report, out_dir)
    for flag in report.flags:
        say(f"health: REGRESSION {flag.engine} {flag.pin.split('@')[1][:7]}: {flag.describe()}")
    return report


def _settings(settings: Mapping) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items()) or "none recorded"


# --- the list of pins ----------------------------------------------------------------------


def select(
    pins: Sequence[HealthPin], engines: Sequence[str], wanted: Sequence[str], known: Sequence[str]
) -> list[HealthPin]:
    """The pins of the named engines (all when none), and of those only the named pins (a SHA
    prefix or a label; several also as A,B); an unknown engine or a pin not in the list is
    one paragraph."""
    for e in engines:
        choose("engine", e, known)
    chosen = [p for p in pins if not engines or p.engine in engines]
    for text in wanted:
        if not all(w.strip() for w in text.split(",")):
            raise LlamaspecError(
                f"--pins {text!r} has an empty item (a stray comma, or only blanks between "
                "two): name each pin, e.g. `--pins b8f1a3c,b4567`, or leave --pins out for "
                "every pin of the list."
            )
    wanted = [w.strip() for text in wanted for w in text.split(",")]
    if not wanted:
        return chosen
    out = []
    for w in wanted:
        hits = [p for p in chosen if w and (p.pin.startswith(w.lower()) or p.label == w)]
        if not hits:
            listed = ", ".join(f"{p.short} ({p.engine} {p.label})".strip() for p in chosen)
            raise LlamaspecError(
                f"--pins {w!r} is not in the health list"
                + (f" of {', '.join(engines)}" if engines else "")
                + f"; give a SHA prefix or a label of one of: {listed or 'none'}. A pin not in "
                "the list is judged by `llamaspec bump --build` instead."
            )
        out += [p for p in hits if p not in out]
    return [p for p in chosen if p in out]


def command(
    engines: Sequence[str],
    wanted: Sequence[str],
    dist: Path,
    reports: Path,
    console: Console,
    *,
    resume: bool = False,
    recipe: str = DEFAULT_RECIPE,
    repetitions: int = 2,
    mirrors: Mapping[str, Path] | None = None,
    bench: bool = True,
    sweep: bool = True,
) -> HealthReport:
    """`llamaspec maint health`: check the request, then `run` the chosen pins."""
    from llamaspec import config
    from llamaspec.engine.artifact import check_dist
    from llamaspec.engine.toolchain import machine

    known = list(config.load_engines())
    for e, where in (mirrors or {}).items():
        choose("engine", e, known)
        if not Path(where).is_dir():
            raise LlamaspecError(
                f"--mirror {e}={where}: {where} is not a folder; give a clone of {e} with "
                "history (bare or not)."
            )
    pins = select(health_list(), engines, wanted, known)
    if not pins:
        raise LlamaspecError("The health list holds no pin of the engines named.")
    if bench or sweep:
        from llamaspec.models import recipes

        recipes.find(recipe)  # an unknown recipe is refused before any build or probe of dist/
    check_dist(dist)
    settings = {
        "recipe": recipe,
        "repetitions": repetitions,
        "patches": "none (each engine's own code)",
        "bench": "first exposure, 1 client, copy and qa" if bench else "off (--no-bench)",
        "sweep": "on" if sweep else "off (--no-sweep)",
    }
    steps = steps_for(
        dist,
        reports,
        console,
        recipe=recipe,
        repetitions=repetitions,
        mirrors=mirrors,
        bench=bench,
        sweep=sweep,
    )
    report = run(
        pins,
        steps,
        reports,
        console.print,
        resume=resume,
        settings=settings,
        machine=machine(),
        listed=health_list(),
    )
    md = health_report.paths(reports)[1]
    console.print(f"health: {len(report.rows)} build(s), {len(report.flags)} regression(s): {md}")
    return report


def health_list(root: Path | None = None) -> list[HealthPin]:
    """The pins `health` judges, per engine oldest first: each engine's default pin and its
    history list (engines.yaml `history:`, `config.known_pins`)."""
    from llamaspec import config

    pins = [
        HealthPin(
            e.name,
            h.pin,
            h.date.isoformat(),
            e.tag if h.pin == e.pin else (f"{h.pypi.package}=={h.pypi.version}" if h.pypi else ""),
            "default pin" if h.pin == e.pin else h.note,
        )
        for e in config.load_engines(root).values()
        for h in config.known_pins(e)
    ]
    return sorted(pins, key=lambda p: (p.engine, p.date))


# --- the real steps ----------------------------------------------------------------------


def steps_for(
    dist: Path,
    reports: Path,
    console: Console,
    *,
    recipe: str = DEFAULT_RECIPE,
    repetitions: int = 2,
    mirrors: Mapping[str, Path] | None = None,
    bench: bool = True,
    sweep: bool = True,
    root: Path | None = None,
    records: Mapping[str, Engine] | None = None,
) -> Steps:
    """The pipeline's build (the engine's own code: no llamaspec patches), verify's strict
    tier, bench and the limit sweep. `mirrors`: engine → a clone with history to build
    non-default pins from; `records`: pin → the engine record to build it with (bump's
    candidate, before engines.yaml names it)."""
    logs = reports / LOGS

    def build(pin: HealthPin) -> Artifact:
        mirror = (mirrors or {}).get(pin.engine)
        return build_pin(pin, dist, console, mirror, root, (records or {}).get(pin.pin))

    return Steps(
        build=build,
        strict=lambda a: strict_tier(
            a, logs, console, root, (mirrors or {}).get(str(a.manifest.get("engine")))
        ),
        bench=(lambda a: first_exposure(a, recipe, repetitions, logs, console)) if bench else None,
        sweep=(lambda a: limit_sweep(a, console)) if sweep else None,
        defects=lambda pin: defect_status(
            pin.engine, pin.pin, None, root, mirror=(mirrors or {}).get(pin.engine)
        ),
    )


def build_pin(
    pin: HealthPin,
    dist: Path,
    console: Console,
    mirror: Path | None,
    root: Path | None,
    record: Engine | None = None,
) -> Artifact:
    from llamaspec.engine.pipeline import BuildSpec, run_build

    spec = BuildSpec(
        engine=pin.engine,
        pin=pin.pin,
        source="local" if mirror else "auto",
        source_dir=mirror,
        dist=dist,
        no_default_patches=True,
    )
    return run_build(spec, console, root, engine=record)


def compare(
    pins: Sequence[HealthPin],
    dist: Path,
    reports: Path,
    console: Console,
    *,
    mirror: Path | None = None,
    records: Mapping[str, Engine] | None = None,
) -> HealthReport:
    """The health rows of one engine's `pins` in order (bump: the current pin, then the
    candidate) and so their regression flags; written nowhere, the caller reports them."""
    mirrors = {pins[0].engine: mirror} if pins and mirror else None
    steps = steps_for(dist, reports, console, mirrors=mirrors, records=records)
    rows = tuple(judge(p, steps, console.print) for p in pins)
    return HealthReport(rows=rows, complete=True)


def offered_types(dialect: str, help_text: str) -> tuple[str, ...]:
    """The draft and n-gram spec types this binary offers."""
    from llamaspec.models.methods import EMBEDDED_TYPES, offered

    return tuple(t for t in EMBEDDED_TYPES if offered(dialect, help_text, t) is None)


def strict_tier(
    artifact: Artifact,
    logs: Path,
    console: Console,
    root: Path | None,
    mirror: Path | None = None,
) -> Strict:
    """verify's strict tier on the embedded model's F32 copy, every draft and n-gram method
    the build offers; a method is exact when every case is token-identical. A method whose
    server fails is judged alone and recorded as crashed; `mirror` (a clone with history)
    lets the defects' fixes be found among the build's ancestors."""
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.server_help import server_help
    from llamaspec.proof import suite

    help_text = server_help(artifact.server)
    dialect = dialect_for(artifact, console.print, root)
    types = offered_types(dialect, help_text)
    if not types:
        raise LlamaspecError(f"{artifact.id} offers none of the draft and n-gram spec types")

    def tier(methods: Sequence[str] | None) -> list:
        outcome = suite.builtin(
            artifact, dialect, ["embedded"], ["strict"], methods, (), logs, console
        )
        return [m for report in outcome.reports for m in report.methods if m.skipped is None]

    crashed: dict[str, str] = {}
    try:
        judged = tier(None)
    except LlamaspecError as exc:
        # one method's crash (a server that aborts) must not hide the others: judge each
        # method on its own, and record the one that fails with its reason
        console.print(f"health: strict tier failed ({one_line(exc)}); judging each type alone")
        judged = []
        for t in types:
            try:
                judged += tier([t])
            except LlamaspecError as one:
                crashed[t] = one_line(one)
                console.print(f"health: strict {t}: {crashed[t]}")
        if not judged:
            raise
    exact = {m.method: all(c.kind == "identical" for c in m.cases) for m in judged}
    exact.update(dict.fromkeys(crashed, False))
    cases = [c for m in judged for c in m.cases]
    m = artifact.manifest
    defects = defect_status(str(m.get("engine")), str(m.get("commit")), cases, root, m, mirror)
    one_slot = tuple(m.method for m in judged if m.one_slot)
    return Strict(types, exact, defects, crashed, one_slot)


def defect_status(
    engine: str,
    commit: str,
    cases: Sequence | None,
    root: Path | None,
    manifest: Mapping | None = None,
    mirror: Path | None = None,
) -> dict[str, str]:
    """Each catalogued defect of `engine`: fixed (its patch applied or in base, or with
    `mirror` its fix among the pin's ancestors), present (catalogued at this very pin), or
    at another pin what the strict tier's `cases` showed (a short-output defect shows as
    short outputs; others need models it does not run)."""
    from llamaspec import config

    status = {p.get("id"): p.get("status") for p in (manifest or {}).get("patches", [])}
    merged = {p.id: p for p in config.load_series(root) if p.state == "merged" and p.source.commits}

    def verdict(d: Defect) -> str:
        if status.get(d.fixed_by) in ("applied", "in-base"):
            return f"fixed ({d.fixed_by} {status[d.fixed_by]})"
        if commit in d.pins:
            return "present (catalogued at this pin)"
        fix = _fix_of(d, merged)
        in_base = _ancestors(mirror, fix[1], commit) if fix and mirror else None
        if fix and in_base:
            return f"fixed in base ({fix[0]} is an ancestor of the pin; not re-run here)"
        if fix and in_base is False and d.symptom != "short-output":
            return (
                f"not fixed ({fix[0]} is not an ancestor of the pin); the strict tier on the "
                "embedded model cannot show it"
            )
        if cases is None:
            return "unknown (not judged: the build or its strict tier failed)"
        if d.symptom == "short-output" and d.targets == "all":
            n = sum(1 for c in cases if c.kind == "short" or getattr(c, "defect", None) == d.id)
            return f"present ({n} short output(s))" if n else "not seen"
        return "not tested (the strict tier on the embedded model cannot show it)"

    return {d.id: verdict(d) for d in config.load_defects(root) if d.engine == engine}


def _fix_of(d: Defect, merged: Mapping) -> tuple[str, tuple[str, ...]] | None:
    """(a label, the engine commits that fix defect `d`): its own `fix_commit`, or the
    commits of the merged catalog patch named in `fixed_by`; None where neither is known."""
    if d.fix_commit:
        label = d.fixed_by or d.fix_commit[:9]
        return f"{label} ({d.fix_commit[:9]})", (d.fix_commit,)
    p = merged.get(d.fixed_by)
    if p is None:
        return None
    pr = f" #{p.upstream.pr}" if p.upstream and p.upstream.pr else ""
    return f"{p.id}{pr}", tuple(p.source.commits)


def _ancestors(mirror: Path, commits: Sequence[str], pin: str) -> bool | None:
    """Whether every one of `commits` is an ancestor of `pin` (or the pin itself) in the
    clone `mirror`; None where git cannot tell (a commit the clone lacks)."""
    from llamaspec.engine import gitutil

    for c in commits:
        got = gitutil.is_ancestor(mirror, c, pin)
        if got is not True:
            return got
    return True


def first_exposure(
    artifact: Artifact, recipe: str, repetitions: int, logs: Path, console: Console
) -> Bench:
    """The recipe benched on copy and qa, one client, first exposure only, no cost model;
    n/a where the build lacks the recipe's spec type."""
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.server_help import server_help
    from llamaspec.perf import bench, bench_plans, workloads

    found, target, draft = bench_plans.recipe_models(recipe, console)
    help_text = server_help(artifact.server)
    dialect = dialect_for(artifact, console.print)
    offered = bench_plans.supported_types(dialect, help_text)
    engine = str(artifact.manifest.get("engine"))
    lacking = [t for t in found.for_engine(engine).spec.types if t not in offered]
    if lacking:
        return Bench(na=f"recipe {recipe} needs {', '.join(lacking)}, which this build lacks")
    p = bench_plans.recipe_plan(artifact, found, target, draft, console, dialect=dialect)
    report = bench.bench(
        artifact,
        p,
        workloads.select(WORKLOADS),
        logs,
        console,
        concurrency=(1,),
        repetitions=repetitions,
        cost_model=False,
    )
    verdict = report.reliability or {}
    return Bench(
        {c.workload: float(c.summary["speedup"]) for c in report.workloads},
        unreliable="" if verdict.get("reliable", True) else "; ".join(verdict.get("reasons", [])),
    )


def limit_sweep(artifact: Artifact, console: Console) -> tuple[float, float] | None:
    """The synthetic-acceptance sweep's fitted c and per-round overhead (ms); None where the
    build has no synthetic acceptance."""
    from llamaspec.models import dialects
    from llamaspec.models.embedded import embedded_model
    from llamaspec.models.server_help import server_help
    from llamaspec.perf import limit

    if not limit.offers_synthetic(dialects.dialect_for(artifact), server_help(artifact.server)):
        return None
    got = limit.sweep(artifact, embedded_model(console.print), limit.LimitPlan(), console.print)
    return got.c, got.overhead_ms


__all__ = [
    "Bench",
    "HealthPin",
    "Steps",
    "Strict",
    "compare",
    "defect_status",
    "judge",
    "run",
    "select",
    "steps_for",
]
