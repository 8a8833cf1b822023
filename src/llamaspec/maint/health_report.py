"""Health matrix: one row per upstream build (pin), the regression rule, JSON and Markdown.

A `HealthPin` is one build to judge (engine, full SHA, date, label); a `Row` is what
`llamaspec maint health` found for it: the build, the draft and n-gram types it offers,
whether each is exact on the strict tier, the first-exposure speedups on the copy and qa
workloads, the synthetic-acceptance sweep's fitted c and per-round overhead, the catalogued
defects the build still has, and every step's failure as one line. `regressions` applies
the rule below to consecutive builds of the same engine; `markdown` and `write` show it all.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The regression rule, between consecutive measured builds of one engine (in list order):
# - a workload's first-exposure speedup drops by more than this fraction of the earlier
#   one (speedups on a shared 2-core machine move by ~5-10 % run to run; 15 % is beyond
#   that noise and still small enough to catch a lost fast path);
SPEEDUP_DROP = 0.15
# - the per-round overhead of the synthetic-acceptance sweep rises by more than this
#   fraction (a fitted intercept of a few ms is noisier than a speedup);
OVERHEAD_RISE = 0.25
# - a spec type that was exact on the strict tier is not exact any more (no threshold:
#   any difference on the F32 reference is a bug).

WORKLOADS = ("copy", "qa")  # the first-exposure bench's workloads, in the matrix's order
NO_SYNTH = "no synth (added upstream #27711)"
STEPS = ("build", "strict", "bench", "sweep")
STEM = "health"  # reports/health.json and reports/health.md


@dataclass(frozen=True)
class HealthPin:
    """One build in the health list: an engine at a commit, with its date and a label."""

    engine: str
    pin: str  # the full commit SHA
    date: str  # ISO date of the commit
    label: str = ""  # a human tag: b11312, a release, "default pin"
    note: str = ""

    @property
    def short(self) -> str:
        return self.pin[:7]

    @property
    def key(self) -> str:
        return f"{self.engine}@{self.pin}"


@dataclass(frozen=True)
class Row:
    """What the health run found for one pin; a step that failed says why in `failures`."""

    pin: HealthPin
    artifact: str | None = None
    failures: Mapping[str, str] = field(default_factory=dict)  # step → one-line reason
    types: tuple[str, ...] = ()  # draft and n-gram spec types the build offers
    exact: Mapping[str, bool] = field(default_factory=dict)  # method → exact on strict tier
    # method → why its strict run failed (a crashed server); such a method is not exact
    crashed: Mapping[str, str] = field(default_factory=dict)
    # methods the build refused on more than one slot: sequential on one, parallel not run
    one_slot: tuple[str, ...] = ()
    speedups: Mapping[str, float] = field(default_factory=dict)  # workload → first exposure
    bench_na: str = ""  # why the bench did not apply to this build (its spec type lacking)
    bench_unreliable: str = ""  # bench's own verdict: why its speedups cannot be trusted
    synth_c: float | None = None
    overhead_ms: float | None = None
    synth_na: str = ""  # NO_SYNTH where the build has no synthetic acceptance
    defects: Mapping[str, str] = field(default_factory=dict)  # defect id → status
    seconds: float = 0.0

    @property
    def built(self) -> bool:
        return "build" not in self.failures

    @property
    def all_exact(self) -> bool | None:
        return all(self.exact.values()) if self.exact else None


@dataclass(frozen=True)
class Flag:
    """A regression between two consecutive measured builds of one engine."""

    engine: str
    pin: str  # the later build's key
    since: str  # the earlier build's key
    metric: str  # speedup copy | speedup qa | overhead | exact <method>
    before: float | bool
    after: float | bool

    def describe(self) -> str:
        since = self.since.split("@")[1][:7]
        if self.metric.startswith("exact"):
            return f"{self.metric.split(' ', 1)[1]} no longer exact (was at {since})"
        change = (self.after - self.before) / self.before * 100 if self.before else 0.0
        unit = " ms" if self.metric == "overhead" else "×"
        moved = f"{self.before:g}{unit} → {self.after:g}{unit}"
        return f"{self.metric} {moved} ({change:+.0f} % since {since})"


@dataclass(frozen=True)
class HealthReport:
    rows: tuple[Row, ...]
    complete: bool = False  # False while the run is under way (or was interrupted)
    date: str = field(default_factory=lambda: dt.date.today().isoformat())
    machine: Mapping = field(default_factory=dict)
    settings: Mapping = field(default_factory=dict)  # recipe, repetitions, …

    @property
    def flags(self) -> list[Flag]:
        return regressions(self.rows)

    def row(self, pin: HealthPin) -> Row | None:
        return next((r for r in self.rows if r.pin.key == pin.key), None)


def regressions(rows: Sequence[Row]) -> list[Flag]:
    """The rule above, per engine in list order. A build that did not measure a metric
    (failed, or n/a) is passed over for it: the next build that does is compared with the
    last one that did, so a failed build in between hides nothing."""
    last: dict[tuple[str, str], tuple[str, float | bool]] = {}  # (engine, metric) → (key, v)
    out: list[Flag] = []
    for r in rows:
        # an unreliable bench (perf.reliability) is shown, marked, and compared with nothing
        speedups = {} if r.bench_unreliable else r.speedups
        values: dict[str, float | bool] = {f"speedup {w}": v for w, v in speedups.items()}
        if r.overhead_ms is not None:
            values["overhead"] = r.overhead_ms
        values.update({f"exact {m}": e for m, e in r.exact.items()})
        for metric, now in values.items():
            seen = last.get((r.pin.engine, metric))
            last[(r.pin.engine, metric)] = (r.pin.key, now)
            if seen is None:
                continue
            since, before = seen
            if _regressed(metric, before, now):
                out.append(Flag(r.pin.engine, r.pin.key, since, metric, before, now))
    return out


def _regressed(metric: str, before: float | bool, now: float | bool) -> bool:
    if metric.startswith("exact"):
        return bool(before) and not now
    if metric == "overhead":
        return before > 0 and now > before * (1 + OVERHEAD_RISE)
    return before > 0 and now < before * (1 - SPEEDUP_DROP)


# --- JSON --------------------------------------------------------------------------------


def to_json(report: HealthReport) -> dict:
    out = asdict(report)
    out["thresholds"] = {"speedup_drop": SPEEDUP_DROP, "overhead_rise": OVERHEAD_RISE}
    out["flags"] = [{**asdict(f), "text": f.describe()} for f in report.flags]
    return out


def from_json(data: Mapping) -> HealthReport:
    """A report `to_json` wrote (the partial one of an interrupted run included)."""
    rows = []
    for r in data.get("rows", []):
        r = dict(r)
        r["pin"] = HealthPin(**r["pin"])
        r["types"] = tuple(r.get("types", ()))
        r["one_slot"] = tuple(r.get("one_slot", ()))
        rows.append(Row(**r))
    return HealthReport(
        rows=tuple(rows),
        complete=bool(data.get("complete")),
        date=str(data.get("date", "")),
        machine=data.get("machine", {}),
        settings=data.get("settings", {}),
    )


def read(path: Path) -> HealthReport:
    return from_json(json.loads(path.read_text(encoding="utf-8")))


def paths(out_dir: Path) -> tuple[Path, Path]:
    return out_dir / f"{STEM}.json", out_dir / f"{STEM}.md"


def write(report: HealthReport, out_dir: Path) -> tuple[Path, Path]:
    """health.json and health.md, each replaced whole (a reader never sees half a file)."""
    from llamaspec.maint.pin_edit import write_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    js, md = paths(out_dir)
    write_atomic(js, json.dumps(to_json(report), indent=2) + "\n")
    write_atomic(md, markdown(report))
    return js, md


# --- Markdown ----------------------------------------------------------------------------


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _exact_cell(r: Row) -> str:
    if not r.exact:
        return "-"
    one = " (one slot only)" if r.one_slot else ""
    return _exactness(r) + one


def _exactness(r: Row) -> str:
    bad = [m for m, e in r.exact.items() if not e and m not in r.crashed]
    if not bad and not r.crashed:
        return "all exact"
    parts = [f"NOT exact: {', '.join(bad)}"] if bad else []
    if r.crashed:
        good = [m for m, e in r.exact.items() if e]
        parts = ([f"exact: {', '.join(good)}"] if good else []) + parts
        parts.append(f"crashed: {', '.join(r.crashed)}")
    return "; ".join(parts)


def _speed_cell(r: Row, w: str) -> str:
    if w in r.speedups:
        return f"{r.speedups[w]:.2f}×" + (" (unreliable)" if r.bench_unreliable else "")
    return "n/a" if r.bench_na else "-"


def _synth_cells(r: Row) -> tuple[str, str]:
    if r.synth_na:
        return "no synth", "-"
    c = f"{r.synth_c:.3g}" if r.synth_c is not None else "-"
    o = f"{r.overhead_ms:.2f}" if r.overhead_ms is not None else "-"
    return c, o


def _defects_cell(r: Row) -> str:
    if not r.defects:
        return "-"
    return "; ".join(f"{d}: {s}" for d, s in r.defects.items())


def summary(r: Row) -> str:
    """One row as one line (bump's report, progress): what the matrix's cells say."""
    p = r.pin
    head = f"{p.engine} {p.short} {p.label}".strip() + f" ({p.date})"
    if not r.built:
        return f"{head}: build failed: {r.failures['build']}"
    c, o = _synth_cells(r)
    parts = [
        f"types {', '.join(r.types) or '-'}",
        _exact_cell(r),
        *(f"{w} {_speed_cell(r, w)}" for w in WORKLOADS),
        f"synth c {c}, overhead {o} ms" if not r.synth_na else r.synth_na,
    ]
    parts += [f"{step} failed: {r.failures[step]}" for step in STEPS if step in r.failures]
    return f"{head}: " + "; ".join(parts)


def markdown(report: HealthReport) -> str:
    flags = report.flags
    by_pin: dict[str, list[Flag]] = {}
    for f in flags:
        by_pin.setdefault(f.pin, []).append(f)
    state = "" if report.complete else " (partial: the run is under way or was interrupted)"
    out = [
        "# Build health across upstream pins" + state,
        "",
        f"Run on {report.date}"
        + (f", {report.machine.get('cpu')}" if report.machine.get("cpu") else "")
        + f"; {len(report.rows)} build(s). Each row: the strict tier (F32 reference, "
        "token-identical) for the draft and n-gram types the build offers, a first-exposure "
        "bench (1 client) on the copy and qa workloads, and the synthetic-acceptance sweep's "
        "fitted c and per-round overhead.",
        "",
    ]
    if report.settings:
        out += [
            "Settings: " + ", ".join(f"{k} {v}" for k, v in report.settings.items()) + ".",
            "",
        ]
    out += [
        "| pin | date | engine | types offered | exact | copy | qa | synth c | overhead ms "
        "| defects | regressions |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        p = r.pin
        pin = f"{p.short} {p.label}".strip()
        if not r.built:
            pin += " (build failed)"
        c, o = _synth_cells(r)
        regress = "; ".join(f.describe() for f in by_pin.get(p.key, [])) or "-"
        cells = [
            pin,
            p.date,
            p.engine,
            ", ".join(r.types) or "-",
            _exact_cell(r),
            _speed_cell(r, "copy"),
            _speed_cell(r, "qa"),
            c,
            o,
            _defects_cell(r),
            regress,
        ]
        out.append("| " + " | ".join(_cell(x) for x in cells) + " |")
    out += ["", "## Regression rule", ""]
    out += [
        "Consecutive measured builds of the same engine, in list order, are compared; a build "
        "that did not measure something (its build failed, or the bench did not apply) is "
        "passed over for it, and the next one is compared with the last that did; a bench "
        "that bench's own check marks unreliable is shown, marked, and compared with nothing. "
        "Flagged:",
        "",
        f"- a workload's first-exposure speedup drops by more than {SPEEDUP_DROP:.0%} of the "
        "earlier build's;",
        f"- the per-round overhead rises by more than {OVERHEAD_RISE:.0%};",
        "- a type that was exact on the strict tier is not exact any more.",
        "",
    ]
    out += [f"{len(flags)} regression(s) flagged." if flags else "No regression flagged.", ""]
    notes = []
    for r in report.rows:
        lines = [f"{step}: {r.failures[step]}" for step in STEPS if step in r.failures]
        lines += [f"strict {m}: {why}" for m, why in r.crashed.items()]
        if r.one_slot:
            lines.append(
                f"strict: the build refuses speculation on more than one server slot: "
                f"{', '.join(r.one_slot)} ran one request at a time on one slot; the "
                "parallel mode was not run"
            )
        if r.bench_na:
            lines.append(f"bench: n/a: {r.bench_na}")
        if r.bench_unreliable:
            lines.append(f"bench: unreliable: {r.bench_unreliable}")
        if r.synth_na:
            lines.append(f"sweep: {r.synth_na}")
        if lines:
            pin = f"{r.pin.short} {r.pin.label}".strip()
            notes.append(f"- {pin} ({r.pin.engine}): " + "; ".join(lines))
    if notes:
        out += ["## Failures and notes", "", *notes, ""]
    return "\n".join(out)


__all__ = [
    "NO_SYNTH",
    "OVERHEAD_RISE",
    "SPEEDUP_DROP",
    "WORKLOADS",
    "Flag",
    "HealthPin",
    "HealthReport",
    "Row",
    "from_json",
    "markdown",
    "read",
    "regressions",
    "summary",
    "to_json",
    "write",
]
