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
    symptom: str = ""

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
        out.append(Defect(d.id, summary, d.fixed_by, issue, d.targets, d.min_kept, d.symptom))
    return out


# Symptoms a verify failure can show: outputs that differ, stop short, or never come back.
# Wasted work and an ignored request field leave every output right.
FAILING_SYMPTOMS = (
    "short-output",
    "corrupt-output",
    "crash",
    "parallel-divergence",
    "quantized-divergence",
)


def explaining(manifest: Mapping, quantized: bool) -> list[Defect]:
    """The catalogued defects of this build that could explain a verify failure.

    Only those whose symptom changes outputs; and one that shows only on quantized targets
    only when a failed run served a `quantized` model: the strict tier's references, and
    F32, F16 and BF16 targets, cannot show it, so naming it there would excuse a real bug."""
    return [
        d
        for d in defects_for(manifest)
        if d.symptom in FAILING_SYMPTOMS and (quantized or d.targets != "quantized")
    ]


def known_defect(manifest: Mapping, symptom: str) -> Defect | None:
    found = defects_for(manifest, symptom)
    return found[0] if found else None


@dataclass(frozen=True)
class OpenFinding:
    """A failure seen on a lent machine and not explained yet: not a catalogued defect (no
    fix, no confirmed cause, so nothing excuses it), but what is known, where, and the
    check that shows it again. `gpu-acceptance` re-runs `check` (llamaspec argv, the
    artifact, dist and reports added) on every GPU it is lent, as a step of its own."""

    id: str
    engine: str
    backend: str
    seen: str  # where and when: machine, build, report
    summary: str
    known: tuple[str, ...]  # what the evidence says, each a sentence
    unknown: tuple[str, ...]  # what it does not say yet
    check: tuple[str, ...]

    def describe(self) -> str:
        return f"open finding {self.id} ({self.engine}, {self.backend}): {self.summary}"


OPEN_FINDINGS: tuple[OpenFinding, ...] = (
    OpenFinding(
        id="cuda-oracle-ngram-map-k-parallel",
        engine="llama.cpp",
        backend="cuda",
        seen=(
            "the third GPU round: one NVIDIA H100 80GB HBM3, driver 580.159.04, upstream "
            "b11312 (0c1e570) built for CUDA 13.0 with --variant fast-build (artifact "
            "llamacpp-cuda-0093ddf5c225); `llamaspec verify --tier oracle`, report "
            "reports/verify-llamacpp-cuda-0093ddf5c225-embedded-oracle.md"
        ),
        summary=(
            "ngram-map-k on 4 parallel slots put token 51 of the code prompt 2.20 nats from "
            "the oracle's choice (emitted id 41836, oracle chose 53894), against an envelope "
            "of 1.60 nats measured without speculation over the whole run"
        ),
        known=(
            "The output had already taken the other side of a near-tie at token 11 (ctype.h "
            "for stdio.h), within the envelope; ngram-simple on parallel slots made the same "
            "flip there; token 51 follows that other prefix.",
            "On the same GPU the strict tier passed: every method, ngram-map-k included, "
            "token-identical on the F32 copy of the model, one request at a time and on "
            "parallel slots (reports/verify-llamacpp-cuda-0093ddf5c225-embedded.md).",
            "The GPU's own plain variation on the Q4 model is large: 1.60 nats under "
            "micro-batch 4, 0.77 sequential, 0.70 on parallel slots (the CPU build: 0.09 "
            "to 0.83), and ngram-map-k on parallel slots drafted 57 tokens and had all 57 "
            "accepted.",
            "The CPU build has not shown it: ngram-map-k's oracle rows pass there.",
        ),
        unknown=(
            "Whether it reproduces: it was seen once, in one run of the parallel mode.",
            "The token's rank among the oracle's top-10, and the code prompt's own envelope "
            "on parallel slots: that report predates both (the calibrated oracle records "
            "them), so whether it was a near-tie is not known.",
            "Whether the cause is speculation (a wrong state after an accepted batch) or the "
            "Q4 CUDA kernels' batch-shape numerics, which the strict tier's F32 copy does "
            "not exercise.",
        ),
        # the exact configuration, three rounds of the parallel mode on the built-in prompts
        check=(
            *("verify", "--tier", "oracle", "--model", "embedded"),
            *("--method", "ngram-map-k", "--mode", "parallel", "--repeat", "3"),
        ),
    ),
)


def open_findings(engine: str, backend: str) -> list[OpenFinding]:
    """The open findings a build of `engine` for `backend` can show again."""
    return [f for f in OPEN_FINDINGS if f.engine == engine and f.backend == backend]
