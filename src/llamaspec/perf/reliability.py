"""Whether a bench run can be trusted: a verdict with its reasons, from the report itself.

A speedup is a ratio of two speeds taken side by side, so a machine that is busy for part
of a run can make it anything: on a loaded machine one bench reported 18.71× with plain
decoding at 7.2 tok/s (13× below its own estimated limit) and a cost model that timed a
2-token batch at 0.125 of one token; the same command, repeated, gave 0.63× and 2.88×.
`judge` reads a bench report's JSON form (`BenchReport.to_json()`, or a report file) and
checks five things:

- spread: each repetition runs plain and speculative in turn, so each gives a speedup of
  its own; repetitions of one cell that disagree by more than `SPREAD_MAX` (max ÷ min)
  measured the machine, not the method;
- plain speed against its own estimate: with one client, plain decoding should run near
  the cost model's one-token time (`PLAIN_FLOOR`) and within reach of the memory-bandwidth
  limit (`LIMIT_FLOOR`); far below them, something else had the CPU;
- the cost model's own sanity: a batch of k ≥ 2 tokens cannot cost less than one token
  (`BATCH_FLOOR`);
- tokens returned: the tokens the clients received against those the server counted
  (`RETURNED_FLOOR`); an engine that cuts outputs short still counts the whole budget;
- load: the CPUs busy just before the run (`busy_now`: a 2-second sample, so a step that
  ended a moment ago does not count, as it would in the 1-minute load average) and the
  1-minute load average during and after it, less the server's own threads, against the
  CPUs left over (`LOAD_SLACK`).

Anything that fails is a reason, and one reason makes the run unreliable: the report then
prints the reasons instead of a headline and marks the cells. Warm figures (a prompt seen
before) whose repetitions disagree are marked too, as warnings: they are not the headline.
What could not be checked (an old report without load samples, a run without the cost
model) is a note. Pure but for `load_now`, which reads the load average.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Max ÷ min of one cell's per-repetition speedups. The speedups worth telling apart differ
# by tens of percent (a good n-gram recipe gains 1.2–2× here); repetitions further apart
# than ±25 % around their middle cannot tell a gain from a loss.
SPREAD_MAX = 1.5
# Measured plain tok/s (one client) ÷ the cost model's plain estimate (1000 ÷ its one-token
# ms, same server flags, same machine, minutes earlier). A quiet run reaches 0.7–0.95 of it
# (the workloads' longer contexts cost more per token); under half, the machine was busy.
PLAIN_FLOOR = 0.5
# Measured plain tok/s ÷ the memory-bandwidth limit (model bytes read once per token). The
# limit is an upper bound that compute-bound CPUs stay well under (0.7 here with -t 1), but
# five times under it is not the model: the busy run was 13 times under.
LIMIT_FLOOR = 0.2
# T(k) ÷ T(1) for a batch of k ≥ 2 tokens. A batch does at least one token's work; a GPU
# may batch small k for nearly the cost of one, so 20 % below one is left to timer noise.
BATCH_FLOOR = 0.8
# CPUs that other work may take, beyond those the server's threads leave free, before the
# run counts as loaded: one extra runnable process is the background of a desktop, more
# takes turns on the server's cores.
LOAD_SLACK = 1.0
# Tokens the clients received ÷ tokens the server counted (`predicted_n`). They are the same
# tokens unless the server drops some: an engine whose speculative outputs end early (ik's
# catalogued short-output defect, upstream f49e917) still counts the whole budget, so its
# tok/s counts tokens no client got. 2 % is left to text tokenized again (ik returns no ids).
RETURNED_FLOOR = 0.98


def load_now() -> float | None:
    """The 1-minute load average (None where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat (None where there is none)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_now(window: float = 2.0) -> float | None:
    """CPUs busy over the next `window` seconds (0 … cpus), from /proc/stat (None where
    there is none)."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(window)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return None
    share = (second[0] - first[0]) / (second[1] - first[1])
    return round(share * (os.cpu_count() or 1), 2)


BUSY = "busy"  # HostLoad.before_from: CPUs busy in a 2-second sample (`busy_now`)
LOADAVG = "loadavg"  # … the 1-minute load average (reports from before `busy_now`)


def sample_before() -> tuple[float | None, str]:
    """What else runs just before a run: `busy_now`, or the load average where the platform
    has no /proc/stat; and which it was. Not the load average first: it would still count
    a build that ended seconds ago (it decays over minutes), and so marked quiet runs
    unreliable."""
    busy = busy_now()
    return (busy, BUSY) if busy is not None else (load_now(), LOADAVG)


def before_text(load: Mapping[str, Any]) -> str:
    """The `before` sample of a report's `host_load`, saying what it measured."""
    if load.get("before_from", LOADAVG) == BUSY:
        return f"{load.get('before')} CPUs busy before (2-second sample)"
    return f"{load.get('before')} before (1-minute average)"


def server_threads(args: Sequence[str]) -> int | None:
    """The server's `-t`/`--threads` (None: the server's default, all cores)."""
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in ("-t", "--threads"):
            raw = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                return int(raw)
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class HostLoad:
    """The machine's load around a run: CPUs busy just before any server started
    (`busy_now`), 1-minute load averages after each repetition and at the end; the CPUs
    and the server's threads."""

    cpus: int
    threads: int | None  # the server's -t; None: its default (every core)
    before: float | None
    during: tuple[float, ...] = ()
    after: float | None = None
    before_from: str = BUSY  # BUSY or LOADAVG: what `before` measured

    def others(self) -> float | None:
        """The most load that was not the server's own (its threads subtracted while it
        ran); None when no sample was taken."""
        own = self.threads or self.cpus
        seen = [self.before] if self.before is not None else []
        seen += [max(x - own, 0.0) for x in (*self.during, self.after) if x is not None]
        return round(max(seen), 2) if seen else None

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": self.cpus,
            "server_threads": self.threads,
            "before": self.before,
            "before_from": self.before_from,
            "during": list(self.during),
            "after": self.after,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HostLoad:
        return cls(
            raw["cpus"],
            raw.get("server_threads"),
            raw.get("before"),
            tuple(raw.get("during") or ()),
            raw.get("after"),
            raw.get("before_from", LOADAVG),
        )


@dataclass(frozen=True)
class Verdict:
    """Reliable or not, why not (`reasons`), what could not be checked (`notes`), and the
    cells each reason names (`flagged`: (workload, concurrency))."""

    reliable: bool
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    flagged: tuple[tuple[str, int], ...] = ()
    thresholds: Mapping[str, float] = field(default_factory=dict)
    # warm figures (a prompt seen before) whose repetitions disagree: marked in the table,
    # but they are not the headline, so they do not decide the verdict
    warnings: tuple[str, ...] = ()
    flagged_warm: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "reliable": self.reliable,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "flagged": [{"workload": w, "concurrency": c} for w, c in self.flagged],
            "warnings": list(self.warnings),
            "flagged_warm": [{"workload": w, "concurrency": c} for w, c in self.flagged_warm],
            "thresholds": dict(self.thresholds),
        }


