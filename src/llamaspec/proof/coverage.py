"""Which speculation types a verify run covered: every type the build offers, by its own name.

The rows are what the build's `--help` lists under `--spec-type` (less `none`), plus the
types its dialect turns on another way (ik_llama.cpp: a draft with `-md`, MTP with `-mtp`).
A type is covered when a single-type method of the strict tier drafted, had drafts
accepted, and every output was token-identical, sequential and on parallel slots; any other
row says why not. Nothing the build offers is left out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamaspec.models import dialects
from llamaspec.models.methods import KNOWN
from llamaspec.models.server_help import help_flags, spec_type_choices
from llamaspec.proof.verify_report import MethodResult, VerifyReport

MODES = ("sequential", "parallel")


@dataclass(frozen=True)
class Row:
    """One type the build offers: covered, by which model and method, or why not."""

    engine_type: str  # as the build names it (`draft-mtp`, `ngram-cache`, `mtp (-mtp)`)
    spec_type: str | None  # llamaspec's name(s), `|`-joined; None: a type llamaspec lacks
    covered: bool
    model: str = ""
    method: str = ""
    identical: Mapping[str, str] | None = None  # mode → "5/5"
    drafted: int = 0
    accepted: int = 0
    why: str = ""  # why not covered


@dataclass(frozen=True)
class Coverage:
    artifact_id: str
    engine: str
    rows: tuple[Row, ...]

    @property
    def uncovered(self) -> list[Row]:
        return [r for r in self.rows if not r.covered]


def offered_types(dialect: str, help_text: str) -> list[tuple[str, tuple[str, ...]]]:
    """(the build's name, llamaspec's names for it) for each type the build offers (upstream's
    draft-mtp is llamaspec's `mtp` with the target's heads and `assistant` with a file)."""
    d = dialects.DIALECTS[dialect]
    inverse: dict[str, tuple[str, ...]] = {}
    for ours, theirs in sorted(d.type_names.items()):
        inverse[theirs] = (*inverse.get(theirs, ()), ours)
    listed = sorted(spec_type_choices(help_text) or ())
    out = [(name, inverse.get(name, ())) for name in listed if name != "none"]
    flag = d.flags.get("draft_model")
    if flag in help_flags(help_text):
        out += [(f"{t} ({flag})", (t,)) for t in sorted(d.by_model)]
    out += [
        (f"{t} ({s})", (t,)) for t, s in sorted(d.switches.items()) if s in help_flags(help_text)
    ]
    return out


SINGLE = {types[0]: name for name, types, _ in KNOWN if len(types) == 1}


def _row(name: str, spec: str | None, found: list[tuple[str, MethodResult]]) -> Row:
    """The row for one offered type from the strict results of its single-type methods."""
    if spec is None:
        return Row(name, None, False, why="llamaspec does not know this type yet")
    ran = [(model, m) for model, m in found if m.skipped is None]
    if not found:
        return Row(name, spec, False, why="no model in this run exercises it")
    if not ran:
        model, m = found[0]
        return Row(name, spec, False, model=model, method=m.method, why=m.skipped or "")
    # the best evidence: a passing run that accepted drafts, else the first that ran
    ran.sort(key=lambda x: (bool(x[1].failures), x[1].accepted == 0))
    model, m = ran[0]
    identical = {
        mode: f"{m.count('identical', mode)}/{sum(1 for c in m.cases if c.mode == mode)}"
        for mode in MODES
        if any(c.mode == mode for c in m.cases)
    }
    why = ""
    excused = [c for c in m.cases if c.kind == "known-defect"]
    if m.failures:
        why = f"{len(m.failures)} output(s) differ from plain decoding"
    elif excused:
        defect = (excused[0].defect or "").split(":")[0].removeprefix("known defect ")
        why = f"{len(excused)} output(s) cut short by the catalogued defect {defect}"
    elif set(identical) != set(MODES):
        why = f"ran in {', '.join(identical)} mode only"
    elif m.accepted == 0:
        why = f"nothing accepted ({m.drafted} drafted): speculation never took effect"
    return Row(name, spec, not why, model, m.method, identical, m.drafted, m.accepted, why)


def coverage(
    artifact_id: str,
    engine: str,
    dialect: str,
    help_text: str,
    reports: Sequence[VerifyReport],
    not_run: Mapping[str, str],
) -> Coverage:
    """Rows for every offered type from the strict `reports`; `not_run`: why a type's
    reference model did not run (llamaspec type → reason), for types no report has."""
    rows = []
    for name, specs in offered_types(dialect, help_text):
        methods = {SINGLE[s] for s in specs if s in SINGLE}
        found = [
            (f"{r.tag} ({r.model})", m)
            for r in reports
            if r.tier == "strict"
            for m in r.methods
            if m.method in methods and m.flags == "determinism"
        ]
        spec = "|".join(specs) or None
        row = _row(name, spec, found)
        why = [not_run[s] for s in specs if s in not_run]
        if not found and why:
            row = Row(name, spec, False, why="; ".join(why))
        rows.append(row)
    return Coverage(artifact_id, engine, tuple(rows))


def markdown(cov: Coverage) -> str:
    lines = [
        f"# Speculation types covered by the strict tier: {cov.artifact_id}",
        "",
        f"Every type the {cov.engine} build offers (its `--help`), and whether `verify --tier "
        "strict` covered it: drafts accepted and every output token-identical to plain decoding, "
        "sequential and on parallel slots, on an F32 reference model.",
        "",
        "| type | covered | model | method | identical (seq, par) | accepted / drafted | why not |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in cov.rows:
        ident = ", ".join(f"{v}" for v in (r.identical or {}).values())
        acc = f"{r.accepted}/{r.drafted}" if r.drafted else ""
        lines.append(
            f"| `{r.engine_type}` | {'yes' if r.covered else '**no**'} | {r.model} | {r.method} "
            f"| {ident} | {acc} | {r.why} |"
        )
    return "\n".join(lines) + "\n"


def write(cov: Coverage, out_dir: Path) -> Path:
    """verify-<artifact>-coverage.json and .md into `out_dir`; the Markdown's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"verify-{cov.artifact_id}-coverage"
    covered = sum(r.covered for r in cov.rows)
    data = {**asdict(cov), "offered": len(cov.rows), "covered": covered}
    data["complete"] = not cov.uncovered
    stem.with_name(stem.name + ".json").write_text(json.dumps(data, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(cov))
    return stem.with_name(stem.name + ".md")


def print_table(cov: Coverage, console: Console) -> None:
    t = Table(title=f"speculation types covered (strict tier): {cov.artifact_id}")
    for col in ("type", "covered", "model", "accepted/drafted", "why not"):
        t.add_column(col)
    for r in cov.rows:
        acc = f"{r.accepted}/{r.drafted}" if r.drafted else ""
        t.add_row(r.engine_type, "yes" if r.covered else "no", r.model, acc, r.why)
    console.print(t)
