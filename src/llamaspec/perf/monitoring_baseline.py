"""The baseline `recipe monitor`'s LlamaSpecAcceptanceLow compares with (perf/monitoring.py):
the recipe's measured acceptance and speedup from its newest bench report
(reports/bench-<recipe>-<artifact>*.json, perf/bench_report.py's shape), a value the user
gives, or an assumed one, and where each came from."""

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

    @property
    def kind(self) -> str:
        return "measured" if self.measured else "not measured"

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


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    ok = isinstance(data, dict) and isinstance(data.get("workloads"), list)
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
    )


def find_baseline(
    recipe: str,
    engine: str,
    folders: Sequence[Path],
    root: Path,
    report: Path | None = None,
    acceptance: float | None = None,
) -> Baseline:
    """The baseline: `acceptance` when given; else `report` (a bench report file) when given;
    else the newest bench report of `recipe` on `engine` in `folders` (by its date, a
    reliable one first on the same date), else ASSUMED_ACCEPTANCE, marked not measured."""
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
    candidates: list[tuple[tuple, Path, dict]] = []
    seen: set[Path] = set()
    for folder in folders:
        for path in sorted(folder.glob(f"bench-{recipe}-*.json")) if folder.is_dir() else ():
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            data = _read_report(path)
            # bench-<recipe>-… also matches longer recipe names: the report's own field decides
            if data is None or data["recipe"] != recipe or _engine_of(data) != engine:
                continue
            reliable = bool((data.get("reliability") or {}).get("reliable"))
            candidates.append(((str(data.get("date") or ""), reliable, path.name), path, data))
    for _, path, data in sorted(candidates, key=lambda c: c[0], reverse=True):
        found = report_baseline(data, _shown(path, root))
        if found is not None:
            return found
    return Baseline(
        ASSUMED_ACCEPTANCE,
        False,
        f"assumed: no bench report of recipe {recipe} on {engine} with drafted tokens was found"
        f"; run `llamaspec bench {recipe}` or give --baseline-acceptance",
    )
