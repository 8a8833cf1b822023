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
Each candidate's result is a frozen `CandidateResult`, the run's a frozen `TuneReport`; their
`to_json()` is what the state file and tune-<recipe>-<artifact>.json hold.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from llamaspec import config
from llamaspec import lock as lockfile
from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.models import catalog, dialects, recipes
from llamaspec.paths import project_root, writable_root
from llamaspec.perf import bench, workloads
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
# How many of the fastest candidates the second pass times again, and what a second-pass
# timing costs beyond the mix itself (a fresh server per workload).
SECOND_PASS = 3
SECOND_PASS_START_S = 5.0


# ---------------------------------------------------------------- recipes and models


def recipe_models(name: str, console: Console) -> tuple[config.Recipe, Path, Path | None]:
    """A catalog recipe and its pair's files on disk (verified by `models pull`).

    Only the embedded pair is fetched here; other pairs must be pulled first."""
    root = project_root()
    recipe, models = recipes.find(name, root)
    pair = models.pairs[recipe.pair]
    handles = [h for h in (pair.target, pair.draft) if h is not None]
    locked = lockfile.load(root)["models"]
    missing = [
        h
        for h in handles
        if models.models[h].source != "embedded"
        and catalog.local_path(models.models[h], locked.get(h)) is None
    ]
    if missing:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} needs pair {recipe.pair!r}, whose model(s) "
            f"{', '.join(missing)} are not downloaded. `llamaspec models pull {recipe.pair}` "
            "fetches and verifies them; bench and tune download only the embedded pair "
            "themselves."
        )
    files = catalog.pull(models, recipe.pair, root, console)
    return recipe, files.target, files.draft


def adhoc_recipe(
    target: Path, draft: Path | None, types: Sequence[str], n_max: int | None
) -> config.Recipe:
    """A recipe for `--target FILE [--draft FILE] --spec TYPE…`."""
    for path, what in ((target, "--target"), (draft, "--draft")):
        if path is not None and not Path(path).is_file():
            raise LlamaspecError(
                f"{what} {path} is not a file. Give the path of a GGUF model on this machine "
                "(`llamaspec models pull PAIR` prints where pulled models are)."
            )
    if not types:
        raise LlamaspecError(
            "An ad-hoc bench needs --spec TYPE (repeatable to stack), e.g. --spec ngram-mod, "
            f"or --spec draft with --draft FILE. Spec types: {', '.join(config.SPEC_TYPES)}."
        )
    for t in types:
        if t not in config.SPEC_TYPES:
            raise LlamaspecError(
                f"Unknown spec type {t!r}.{did_you_mean(t, config.SPEC_TYPES)} Spec types: "
                f"{', '.join(config.SPEC_TYPES)}."
            )
    if draft is None and any(t in dialects.MODEL_TYPES for t in types):
        raise LlamaspecError(
            f"--spec {'/'.join(t for t in types if t in dialects.MODEL_TYPES)} drafts with a "
            "draft model: add --draft FILE, or pick a draft-free type such as ngram-mod."
        )
    spec: dict[str, Any] = {"types": list(dict.fromkeys(types))}
    if n_max:
        spec["draft_n_max"] = n_max
    stem = re.sub(r"[^a-z0-9._-]+", "-", Path(target).stem.lower()).strip("-.") or "model"
    return config.parse(
        config.Recipe,
        {
            "name": f"adhoc-{stem}"[:60],
            "pair": "adhoc",
            "description": f"ad-hoc: {Path(target).name}, {', '.join(types)}",
            "spec": spec,
            "server": {"ctx": 4096, "parallel": 1},
        },
        "the ad-hoc bench settings",
    )


def supported_types(dialect: str, help_text: str) -> set[str]:
    """The spec types this binary offers: its dialect's, minus those its --help lacks."""
    d = dialects.find_dialect(dialect)
    choices = dialects.spec_type_choices(help_text)
    out = set()
    for t in d.types:
        listed = choices is None or d.type_names.get(t) in choices
        if t in d.by_model or t in d.switches or listed:
            out.add(t)
    return out