THRESHOLDS = {
    "spread_max": SPREAD_MAX,
    "plain_floor": PLAIN_FLOOR,
    "limit_floor": LIMIT_FLOOR,
    "batch_floor": BATCH_FLOOR,
    "load_slack": LOAD_SLACK,
}
# bench's verdict also checks the tokens returned (tune's two passes do not count them)
BENCH_THRESHOLDS = {**THRESHOLDS, "returned_floor": RETURNED_FLOOR}


def per_repetition(plain: Sequence[float], spec: Sequence[float]) -> list[float]:
    """Each repetition's speedup: its speculative tok/s ÷ the plain tok/s measured beside it."""
    return [s / p for p, s in zip(plain, spec, strict=False) if p > 0]


def cell_speedups(cell: Mapping[str, Any], which: str = "spec") -> list[float]:
    """A report cell's per-repetition speedups (`which`: spec, the first exposure, or warm)."""
    plain = [s["tokens_per_second"] for s in cell.get("plain", ())]
    other = [s["tokens_per_second"] for s in cell.get(which, ())]
    return per_repetition(plain, other)


def spread(speedups: Sequence[float]) -> float | None:
    """Max ÷ min of the speedups (None for fewer than two, inf when one is 0)."""
    if len(speedups) < 2:
        return None
    lo = min(speedups)
    return math.inf if lo <= 0 else max(speedups) / lo


