"""Known engine defects (patches/series.yaml `defects:`), matched against a build."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llamaspec import config


@dataclass(frozen=True)
class Defect:
    """A catalogued defect that applies to a build, ready to be named in a report."""

    id: str
    summary: str
    fixed_by: str
    issue: str
    targets: str = "all"

    def describe(self) -> str:
        issue = f"; upstream {self.issue}" if self.issue else ""
        fix = self.fixed_by
        if fix and " " not in fix:  # a catalog patch id (config.load_defects checks it)
            fix = f"catalog patch {fix}: build with --patch {fix}"
        return f"known defect {self.id}: {self.summary} (fix: {fix}{issue})"


def defects_for(manifest: Mapping, symptom: str | None = None) -> list[Defect]:
    """The catalogued defects of this build's engine and commit (optionally of one symptom).

    A defect stops applying once the build carries the patch that fixes it."""
    applied = {p["id"] for p in manifest.get("patches", []) if p.get("status") == "applied"}
    out = []
    for d in config.load_defects():
        if d.engine != manifest.get("engine") or manifest.get("commit") not in d.pins:
            continue
        if symptom and d.symptom != symptom:
            continue
        if d.fixed_by in applied:
            continue
        issue = d.upstream_issue.url if d.upstream_issue else ""
        out.append(Defect(d.id, " ".join(d.summary.split()), d.fixed_by, issue, d.targets))
    return out


def known_defect(manifest: Mapping, symptom: str) -> Defect | None:
    found = defects_for(manifest, symptom)
    return found[0] if found else None