def recipe_plan(
    artifact: Artifact,
    recipe: config.Recipe,
    target: Path,
    draft: Path | None,
    console: Console,
    *,
    dialect: str | None = None,
    help_text: str | None = None,
) -> bench.BenchPlan:
    """Render `recipe` for this artifact, check it against the binary's --help, and split
    it into the plain and speculative server arguments."""
    m = artifact.manifest
    engine = m["engine"]
    dialect = dialect or dialects.dialect_for(artifact, console.print)
    help_text = help_text if help_text is not None else dialects.server_help(artifact.server)
    offered = supported_types(dialect, help_text)
    lacking = [t for t in recipe.for_engine(engine).spec.types if t not in offered]
    if lacking:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} uses spec type {', '.join(lacking)}, which this build "
            f"({artifact.id}, {engine} {str(m.get('commit') or 'local')[:12]}) lacks; it has "
            f"{', '.join(sorted(offered)) or 'none'}. Pick a recipe with one of those, or "
            "build a pin that has it."
        )
    cmd = recipes.render_for(recipe, artifact, dialect, target, draft)
    dialects.check_against_help(cmd, help_text, f"{artifact.id}/llama-server")
    spec = recipe.for_engine(engine).spec
    # n-gram drafts run to their engine's own defaults (upstream: ngram-mod 64, maps 48)
    ngram_default = 64 if any(t.startswith("ngram") for t in spec.types) else 0
    longest = max(spec.ngram_mod_n_max or ngram_default, _extra_size_m(cmd.argv))
    k_max = max(spec.draft_n_max, longest, 16) + 1
    return bench.plan(recipe.name, cmd.argv, spec.types, Path(target), draft, min(k_max, 65))


