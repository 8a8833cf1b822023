"""`llamaspec tune`: sweep the speculative settings a build supports, keep the fastest.

Candidates are recipe variants: each spec type the binary offers (a draft model where the
pair has one, every n-gram type, stacked draft + n-gram where the dialect stacks, MTP
where the model has heads), first at its defaults, then with its knobs moved (draft
length, minimum draft, p-min, n-gram sizes). Each candidate must first pass verify's fast
equivalence check (greedy output identical with and without it; one that fails is shown as
refused and never timed), then runs the workload mix once on a fresh server; the score is
the geometric mean of its speedups over the plain server, measured in the same run. One
timing of the best of many would favour luck (the winner's curse), so the best
`SECOND_PASS` are timed again in a second pass, interleaved workload by workload, and the
winner is chosen on both passes (the geometric mean of its two scores). A state file beside
the report keeps finished work, so an interrupted run resumes where it stopped. The winner
is written as a recipe whose `measured:` says where, on what and when it was measured.
The results, the state file and the report are perf.tune_report's; the recipe plans that
bench, tune and draft measure share are perf.bench_plans'.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from llamaspec import config
from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.server_help import help_flags, server_help
from llamaspec.paths import project_root, writable_root
from llamaspec.perf import bench, bench_plans, reliability, workloads
from llamaspec.perf.tune_report import (
    SECOND_PASS,
    CandidateResult,
    PassTiming,
    State,
    TuneReport,
    best,
    both_passes,
    leaders,
    score,
    write_report,
)
from llamaspec.proof import verify
from llamaspec.runtime.client import Server, running

# Knob values swept per spec type, in the order tried (defaults first).
DRAFT_N_MAX = (8, 4, 16)
DRAFT_P_MIN = (0.0, 0.5, 0.75)
MTP_N_MAX = (1, 2, 3)
NGRAM_MOD = ((8, 4, 16), (16, 8, 32), (24, 16, 64), (4, 2, 16), (12, 4, 48))  # match, min, max
NGRAM_MAP = ((12, 48), (6, 16), (4, 24), (8, 32), (3, 8))  # size-n, size-m
AS_WRITTEN = "the recipe as written"
# Seconds a candidate costs beyond its workload run: a server start and the fast check.
CANDIDATE_OVERHEAD_S = 20.0
# What a second-pass timing costs beyond the mix itself (a fresh server per workload); how
# many candidates it times again is tune_report.SECOND_PASS.
SECOND_PASS_START_S = 5.0


# ---------------------------------------------------------------- candidates


@dataclass(frozen=True)
class Candidate:
    """A variant of the recipe: spec settings to set, and extra server flags."""

    label: str
    spec: Mapping[str, Any]
    extra: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return json.dumps({"spec": dict(self.spec), "extra": list(self.extra)}, sort_keys=True)


def candidates(
    offered: Iterable[str],
    *,
    has_draft: bool,
    has_mtp: bool,
    stacks: bool,
    help_flags: set[str],
) -> list[Candidate]:
    """Every candidate, most promising first: each type at its defaults, then its knobs."""
    offered = set(offered)
    first: list[Candidate] = []
    later: list[Candidate] = []
    ngram_map = [t for t in ("ngram-map-k", "ngram-simple", "ngram-map-k4v") if t in offered]
    if "ngram-mod" in offered:
        for i, (match, lo, hi) in enumerate(NGRAM_MOD):
            c = Candidate(
                f"ngram-mod match {match}, {lo}–{hi}",
                {
                    "types": ["ngram-mod"],
                    "ngram_mod_n_match": match,
                    "ngram_mod_n_min": lo,
                    "ngram_mod_n_max": hi,
                },
            )
            (first if i == 0 else later).append(c)
    for t in ngram_map:
        flag_n, flag_m = f"--spec-{t}-size-n", f"--spec-{t}-size-m"
        knobs = flag_n in help_flags and flag_m in help_flags
        for i, (n, m) in enumerate(NGRAM_MAP if knobs else NGRAM_MAP[:1]):
            extra = (flag_n, str(n), flag_m, str(m)) if knobs and i > 0 else ()
            label = f"{t} n {n}, m {m}" if knobs else t
            (first if i == 0 else later).append(Candidate(label, {"types": [t]}, extra))
    if has_draft and "draft" in offered:
        for i, (n_max, p_min) in enumerate((n, p) for n in DRAFT_N_MAX for p in DRAFT_P_MIN):
            c = Candidate(
                f"draft n_max {n_max}, p_min {p_min}",
                {"types": ["draft"], "draft_n_max": n_max, "draft_n_min": 0, "draft_p_min": p_min},
            )
            (first if i == 0 else later).append(c)
        if stacks and "ngram-mod" in offered:
            match, lo, hi = NGRAM_MOD[0]
            later.append(
                Candidate(
                    "draft n_max 8 + ngram-mod",
                    {
                        "types": ["draft", "ngram-mod"],
                        "draft_n_max": 8,
                        "draft_p_min": 0.5,
                        "ngram_mod_n_match": match,
                        "ngram_mod_n_min": lo,
                        "ngram_mod_n_max": hi,
                    },
                )
            )
    if has_mtp and "mtp" in offered:
        for i, n in enumerate(MTP_N_MAX):
            c = Candidate(f"mtp n_max {n}", {"types": ["mtp"], "draft_n_max": n, "draft_n_min": 0})
            (first if i == 0 else later).append(c)
    return first + later


def apply(
    recipe: config.Recipe, engine: str, c: Candidate, name: str | None = None
) -> config.Recipe:
    """The recipe with candidate `c`'s settings, for `engine` (overrides folded in)."""
    base = recipe.for_engine(engine)
    if c.label == AS_WRITTEN:
        return base.model_copy(update={"name": name or base.name})
    keep = {k: v for k, v in base.spec.model_dump().items() if not k.startswith("ngram_mod")}
    if any(t in dialects.DRAFTING_TYPES for t in c.spec.get("types", ())):
        keep = {
            k: v for k, v in keep.items() if k not in ("draft_n_max", "draft_n_min", "draft_p_min")
        }
    spec = config.SpecSettings.model_validate({**keep, **dict(c.spec)})
    extra = strip_ngram_sizes(base.server.extra) + c.extra
    server = config.ServerSettings.model_validate({**base.server.model_dump(), "extra": extra})
    return base.model_copy(
        update={"name": name or base.name, "spec": spec, "server": server, "engines": {}}
    )


