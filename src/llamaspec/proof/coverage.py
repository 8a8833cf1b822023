"""Which speculation types a verify run covered: every type the build offers, by its own name.

The rows are what the build's `--help` lists under `--spec-type` (less `none`), plus the
types its dialect turns on another way (ik_llama.cpp: a draft with `-md`, MTP with `-mtp`).
A type is covered when a single-type method of the strict tier drafted, had drafts
accepted, and every output was token-identical, sequential and on parallel slots; any other
row says why not. Nothing the build offers is left out. Each row, and a second table of
every reference model the run served, names the model's architecture (its target's
`general.architecture`, and its draft's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamaspec.models import dialects
from llamaspec.models.methods import KNOWN
from llamaspec.models.server_help import help_flags, spec_type_choices
from llamaspec.proof.refmodels import registry
from llamaspec.proof.verify_report import MethodResult, VerifyReport

MODES = ("sequential", "parallel")
# the built-in models that are no registry family: (target, draft) architectures. embedded:
# the F32 copy of the embedded Gemma 3 model, its own draft; hybrid: two random qwen35
# hybrids (test-llama-archs' for llama.cpp, hybrid_gguf's for ik_llama.cpp)
BUILT_IN_ARCHS = {"embedded": ("gemma3", "gemma3"), "hybrid": ("qwen35", "qwen35")}


def architecture(tag: str) -> str:
    """The architecture of the model a report tagged `tag` served: `target` or
    `target, draft DRAFT`; "" for a model verify did not make (a recipe's, a user's)."""
    name = tag.removesuffix("-defaults")
    family = registry.BY_NAME.get(name)
    arch, draft = (family.arch, family.draft_arch) if family else BUILT_IN_ARCHS.get(name, ("", ""))
    return f"{arch}, draft {draft}" if draft else arch


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
    arch: str = ""  # the model's architecture (`architecture`)


@dataclass(frozen=True)
class Served:
    """One reference model the strict run served, with its architecture and its results."""

    model: str  # `tag (file)`
    arch: str
    methods: tuple[str, ...]
    identical: Mapping[str, str]  # mode → "10/10", over its methods
    drafted: int
    accepted: int
    passed: bool


@dataclass(frozen=True)
class Coverage:
    artifact_id: str
    engine: str
    rows: tuple[Row, ...]
    served: tuple[Served, ...] = ()

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
    strict = [r for r in reports if r.tier == "strict"]
    archs = {f"{r.tag} ({r.model})": architecture(r.tag) for r in strict}
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
        rows.append(replace(row, arch=archs.get(row.model, "")))
    return Coverage(artifact_id, engine, tuple(rows), tuple(_served(strict)))


def _served(reports: Sequence[VerifyReport]) -> list[Served]:
    out = []
    for r in reports:
        ran = [m for m in r.methods if m.skipped is None]
        identical = {
            mode: f"{sum(m.count('identical', mode) for m in ran)}/"
            f"{sum(1 for m in ran for c in m.cases if c.mode == mode)}"
            for mode in MODES
            if any(c.mode == mode for m in ran for c in m.cases)
        }
        out.append(
            Served(
                f"{r.tag} ({r.model})", architecture(r.tag), tuple(m.method for m in ran),
                identical, sum(m.drafted for m in ran), sum(m.accepted for m in ran), r.passed,
            )
        )  # fmt: skip
    return out


def markdown(cov: Coverage) -> str:
    lines = [
        f"# Speculation types covered by the strict tier: {cov.artifact_id}",
        "",
        f"Every type the {cov.engine} build offers (its `--help`), and whether `verify --tier "
        "strict` covered it: drafts accepted and every output token-identical to plain decoding, "
        "sequential and on parallel slots, on an F32 reference model.",
        "",
        "| type | covered | model | architecture | method | identical (seq, par) "
        "| accepted / drafted | why not |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in cov.rows:
        ident = ", ".join(f"{v}" for v in (r.identical or {}).values())
        acc = f"{r.accepted}/{r.drafted}" if r.drafted else ""
        lines.append(
            f"| `{r.engine_type}` | {'yes' if r.covered else '**no**'} | {r.model} | {r.arch} "
            f"| {r.method} | {ident} | {acc} | {r.why} |"
        )
    if cov.served:
        lines += [
            "",
            "## Reference models served",
            "",
            "Every model of the strict run, its architecture, and its outputs over all of its "
            "methods.",
            "",
            "| model | architecture | methods | identical (seq, par) | accepted / drafted "
            "| passed |",
            "|---|---|---|---|---|---|",
        ]
        for m in cov.served:
            ident = ", ".join((m.identical or {}).values())
            acc = f"{m.accepted}/{m.drafted}" if m.drafted else ""
            lines.append(
                f"| {m.model} | {m.arch} | {', '.join(m.methods)} | {ident} | {acc} "
                f"| {'yes' if m.passed else '**no**'} |"
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
    for col in ("type", "covered", "model", "architecture", "accepted/drafted", "why not"):
        t.add_column(col)
    for r in cov.rows:
        acc = f"{r.accepted}/{r.drafted}" if r.drafted else ""
        t.add_row(r.engine_type, "yes" if r.covered else "no", r.model, r.arch, acc, r.why)
    console.print(t)
