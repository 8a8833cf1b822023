"""The baseline `recipe monitor`'s LlamaSpecAcceptanceLow compares with (perf/monitoring.py):
the recipe's measured acceptance from its newest report of any kind — a bench report
(reports/bench-<recipe>-<artifact>*.json, perf/bench_report.py's shape, with its headline
speedup), the tune report that wrote a tuned recipe (its winner's drafts), or a load report
(reports/load-<recipe>-*.json, its speculative phases) — a value the user gives, or an
assumed one, and where each came from."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamaspec.errors import LlamaspecError

# the baseline when no bench report and no --baseline-acceptance give one: not measured
ASSUMED_ACCEPTANCE = 0.5


@dataclass(frozen=True)
class Baseline:
    """The acceptance the rules compare with, and where it came from. `measured`: from a
    bench report; `speedup` is that report's headline geometric mean (None where it has no
    trusted one, `speedup_note` says why)."""

    acceptance: float
    measured: bool
    source: str
    speedup: float | None = None
    speedup_note: str = ""
    report: str | None = None
    report_kind: str = ""  # bench | tune | load (measured ones)

    @property
    def kind(self) -> str:
        if not self.measured:
            return "not measured"
        return f"measured, {self.report_kind} report" if self.report_kind else "measured"

    def describe(self) -> str:
        text = f"acceptance {self.acceptance:.3f} ({self.kind}: {self.source})"
        if self.speedup is not None:
            text += f", speedup {self.speedup:.2f}× ({self.speedup_note})"
        elif self.speedup_note:
            text += f"; {self.speedup_note}"
        return text


def given_baseline(acceptance: float) -> Baseline:
    if not (isinstance(acceptance, float | int) and 0 < acceptance <= 1) or math.isnan(acceptance):
        raise LlamaspecError(
            f"--baseline-acceptance {acceptance!r} is not a share of drafted tokens in (0, 1]: "
            "give the acceptance you measured, e.g. 0.7 for 70% of draft tokens accepted."
        )
    return Baseline(float(acceptance), False, "given with --baseline-acceptance")


def _shown(path: Path, root: Path) -> str:
    """A report's path as the rendered files show it: relative to the project, else its name
    in its folder (never this machine's absolute path)."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return f"{path.parent.name}/{path.name}"


def _json(path: Path) -> dict[str, Any] | None:
    """A report file's JSON object; None for one that cannot be read or is not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_report(path: Path) -> dict[str, Any] | None:
    """A bench report (its recipe and workloads), or None."""
    data = _json(path)
    ok = data is not None and isinstance(data.get("workloads"), list)
    return data if ok and isinstance(data.get("recipe"), str) else None


def _engine_of(report: Mapping[str, Any]) -> str | None:
    """A report's engine; an early report without the field: from its artifact id."""
    if report.get("engine"):
        return str(report["engine"])
    art = str(report.get("artifact_id") or "")
    return "ik_llama.cpp" if art.startswith("ik-") else "llama.cpp" if art else None


def report_baseline(report: Mapping[str, Any], shown: str) -> Baseline | None:
    """The measured baseline of a bench report: Σ accepted ÷ Σ drafted over its
    first-exposure cells, and its headline speedup where the report is reliable; None when
    it drafted nothing."""
    from llamaspec.perf import bench_report

    drafted = accepted = 0.0
    for cell in report["workloads"]:
        summary = cell.get("summary") or {}
        drafted += float(summary.get("drafted") or 0)
        accepted += float(summary.get("accepted") or 0)
    if drafted <= 0:
        return None
    commit = str(report.get("commit") or "")[:7]
    parts = [report.get("date"), _engine_of(report), commit, report.get("backend")]
    where = ", ".join([shown, *(str(p) for p in parts if p)])
    speedup, note = None, ""
    try:
        headline = bench_report.headline(report)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):  # an early report
        values = [
            float(c["summary"]["speedup"])
            for c in report["workloads"]
            if (c.get("summary") or {}).get("speedup")
        ]
        headline = (
            f"geometric mean {math.exp(sum(map(math.log, values)) / len(values)):.2f}× "
            "(an early report: its reliability was not judged)"
            if values
            else "no speedup measured"
        )
    m = re.search(r"geometric mean ([\d.]+)×", headline)
    if m:
        speedup = float(m.group(1))
        note = "geometric mean over the workloads" + (
            " (an early report: its reliability was not judged)" if "early" in headline else ""
        )
    else:
        note = f"no speedup quoted: {headline}"
    return Baseline(
        min(accepted / drafted, 1.0),
        True,
        f"{int(accepted)} of {int(drafted)} draft tokens accepted in {where}",
        speedup,
        note,
        shown,
        "bench",
    )