def strip_ngram_sizes(extra: Sequence[str]) -> tuple[str, ...]:
    """`extra` without n-gram size flags and their values (a candidate sets its own)."""
    out: list[str] = []
    skip = False
    for arg in extra:
        if skip:
            skip = False
        elif re.match(r"^--spec-ngram-[a-z0-9-]+-size-[nm]$", arg):
            skip = True
        else:
            out.append(arg)
    return tuple(out)


def second_pass_seconds(baseline_seconds: float, mix_size: int, n: int) -> float:
    """What timing `n` candidates again costs: plain and speculative mix, fresh servers."""
    return n * (baseline_seconds * 2.2 + mix_size * SECOND_PASS_START_S)


def estimate(reports: Path, recipe: str) -> float | None:
    """Seconds of one plain pass over a mix, from an earlier tune run of the recipe (any
    build or mix), so a budget too small is refused before any baseline runs."""
    for path in sorted(reports.glob(f"tune-{recipe}-*.state.json")):
        try:
            seconds = json.loads(path.read_text()).get("baseline", {}).get("_seconds")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(seconds, (int, float)) and seconds > 0:
            return float(seconds)
    return None


def fits(elapsed: float, per_candidate: float, budget: float) -> bool:
    return elapsed + per_candidate <= budget


def too_small(
    budget_minutes: float, spent: float, per_candidate: float, estimated: bool = False
) -> str:
    """The refusal for a budget that cannot fit one candidate (timed in both passes)."""
    need = math.ceil((spent + per_candidate) / 60 + 0.5)
    went = (
        f"the plain baseline takes about {spent:.0f} s (an earlier run's timing)"
        if estimated
        else f"{spent:.0f} s went to loading and the plain baseline"
    )
    return (
        f"A budget of {budget_minutes:g} min is too small for one candidate: {went}, and one "
        f"candidate, timed in both passes, needs about {per_candidate:.0f} s more. Pass "
        f"--budget {need} or more (the baseline is kept and reused next time)."
    )


# ---------------------------------------------------------------- the run


def check_model(target: Path, console: Console) -> tuple[Path, str]:
    """The model candidates are checked on: the target's F32 reference copy where one can be
    made (there speculation must be token-identical, so a failure is a real one), else the
    target itself (quantized, where a near-tie can fail a sound candidate)."""
    from llamaspec.engine.sources import sha256_file
    from llamaspec.proof import reference

    try:
        ref = reference.reference_copy(target, sha256_file(target), console.print)
    except LlamaspecError as exc:
        console.print(
            f"tune: checking candidates on {target.name} itself, not an F32 reference copy: "
            f"{str(exc).split('. ')[0]}."
        )
        return target, f"{target.name} itself (no F32 reference copy)"
    return ref.path, f"the F32 reference copy of {target.name} (sha256 {ref.sha256[:16]}…)"