def _label(cell: Mapping[str, Any]) -> str:
    c = cell["concurrency"]
    return f"{cell['workload']} ({c} client{'s' if c != 1 else ''})"


def _spread_reason(cell: Mapping[str, Any], which: str) -> str | None:
    values = cell_speedups(cell, which)
    s = spread(values)
    if s is None or s <= SPREAD_MAX:
        return None
    what = "warm speedup" if which == "warm" else "speedup"
    return (
        f"{_label(cell)}: {what} {min(values):.2f}×–{max(values):.2f}× across "
        f"{len(values)} repetitions (max ÷ min {s:.1f} > {SPREAD_MAX})"
    )


def _short_reason(cell: Mapping[str, Any], which: str) -> str | None:
    """The `which` samples' server counted tokens it never returned (None: it did not, or
    the report is from before bench counted what it received)."""
    samples = [x for x in cell.get(which, ()) if x.get("returned") is not None]
    counted = sum(int(x["tokens"]) for x in samples)
    got = sum(int(x["returned"]) for x in samples)
    if not counted or got >= RETURNED_FLOOR * counted:
        return None
    what = {"plain": "plain", "spec": "speculative", "warm": "warm speculative"}[which]
    return (
        f"{_label(cell)}: the {what} server counted {counted} tokens but returned {got} "
        f"(outputs cut short, an engine defect): its tok/s counts tokens no client received "
        f"(floor {RETURNED_FLOOR})"
    )


def _plain_reasons(
    cell: Mapping[str, Any], expected_tps: float | None, limit_tps: float | None
) -> list[str]:
    """One client's plain median against the cost model's estimate and the bandwidth limit."""
    if cell["concurrency"] != 1:
        return []
    tps = [s["tokens_per_second"] for s in cell.get("plain", ())]
    if not tps:
        return []
    plain = statistics.median(tps)
    out = []
    if expected_tps and plain < PLAIN_FLOOR * expected_tps:
        out.append(
            f"{_label(cell)}: plain decoding at {plain:.1f} tok/s, {expected_tps / plain:.1f}× "
            f"below the cost model's own one-token time ({expected_tps:.1f} tok/s; floor "
            f"{PLAIN_FLOOR})"
        )
    if limit_tps and plain < LIMIT_FLOOR * limit_tps:
        out.append(
            f"{_label(cell)}: plain decoding at {plain:.1f} tok/s, {limit_tps / plain:.1f}× "
            f"below the memory-bandwidth limit ({limit_tps:.1f} tok/s; floor {LIMIT_FLOOR})"
        )
    return out


def cost_model_reasons(cm: Mapping[str, Any]) -> list[str]:
    """Batches the cost model timed at less than one token (impossible: a machine that was
    busy while T(1) was timed), and a one-token time that is not a time."""
    out = []
    if not cm.get("decode_ms_per_token"):
        out.append("cost model: no one-token decode time was measured")
    for what, key in (("prompt batch", "batch_ratio"), ("verification step", "verify_ratio")):
        bad = {
            int(k): float(v)
            for k, v in (cm.get(key) or {}).items()
            if int(k) >= 2 and float(v) < BATCH_FLOOR
        }
        if bad:
            shown = ", ".join(f"k={k}: {v:.3g}" for k, v in sorted(bad.items()))
            out.append(
                f"cost model: a {what} of k ≥ 2 tokens timed at less than one token "
                f"({shown}; floor {BATCH_FLOOR}): it cannot cost less than one of its tokens"
            )
    return out


