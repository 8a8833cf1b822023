"""Known engine defects (patches/series.yaml `defects:`), matched against a build."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
    min_kept: float | None = None  # short-output: the least fraction of the plain output kept

    def describe(self) -> str:
        issue = f"; upstream {self.issue}" if self.issue else ""
        fix = self.fixed_by
        if fix and " " not in fix:  # a catalog patch id (config.load_defects checks it)
            fix = f"catalog patch {fix}: build with --patch {fix}"
        return f"known defect {self.id}: {self.summary} (fix: {fix}{issue})"

    def not_short_output(
        self,
        plain: Sequence,
        output: Sequence,
        predicted: int | None,
        asked: int,
        unit: str = "tokens",
    ) -> str | None:
        """None when `output` shows exactly this short-output symptom, else why it does not.

        The symptom: the server reports every token asked for (`predicted == asked`), and
        the output is a strict prefix of the plain one keeping at least `min_kept` of it."""
        if not output:
            return "the output is empty"
        if len(output) >= len(plain) or list(output) != list(plain[: len(output)]):
            return "the output is not a strict prefix of the plain output"
        if predicted is None:
            return "the server reported no tokens_predicted"
        if predicted != asked:
            return f"the server reported {predicted} tokens predicted, not the {asked} asked for"
        least = math.ceil((self.min_kept or 1.0) * len(plain))
        if len(output) < least:
            return (
                f"it keeps {len(output)} of the plain output's {len(plain)} {unit}, fewer than "
                f"the {least} (min_kept {self.min_kept}) the catalogued defect keeps"
            )
        return None


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
        summary = " ".join(d.summary.split())
        out.append(Defect(d.id, summary, d.fixed_by, issue, d.targets, d.min_kept))
    return out


def known_defect(manifest: Mapping, symptom: str) -> Defect | None:
    found = defects_for(manifest, symptom)
    return found[0] if found else None