def tune(
    artifact: Artifact,
    recipe_name: str,
    console: Console,
    *,
    budget_minutes: float = 10.0,
    mix: Sequence[workloads.Workload] | None = None,
    out_dir: Path | None = None,
    reports: Path = Path("reports"),
    fresh: bool = False,
    max_candidates: int | None = None,
) -> TuneReport:
    """Sweep, check, bench and pick; write the tuned recipe and a report; return the report."""
    mix = tuple(mix or workloads.select(workloads.TUNE_MIX))
    budget = budget_minutes * 60
    started = time.monotonic()
    recipe, target, draft = bench_plans.recipe_models(recipe_name, console)
    engine = artifact.manifest["engine"]
    dialect = dialects.dialect_for(artifact, console.print)
    help_text = server_help(artifact.server)
    offered = bench_plans.supported_types(dialect, help_text)
    models = config.load_models()
    pair = models.pairs[recipe.pair]
    has_mtp = models.models[pair.target].mtp
    d = dialects.find_dialect(dialect)
    written = recipe.for_engine(engine)
    cands = [Candidate(AS_WRITTEN, {"types": list(written.spec.types)}, written.server.extra)]
    cands += candidates(
        offered,
        has_draft=draft is not None,
        has_mtp=has_mtp,
        stacks=d.stacks,
        help_flags=help_flags(help_text),
    )
    cands = list({c.key: c for c in reversed(cands)}.values())[::-1]  # first of duplicates
    cands = [c for c in cands if set(c.spec.get("types", ())) <= offered]
    if max_candidates:
        cands = cands[:max_candidates]
    stem = f"tune-{recipe.name}-{artifact.id}"
    checked_on, checked_what = check_model(target, console)
    key = json.dumps(
        {
            "recipe": recipe.name,
            "artifact": artifact.id,
            "mix": [w.name for w in mix],
            "checked_on": checked_what,
        },
        sort_keys=True,
    )
    state = State.load(reports / f"{stem}.state.json", key, fresh)
    if state.done:
        console.print(
            f"tune: resuming {state.path}: {len(state.done)} candidate(s) already measured"
        )
    base_plan = bench_plans.recipe_plan(
        artifact, recipe, target, draft, console, dialect=dialect, help_text=help_text
    )
    logs = reports / f"{stem}-logs"
    per_candidate = None
    load_before, before_from = reliability.sample_before()
    known = None if "_seconds" in state.baseline else estimate(reports, recipe.name)
    if known is not None:
        # refuse a budget too small before the baseline runs, from an earlier run's timing
        need = known * 2.2 + CANDIDATE_OVERHEAD_S + second_pass_seconds(known, len(mix), 1)
        if not fits(time.monotonic() - started + known, need, budget):
            raise LlamaspecError(too_small(budget_minutes, known, need, estimated=True))
    with bench.progress(console) as bar:
        task = bar.add_task("tune", total=len(cands))
        bar.advance(task, sum(1 for c in cands if c.key in state.done))
        plain_args = [*bench.with_slots(base_plan.plain_args, 1), "--metrics"]
        with running(artifact.server, plain_args, logs / "plain.log") as plain_srv:
            if not state.baseline:
                bar.update(task, description="tune: plain baseline")
                t0 = time.monotonic()
                for w in mix:
                    state.baseline[w.name] = bench.run(plain_srv, w, 1).tokens_per_second
                state.baseline["_seconds"] = time.monotonic() - t0
                state.save()
            # a candidate runs the mix twice (plain, then speculative) after its check, and
            # the budget keeps room to time the leaders again
            base_s = state.baseline["_seconds"]
            per_candidate = base_s * 2.2 + CANDIDATE_OVERHEAD_S

            def reserve() -> float:
                n = min(SECOND_PASS, len(leaders(state.done)) + 1)
                return second_pass_seconds(base_s, len(mix), n)

            todo = [c for c in cands if c.key not in state.done]
            spent = time.monotonic() - started
            if todo and not fits(spent, per_candidate + reserve(), budget):
                raise LlamaspecError(too_small(budget_minutes, spent, per_candidate + reserve()))
            for c in todo:
                if not fits(time.monotonic() - started, per_candidate + reserve(), budget):
                    left = sum(1 for x in todo if x.key not in state.done)
                    console.print(
                        f"tune: budget reached; {left} candidate(s) left untried (run again "
                        "to go on from here)"
                    )
                    break
                bar.update(task, description=f"tune: {c.label}")
                state.done[c.key] = _measure(
                    artifact,
                    recipe,
                    engine,
                    c,
                    target,
                    checked_on,
                    draft,
                    dialect,
                    help_text,
                    mix,
                    plain_srv,
                    len(state.done),
                    logs,
                    console,
                )
                state.save()
                bar.advance(task)
            again = [k for k in leaders(state.done) if k not in state.second]
            if again:
                bar.update(task, description=f"tune: second pass ({len(again)} leaders)")
                by_key = {c.key: c for c in cands}
                timed = _second_pass(
                    artifact, recipe, engine, [by_key[k] for k in again if k in by_key],
                    target, draft, dialect, help_text, mix, plain_srv, logs, console,
                )  # fmt: skip
                state.second.update(timed)
                state.save()
    twice = {k for k in leaders(state.done) if k in state.second}
    results = {
        k: both_passes(r, state.second[k]) if k in twice else r for k, r in state.done.items()
    }
    winner = best(results)
    report = _report(artifact, recipe, mix, state.baseline, results, cands, winner, checked_what)
    host_load = reliability.HostLoad(
        os.cpu_count() or 1,
        reliability.server_threads(base_plan.plain_args),
        load_before,
        after=reliability.load_now(),
        before_from=before_from,
    )
    report = replace(report, host_load=host_load.to_json())
    md = write_report(report, reports, stem)
    report = replace(report, report_path=md)
    if winner is None:
        raise LlamaspecError(
            f"No candidate passed the equivalence check and finished within the budget; see "
            f"{md}. Nothing was written."
        )
    path = write_recipe(artifact, recipe, engine, winner, cands, out_dir, md, mix)
    verdict = reliability.judge_tune(report.to_json())
    console.print(
        ("tune: fastest is" if verdict.reliable else "tune: UNRELIABLE, fastest was")
        + f" {winner.label} (score {winner.score:.2f}× in pass 1, "
        f"{winner.score_pass2:.2f}× in pass 2, {winner.final_score:.2f}× over both, on "
        f"{', '.join(w.name for w in mix)}); wrote {path} and {md}",
        markup=False,
    )
    for why in verdict.reasons:
        console.print(f"  - {why}", markup=False, highlight=False)
    return replace(report, recipe_path=path)


