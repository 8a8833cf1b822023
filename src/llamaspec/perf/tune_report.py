"""What `llamaspec tune` measured: its frozen results, the state file, the report.

Each candidate's result is a frozen `CandidateResult` (a second timing of a leader is a
`PassTiming`), the run's a frozen `TuneReport`; their `to_json()` is what the state file
(`State`, the run's working store, so an interrupted run resumes) and
tune-<recipe>-<artifact>.json hold. The ranking lives here too: a candidate's score is the
geometric mean of its speedups (`score`), the `SECOND_PASS` best are timed again
(`leaders`), and the winner has the best score over both passes (`both_passes`, `best`).
`write_report` writes the report as JSON and Markdown. perf.tune runs the sweep.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llamaspec.perf import reliability

# How many of the fastest candidates the second pass times again.
SECOND_PASS = 3


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
    # the load around the run (perf.reliability.HostLoad.to_json()); None in reports from
    # before the load check, which then have neither it nor `reliability` in their file
    host_load: Mapping[str, Any] | None = None

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
            **(
                {
                    "host_load": dict(self.host_load),
                    "reliability": reliability.judge_tune(self._json()).to_json(),
                }
                if self.host_load is not None
                else {}
            ),
        }

    def _json(self) -> dict:
        return {
            "winner": self.winner.to_json() if self.winner else None,
            "host_load": self.host_load,
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


# ---------------------------------------------------------------- ranking


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


# ---------------------------------------------------------------- the report


def _verdict(r: CandidateResult) -> str:
    if r.passed:
        return "ok"
    if r.refused:
        why = str(r.check or "").replace("|", "/").replace("\n", " ")
        return f"refused, not timed: {why[:120]}"
    why = str(r.check or r.detail or "").replace("|", "/").replace("\n", " ")
    return f"FAILED: {why[:120]}"


def machine_line(report: TuneReport) -> str:
    """The hardware every tok/s stands beside, with the server's threads and the load."""
    text = report.machine["description"]
    load = report.host_load
    if not load:
        return text + "; server threads and load not recorded"
    t = load.get("server_threads")
    return (
        f"{text}; server threads: {t if t else 'its default (all cores)'}; load: "
        f"{reliability.before_text(load)}, {load.get('after')} after (1-minute average), on "
        f"{load['cpus']} CPUs"
    )


def write_report(report: TuneReport, reports: Path, stem: str) -> Path:
    """The report as .json (`report.to_json()`) and .md; the .md's path."""
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"{stem}.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    names = report.workloads
    verdict = reliability.judge_tune(report.to_json())
    md = [
        f"# Tune: {report.recipe} on {report.artifact_id}",
        "",
        *(
            []
            if verdict.reliable
            else [
                "**Unreliable: no headline.** The scores below are shown for the record; "
                "rerun on a quiet machine. Reasons:",
                "",
                *(f"- {r}" for r in verdict.reasons),
                "",
            ]
        ),
        *(["Not checked: " + "; ".join(verdict.notes) + ".", ""] if verdict.notes else []),
        f"- machine: {machine_line(report)} (every tok/s below was measured here)",
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
        fastest = (
            f"**{w.label}** (pass 1 {w.score:.2f}×, pass 2 {w.score_pass2:.2f}×, final "
            f"{w.final_score:.2f}×)"
        )
        md += [
            "",
            (
                f"Fastest over both passes: {fastest}."
                if verdict.reliable
                else f"Unreliable: the fastest over both passes was {fastest}, on timings "
                "that cannot be trusted."
            )
            + " Where two cells show two figures, they are pass 1 / pass 2.",
        ]
    path = reports / f"{stem}.md"
    path.write_text("\n".join(md) + "\n")
    return path