def _extra_size_m(argv: Sequence[str]) -> int:
    sizes = [int(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a.endswith("-size-m")]
    return max(sizes, default=0)


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


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class PassTiming:
    """A candidate's speedups over the plain server, workload by workload, and their score."""

    speedups: Mapping[str, float]
    score: float

    def to_json(self) -> dict:
        return {"speedups": dict(self.speedups), "score": self.score}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PassTiming:
        return cls(dict(raw["speedups"]), raw["score"])


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's result: not rendered (`detail`), refused by the fast check, or timed
    (`speedups`), and for a leader its second timing too (`score_pass2`, `final_score`).

    `to_json()` holds only the keys that apply, in a fixed order."""

    label: str
    spec: Mapping[str, Any]
    extra: tuple[str, ...]
    passed: bool
    score: float
    spec_args: tuple[str, ...] | None = None  # None: not rendered
    check: str | None = None  # the fast check's detail (None: not rendered)
    refused: bool = False  # the fast check failed: never timed
    detail: str | None = None  # why it was not rendered
    speedups: Mapping[str, float] | None = None
    accepted_drafted: Mapping[str, tuple[int, int]] | None = None
    speedups_pass2: Mapping[str, float] | None = None
    score_pass2: float | None = None
    spread: float | None = None  # |pass 1 − pass 2|
    final_score: float | None = None  # geometric mean of both passes

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "label": self.label,
            "spec": dict(self.spec),
            "extra": list(self.extra),
        }
        if self.spec_args is not None:
            out["spec_args"] = list(self.spec_args)
        if self.check is not None:
            out["check"] = self.check
        out["passed"] = self.passed
        if self.refused:
            out["refused"] = True
        if self.speedups is not None:
            out["speedups"] = dict(self.speedups)
        if self.accepted_drafted is not None:
            out["accepted_drafted"] = {k: list(v) for k, v in self.accepted_drafted.items()}
        out["score"] = self.score
        if self.detail is not None:
            out["detail"] = self.detail
        if self.speedups_pass2 is not None:
            out["speedups_pass2"] = dict(self.speedups_pass2)
        if self.score_pass2 is not None:
            out["score_pass2"] = self.score_pass2
        if self.spread is not None:
            out["spread"] = self.spread
        if self.final_score is not None:
            out["final_score"] = self.final_score
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CandidateResult:
        pairs = raw.get("accepted_drafted")
        spec_args = raw.get("spec_args")
        return cls(
            label=raw["label"],
            spec=dict(raw["spec"]),
            extra=tuple(raw["extra"]),
            passed=raw["passed"],
            score=raw["score"],
            spec_args=None if spec_args is None else tuple(spec_args),
            check=raw.get("check"),
            refused=bool(raw.get("refused", False)),
            detail=raw.get("detail"),
            speedups=raw.get("speedups"),
            accepted_drafted=None if pairs is None else {k: tuple(v) for k, v in pairs.items()},
            speedups_pass2=raw.get("speedups_pass2"),
            score_pass2=raw.get("score_pass2"),
            spread=raw.get("spread"),
            final_score=raw.get("final_score"),
        )


@dataclass(frozen=True)
class TuneReport:
    """What `tune` measured and chose; `to_json()` is the report file's content (the fields
    up to `checked_on`, in order), and the paths say where the report and recipe went."""

    recipe: str
    artifact_id: str
    engine: str | None
    commit: str | None
    machine: Mapping[str, Any]
    date: str
    workloads: tuple[str, ...]
    plain_tps: Mapping[str, float]
    candidates_total: int
    results: tuple[CandidateResult, ...]
    winner: CandidateResult | None
    checked_on: str
    report_path: Path | None = None  # the Markdown report, once written
    recipe_path: Path | None = None  # the tuned recipe, once written

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe,
            "artifact_id": self.artifact_id,
            "engine": self.engine,
            "commit": self.commit,
            "machine": dict(self.machine),
            "date": self.date,
            "workloads": list(self.workloads),
            "plain_tps": dict(self.plain_tps),
            "candidates_total": self.candidates_total,
            "results": [r.to_json() for r in self.results],
            "winner": self.winner.to_json() if self.winner else None,
            "checked_on": self.checked_on,
        }


# ---------------------------------------------------------------- state (resume)


@dataclass
class State:
    """Finished work of one tune run, kept as it grows: the plain baseline and each
    candidate's result (the run's working store, saved after every step)."""

    path: Path
    key: str
    baseline: dict[str, float] = field(default_factory=dict)  # workload → plain tok/s
    done: dict[str, CandidateResult] = field(default_factory=dict)  # candidate key → result
    second: dict[str, PassTiming] = field(default_factory=dict)  # candidate key → 2nd timing

    @classmethod
    def load(cls, path: Path, key: str, fresh: bool = False) -> State:
        if fresh or not path.is_file():
            return cls(path, key)
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls(path, key)
        if raw.get("key") != key:
            return cls(path, key)  # another recipe, build or workload mix: start over
        try:
            done = {k: CandidateResult.from_json(r) for k, r in raw.get("done", {}).items()}
            second = {k: PassTiming.from_json(t) for k, t in raw.get("second", {}).items()}
        except (KeyError, TypeError, AttributeError):
            return cls(path, key)  # results this version cannot read: start over
        return cls(path, key, dict(raw.get("baseline", {})), done, second)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        payload = {
            "key": self.key,
            "baseline": self.baseline,
            "done": {k: r.to_json() for k, r in self.done.items()},
            "second": {k: t.to_json() for k, t in self.second.items()},
        }
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, self.path)


def score(speedups: Mapping[str, float]) -> float:
    """Geometric mean of the speedups over the workload mix (0 when any is missing)."""
    values = [v for v in speedups.values() if v > 0]
    if not values or len(values) != len(speedups):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def best(done: Mapping[str, CandidateResult]) -> CandidateResult | None:
    """The winner: among candidates timed twice, the best over both passes."""
    twice = [r for r in done.values() if r.passed and r.final_score]
    return max(twice, key=lambda r: r.final_score or 0.0, default=None)


def leaders(done: Mapping[str, CandidateResult], n: int = SECOND_PASS) -> list[str]:
    """The keys of the `n` best first-pass scores: the second pass's candidates."""
    passed = sorted(((k, r) for k, r in done.items() if r.passed), key=lambda kr: -kr[1].score)
    return [k for k, _ in passed[:n]]


def both_passes(first: CandidateResult, second: PassTiming) -> CandidateResult:
    """A candidate's result with its second timing: both scores, their spread, the final."""
    s1, s2 = float(first.score), float(second.score)
    return replace(
        first,
        speedups_pass2=dict(second.speedups),
        score_pass2=s2,
        spread=round(abs(s1 - s2), 4),
        final_score=round(math.sqrt(s1 * s2), 4) if s1 > 0 and s2 > 0 else 0.0,
    )


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