def _measure(
    artifact: Artifact,
    recipe: config.Recipe,
    engine: str,
    c: Candidate,
    target: Path,
    checked_on: Path,
    draft: Path | None,
    dialect: str,
    help_text: str,
    mix: Sequence[workloads.Workload],
    plain_srv: Server,
    index: int,
    logs: Path,
    console: Console,
) -> CandidateResult:
    """Render, check, then time candidate `c` against the plain server, workload by
    workload (plain, then speculative), so drift on a busy machine hits both alike."""
    spec, extra = dict(c.spec), tuple(c.extra)
    try:
        r = apply(recipe, engine, c)
        p = bench_plans.recipe_plan(
            artifact, r, target, draft, console, dialect=dialect, help_text=help_text
        )
    except LlamaspecError as exc:
        return CandidateResult(
            c.label, spec, extra, passed=False, score=0.0, detail=f"not rendered: {exc}"
        )
    spec_args = tuple(bench.shown([a])[len("llama-server ") :] for a in p.spec_args)
    check = verify.fast_check(artifact, dialect, checked_on, list(p.spec_args), console)
    if not check.passed:
        return CandidateResult(
            c.label,
            spec,
            extra,
            passed=False,
            score=0.0,
            spec_args=spec_args,
            check=check.detail,
            refused=True,
        )
    args = [*bench.with_slots(p.plain_args, 1), *p.spec_args, "--metrics"]
    speedups: dict[str, float] = {}
    accepted: dict[str, tuple[int, int]] = {}
    with running(artifact.server, args, logs / f"candidate-{index}.log") as srv:
        for w in mix:
            plain = bench.run(plain_srv, w, 1).tokens_per_second
            s = bench.run(srv, w, 1)
            speedups[w.name] = round(s.tokens_per_second / plain, 3) if plain else 0.0
            accepted[w.name] = (s.accepted, s.drafted)
    return CandidateResult(
        c.label,
        spec,
        extra,
        passed=True,
        score=round(score(speedups), 4),
        spec_args=spec_args,
        check=check.detail,
        speedups=speedups,
        accepted_drafted=accepted,
    )