def find_baseline(
    recipe: str,
    engine: str,
    folders: Sequence[Path],
    root: Path,
    report: Path | None = None,
    acceptance: float | None = None,
    tuned_by: Path | None = None,
) -> Baseline:
    """The baseline: `acceptance` when given; else `report` (a bench report file) when given;
    else the newest measured report of `recipe` on `engine` in `folders` — bench, load, or
    `tuned_by` (the tune report a tuned recipe names) — by its date (on the same date a
    reliable bench report first, then any bench, tune, load), else ASSUMED_ACCEPTANCE,
    marked not measured."""
    if acceptance is not None:
        return given_baseline(acceptance)
    if report is not None:
        data = _read_report(report) if report.is_file() else None
        if data is None:
            raise LlamaspecError(
                f"--report {report} is not a bench report (reports/bench-<recipe>-<artifact>"
                ".json as `llamaspec bench` writes it, with its recipe and workloads)."
            )
        if data["recipe"] != recipe:
            raise LlamaspecError(
                f"--report {report} measured recipe {data['recipe']!r}, not {recipe!r}: its "
                "acceptance is no baseline for this recipe. Give that recipe's own report."
            )
        found = report_baseline(data, _shown(report, root))
        if found is None:
            raise LlamaspecError(
                f"--report {report} drafted no token at all, so it has no acceptance to "
                "compare with: bench the recipe again, or give --baseline-acceptance."
            )
        return found
    candidates = _measured(recipe, engine, folders, root, tuned_by)
    if candidates:
        return max(candidates, key=lambda c: c[0])[1]
    return Baseline(
        ASSUMED_ACCEPTANCE,
        False,
        f"assumed: no bench, tune or load report of recipe {recipe} on {engine} with drafted "
        f"tokens was found; run `llamaspec bench {recipe}` or give --baseline-acceptance",
    )


# On the same date: a reliable bench report, then any bench report, then tune, then load.
RANK = {"bench": 1, "tune": 0, "load": -1}


def _measured(
    recipe: str, engine: str, folders: Sequence[Path], root: Path, tuned_by: Path | None
) -> list[tuple[tuple, Baseline]]:
    """(sort key, baseline) of every measured report of `recipe` on `engine`."""
    out: list[tuple[tuple, Baseline]] = []
    seen: set[Path] = set()

    def fresh(path: Path) -> bool:
        if path.resolve() in seen:
            return False
        seen.add(path.resolve())
        return True

    for folder in (f for f in folders if f.is_dir()):
        for path in sorted(folder.glob(f"bench-{recipe}-*.json")):
            data = _read_report(path) if fresh(path) else None
            # bench-<recipe>-… also matches longer recipe names: the report's own field decides
            if data is None or data["recipe"] != recipe or _engine_of(data) != engine:
                continue
            found = report_baseline(data, _shown(path, root))
            reliable = bool((data.get("reliability") or {}).get("reliable"))
            if found is not None:
                key = (str(data.get("date") or ""), RANK["bench"] + reliable, path.name)
                out.append((key, found))
        for path in sorted(folder.glob(f"load-{recipe}-*.json")):
            data = _json(path) if fresh(path) else None
            if data is None or data.get("recipe") != recipe or _engine_of(data) != engine:
                continue
            found = load_baseline(data, _shown(path, root))
            if found is not None:
                out.append(((str(data.get("date") or ""), RANK["load"], path.name), found))
    path = tuned_by.with_suffix(".json") if tuned_by is not None else None
    data = _json(path) if path is not None else None
    if path is not None and data is not None and _engine_of(data) == engine:
        found = tune_baseline(data, _shown(path, root))
        if found is not None:
            out.append(((str(data.get("date") or ""), RANK["tune"], path.name), found))
    return out


def _rate(accepted: float, drafted: float, what: str, shown: str, kind: str, note: str) -> Baseline:
    return Baseline(
        min(accepted / drafted, 1.0),
        True,
        f"{int(accepted)} of {int(drafted)} draft tokens accepted in {what} ({shown})",
        None,
        note,
        shown,
        kind,
    )


def load_baseline(data: Mapping[str, Any], shown: str) -> Baseline | None:
    """A load report's acceptance: Σ accepted ÷ Σ drafted over its speculative phases (a
    load report quotes throughput under its own traffic, no speedup headline)."""
    drafted = accepted = 0.0
    for ph in data.get("phases") or ():
        if not isinstance(ph, dict) or ph.get("mode") != "spec":
            continue
        acc = ph.get("acceptance") or {}
        drafted += float(acc.get("drafted") or 0)
        accepted += float(acc.get("accepted") or 0)
    if drafted <= 0:
        return None
    what = f"the speculative phases of a load run ({data.get('date')})"
    return _rate(accepted, drafted, what, shown, "load", "a load report: no speedup headline")


def tune_baseline(data: Mapping[str, Any], shown: str) -> Baseline | None:
    """The acceptance of the settings a tune run chose (its winner, every workload)."""
    winner = data.get("winner")
    pairs = winner.get("accepted_drafted") if isinstance(winner, Mapping) else None
    if not isinstance(pairs, Mapping):
        return None
    accepted = sum(float(v[0]) for v in pairs.values() if isinstance(v, list | tuple))
    drafted = sum(float(v[1]) for v in pairs.values() if isinstance(v, list | tuple))
    if drafted <= 0:
        return None
    what = f"the tune run that chose these settings ({data.get('date')})"
    return _rate(
        accepted,
        drafted,
        what,
        shown,
        "tune",
        "a tune report: its speedups are the recipe's measured result",
    )