def _verdict(r: CandidateResult) -> str:
    if r.passed:
        return "ok"
    if r.refused:
        why = str(r.check or "").replace("|", "/").replace("\n", " ")
        return f"refused, not timed: {why[:120]}"
    why = str(r.check or r.detail or "").replace("|", "/").replace("\n", " ")
    return f"FAILED: {why[:120]}"


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
    recipe, target, draft = recipe_models(recipe_name, console)
    engine = artifact.manifest["engine"]
    dialect = dialects.dialect_for(artifact, console.print)
    help_text = dialects.server_help(artifact.server)
    offered = supported_types(dialect, help_text)
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
        help_flags=dialects.help_flags(help_text),
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
    base_plan = recipe_plan(
        artifact, recipe, target, draft, console, dialect=dialect, help_text=help_text
    )
    logs = reports / f"{stem}-logs"
    per_candidate = None
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
    md = _write_report(report, reports, stem)
    report = replace(report, report_path=md)
    if winner is None:
        raise LlamaspecError(
            f"No candidate passed the equivalence check and finished within the budget; see "
            f"{md}. Nothing was written."
        )
    path = write_recipe(artifact, recipe, engine, winner, cands, out_dir, md, mix)
    console.print(
        f"tune: fastest is {winner.label} (score {winner.score:.2f}× in pass 1, "
        f"{winner.score_pass2:.2f}× in pass 2, {winner.final_score:.2f}× over both, on "
        f"{', '.join(w.name for w in mix)}); wrote {path} and {md}"
    )
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
        p = recipe_plan(artifact, r, target, draft, console, dialect=dialect, help_text=help_text)
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
        p = recipe_plan(
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


def _write_report(report: TuneReport, reports: Path, stem: str) -> Path:
    """The report as .json (`report.to_json()`) and .md; the .md's path."""
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"{stem}.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    names = report.workloads
    md = [
        f"# Tune: {report.recipe} on {report.artifact_id}",
        "",
        f"- machine: {report.machine['description']}",
        f"- engine: {report.engine} {report.commit}, {report.date}",
        f"- workload mix: {', '.join(names)}; plain tok/s: "
        + ", ".join(f"{k} {v}" for k, v in report.plain_tps.items()),
        f"- {len(report.results)} of {report.candidates_total} candidates measured; score "
        "= geometric mean of the speedups; each candidate passed verify's fast equivalence "
        f"check (on {report.checked_on}) before it was timed (one that "
        "failed is refused and never timed), then ran each workload on a fresh server right "
        "after the plain server did",
        f"- second pass: the {SECOND_PASS} best were timed again, interleaved workload by "
        "workload; the winner has the best final score (geometric mean of both passes); "
        "spread = |pass 1 − pass 2|",
        "",
        "| candidate | speculative flags | check | "
        + " | ".join(names)
        + " | score | pass 2 | spread | final |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|---|",
    ]
    order = sorted(report.results, key=lambda r: (-(r.final_score or 0.0), -r.score))
    for r in order:
        sp, sp2 = r.speedups or {}, r.speedups_pass2 or {}
        cells = [
            f"{sp[n]:.2f}×" + (f" / {sp2[n]:.2f}×" if n in sp2 else "") if n in sp else "—"
            for n in names
        ]
        md.append(
            f"| {r.label} | `{' '.join(r.spec_args or ())}` | {_verdict(r)} | "
            + " | ".join(cells)
            + f" | {r.score:.2f}× | "
            + (
                f"{r.score_pass2:.2f}× | {r.spread:.2f} | **{r.final_score:.2f}×** |"
                if r.score_pass2 is not None
                else "— | — | — |"
            )
        )
    if report.winner:
        w = report.winner
        md += [
            "",
            f"Fastest over both passes: **{w.label}** (pass 1 {w.score:.2f}×, pass 2 "
            f"{w.score_pass2:.2f}×, final {w.final_score:.2f}×). Where two cells show "
            "two figures, they are pass 1 / pass 2.",
        ]
    path = reports / f"{stem}.md"
    path.write_text("\n".join(md) + "\n")
    return path


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