def _second_pass(
    artifact: Artifact,
    recipe: config.Recipe,
    engine: str,
    leading: Sequence[Candidate],
    target: Path,
    draft: Path | None,
    dialect: str,
    help_text: str,
    mix: Sequence[workloads.Workload],
    plain_srv: Server,
    logs: Path,
    console: Console,
) -> dict[str, PassTiming]:
    """Time the leaders again, interleaved: workload by workload, each leader in turn on a
    fresh server (its first exposure to that prompt) right after a plain run."""
    argv = {}
    for c in leading:
        p = bench_plans.recipe_plan(
            artifact, apply(recipe, engine, c), target, draft, console,
            dialect=dialect, help_text=help_text,
        )  # fmt: skip
        argv[c.key] = [*bench.with_slots(p.plain_args, 1), *p.spec_args, "--metrics"]
    speedups: dict[str, dict[str, float]] = {k: {} for k in argv}
    for w in mix:
        for i, (k, args) in enumerate(argv.items()):
            plain = bench.run(plain_srv, w, 1).tokens_per_second
            with running(artifact.server, args, logs / f"second-pass-{i}.log") as srv:
                s = bench.run(srv, w, 1)
            speedups[k][w.name] = round(s.tokens_per_second / plain, 3) if plain else 0.0
    return {k: PassTiming(sp, round(score(sp), 4)) for k, sp in speedups.items()}


def _report(
    artifact: Artifact,
    recipe: config.Recipe,
    mix: Sequence[workloads.Workload],
    baseline: Mapping[str, float],
    results: Mapping[str, CandidateResult],
    cands: Sequence[Candidate],
    winner: CandidateResult | None,
    checked_on: str,
) -> TuneReport:
    return TuneReport(
        recipe=recipe.name,
        artifact_id=artifact.id,
        engine=artifact.manifest.get("engine"),
        commit=artifact.manifest.get("commit"),
        machine=toolchain.machine(),
        date=dt.date.today().isoformat(),
        workloads=tuple(w.name for w in mix),
        plain_tps={k: round(v, 2) for k, v in baseline.items() if not k.startswith("_")},
        candidates_total=len(cands),
        results=tuple(results.values()),
        winner=winner,
        checked_on=checked_on,
    )


def relative(path: Path) -> str:
    root = project_root().resolve()
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return path.name


def write_recipe(
    artifact: Artifact,
    recipe: config.Recipe,
    engine: str,
    winner: CandidateResult,
    cands: Sequence[Candidate],
    out_dir: Path | None,
    report_md: Path,
    mix: Sequence[workloads.Workload],
) -> Path:
    """The winner as recipes/<recipe>-tuned.yaml (or in `out_dir`), validated."""
    c = Candidate(winner.label, winner.spec, tuple(winner.extra))
    name = f"{recipe.name}-tuned"
    tuned = apply(recipe, engine, c, name=name)
    m = artifact.manifest
    second = winner.speedups_pass2 or {}
    speedups = ", ".join(
        f"{k} {v:.2f}x" + (f"/{second[k]:.2f}x" if k in second else "")
        for k, v in (winner.speedups or {}).items()
    )
    data: dict[str, Any] = {
        "pair": tuned.pair,
        "description": f"{recipe.name} tuned by `llamaspec tune` for "
        f"{', '.join(w.name for w in mix)}: {winner.label}.",
        "spec": {
            "types": list(tuned.spec.types),
            **tuned.spec.model_dump(exclude_none=True, exclude_defaults=True, exclude={"types"}),
        },
        "server": tuned.server.model_dump(exclude_none=True, exclude_defaults=True),
    }
    if tuned.server.extra:
        # n-gram size flags are this engine's spelling: keep them to it
        data["server"].pop("extra", None)
        data["engines"] = {engine: {"extra": list(tuned.server.extra)}}
    data["measured"] = {
        "hardware": toolchain.machine()["description"],
        "engine": f"{engine} {str(m.get('commit') or 'local')[:12]} ({m.get('backend', 'cpu')})",
        "artifact": artifact.id,
        "date": dt.date.today().isoformat(),
        "result": f"{speedups} over plain in passes 1/2 (score {winner.final_score:.2f}x "
        "over both)",
        "report": relative(report_md),
    }
    config.parse(config.Recipe, {"name": name, **data}, f"the tuned recipe {name}")
    where = out_dir or (writable_root(project_root()) / "recipes")
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.yaml"
    header = f"# Written by `llamaspec tune {recipe.name}`; measured, not hand-written.\n"
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path