def load_reason(load: HostLoad) -> str | None:
    others = load.others()
    if others is None:
        return None
    free = max(load.cpus - (load.threads or load.cpus), 0)
    if others <= free + LOAD_SLACK:
        return None
    threads = f"-t {load.threads}" if load.threads else "the server's default threads (all)"
    return (
        f"machine loaded: other work took {others:.1f} CPUs (1-minute load average, the "
        f"server's own threads subtracted) on {load.cpus} CPUs with {threads}; at most "
        f"{free + LOAD_SLACK:.1f} leaves the server its cores"
    )


def judge(report: Mapping[str, Any]) -> Verdict:
    """The verdict on a bench report in its JSON form."""
    reasons: list[str] = []
    notes: list[str] = []
    flagged: list[tuple[str, int]] = []
    cm = report.get("cost_model")
    expected_tps = limit_tps = None
    if cm:
        reasons += cost_model_reasons(cm)
        ms = cm.get("decode_ms_per_token") or 0.0
        expected_tps = 1000.0 / ms if ms > 0 else None
        limit_tps = cm.get("plain_decode_limit_tps")
    else:
        notes.append("plain speed against an estimate (the cost model was skipped)")
    if report.get("repetitions", 0) < 2:
        reasons.append(f"{report.get('repetitions', 0)} repetition(s): a spread needs two or more")
    cell_reasons = 0
    warnings: list[str] = []
    flagged_warm: list[tuple[str, int]] = []
    for cell in report.get("workloads", ()):
        if warm := [w for w in (_spread_reason(cell, "warm"), _short_reason(cell, "warm")) if w]:
            warnings += warm
            flagged_warm.append((cell["workload"], cell["concurrency"]))
        mine = [
            _spread_reason(cell, "spec"),
            *_plain_reasons(cell, expected_tps, limit_tps),
            _short_reason(cell, "plain"),
            _short_reason(cell, "spec"),
        ]
        mine = [m for m in mine if m]
        if mine:
            flagged.append((cell["workload"], cell["concurrency"]))
            reasons += mine
            cell_reasons += len(mine)
    raw = report.get("host_load")
    if raw:
        load = HostLoad.from_json(raw)
        why = load_reason(load)
        if why:
            reasons.append(why)
        elif load.others() is None:
            notes.append("load (this platform has no load average)")
    else:
        notes.append("load (not recorded: a report from before the load check)")
    if len(reasons) > cell_reasons:  # a reason about the whole run marks every cell
        flagged = [(c["workload"], c["concurrency"]) for c in report.get("workloads", ())]
    return Verdict(
        not reasons,
        tuple(reasons),
        tuple(notes),
        tuple(flagged),
        BENCH_THRESHOLDS,
        tuple(warnings),
        tuple(flagged_warm),
    )


def judge_tune(report: Mapping[str, Any]) -> Verdict:
    """The verdict on a tune report in its JSON form: the winner's two timed passes, workload
    by workload, within `SPREAD_MAX` of each other, and the load around the run."""
    reasons: list[str] = []
    notes: list[str] = []
    winner = report.get("winner") or {}
    first, second = winner.get("speedups") or {}, winner.get("speedups_pass2") or {}
    if winner and not second:
        notes.append("the winner's second pass (it was timed once)")
    for name, a in first.items():
        s = spread([a, second[name]]) if name in second else None
        if s is not None and s > SPREAD_MAX:
            reasons.append(
                f"{winner.get('label')}: {name} {a:.2f}× in pass 1, {second[name]:.2f}× in "
                f"pass 2 (max ÷ min {s:.1f} > {SPREAD_MAX})"
            )
    raw = report.get("host_load")
    if raw:
        why = load_reason(HostLoad.from_json(raw))
        if why:
            reasons.append(why)
    else:
        notes.append("load (not recorded: a report from before the load check)")
    return Verdict(not reasons, tuple(reasons), tuple(notes), (), THRESHOLDS)
