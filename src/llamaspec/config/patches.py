"""patches/series.yaml: the patch catalog (upstream PRs, engine commits, project patches)
and the known defects of engines at some pins, recorded beside it."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from llamaspec.config.engines import ENGINES
from llamaspec.config.loader import Frozen, FullSha, RelPath, parse, read_yaml
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.paths import project_root


def check_commitish(value: str) -> str:
    """A commit SHA: full (40 hex) or abbreviated (7+ hex, to be resolved by the lock)."""
    if not re.match(r"^[0-9a-f]{7,40}$", value):
        raise ValueError(f"{value!r} is not a commit SHA (7 to 40 lowercase hex digits)")
    return value


CommitIsh = Annotated[str, AfterValidator(check_commitish)]


class Upstream(Frozen):
    """The upstream pull request a patch comes from."""

    pr: int
    url: str


class PatchSource(Frozen):
    """Where a patch's diff comes from: engine commits, a project file, or a PR's head."""

    commits: tuple[CommitIsh, ...] = ()
    file: RelPath | None = None
    pr_head: bool = False
    # Files of the commits' diffs left out: a project patch of the series (`adapts`) carries
    # their change, rewritten for pins where the commits' own hunks do not apply.
    exclude: tuple[RelPath, ...] = ()

    @model_validator(mode="after")
    def _exactly_one(self) -> PatchSource:
        if sum((bool(self.commits), self.file is not None, self.pr_head)) != 1:
            raise ValueError("source needs exactly one of `commits`, `file` or `pr_head: true`")
        if self.exclude and not self.commits:
            raise ValueError("`exclude` leaves files out of `commits` diffs; it needs `commits`")
        return self


class Landed(Frozen):
    """Where a merged patch first appears, for in-base checks on trees without history."""

    release: int | None = None
    date: dt.date | None = None


class PatchEntry(Frozen):
    """A catalog entry in patches/series.yaml."""

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    engine: str
    title: str
    source: PatchSource
    upstream: Upstream | None = None
    state: Literal["merged", "open", "project"] = "project"
    landed: Landed | None = None
    default: bool = True
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    only_if_missing: RelPath | None = None
    # A project patch that carries part of a merged entry, rewritten for older pins: it is
    # applied with that entry and is in base wherever that entry is.
    adapts: str | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _adapts_a_merged_entry(self) -> PatchEntry:
        if self.adapts is not None and (self.state != "project" or self.source.file is None):
            raise ValueError("`adapts` is for project patches (state: project, source: file)")
        return self


class Defect(Frozen):
    """A known defect of an engine at some pins: what goes wrong and what fixes it."""

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    engine: str
    pins: tuple[FullSha, ...] = Field(min_length=1)
    # wasted-work and ignored-field: outputs stay right, speculation costs more than it should
    # or a documented control does nothing (what the project's upstream patches fix)
    symptom: Literal[
        "short-output",
        "corrupt-output",
        "crash",
        "parallel-divergence",
        "quantized-divergence",
        "wasted-work",
        "ignored-field",
    ]
    targets: Literal["all", "hybrid", "quantized"] = "all"  # which targets show it
    summary: str
    upstream_issue: Upstream | None = None
    fixed_by: str = ""  # a catalog patch id, or an upstream PR/commit when not in the catalog
    # the engine's own commit that fixes it, where one is known and no catalog patch carries
    # it: a build with this commit among its ancestors has the fix in base
    fix_commit: FullSha | None = None
    reproduced: str = ""  # where and how this project saw it
    # short-output only, and required there: the least fraction of the plain output (in
    # tokens, or characters where only text is compared) that a cut-short output keeps. A
    # shorter output is not this defect, and fails.
    min_kept: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _min_kept_for_short_output(self) -> Defect:
        if (self.symptom == "short-output") != (self.min_kept is not None):
            raise ValueError(
                "`min_kept` (a fraction between 0 and 1) is needed by short-output defects, "
                "and by no other symptom"
            )
        return self


class SeriesFile(Frozen):
    patches: tuple[PatchEntry, ...] = ()
    defects: tuple[Defect, ...] = ()


def load_series(root: Path | None = None) -> tuple[PatchEntry, ...]:
    """patches/series.yaml → the ordered patch catalog, with engines and ids checked."""
    root = root or project_root()
    path = root / "patches" / "series.yaml"
    parsed = parse(SeriesFile, read_yaml(path), str(path))
    seen: set[str] = set()
    for entry in parsed.patches:
        if entry.id in seen:
            raise LlamaspecError(f"{path}: patch id {entry.id!r} appears twice; ids are unique.")
        seen.add(entry.id)
        if entry.engine not in ENGINES:
            raise LlamaspecError(
                f"{path}: patch {entry.id!r} is for engine {entry.engine!r}, which does not exist."
                f"{did_you_mean(entry.engine, ENGINES)} Known engines: {', '.join(ENGINES)}."
            )
    by_id = {entry.id: entry for entry in parsed.patches}
    for entry in parsed.patches:
        for other in (*entry.requires, *entry.conflicts, *filter(None, [entry.adapts])):
            if other not in seen:
                raise LlamaspecError(
                    f"{path}: patch {entry.id!r} names {other!r} in requires/conflicts/adapts, "
                    f"which is not in the catalog.{did_you_mean(other, seen)}"
                )
            if by_id[other].engine != entry.engine:
                raise LlamaspecError(
                    f"{path}: patch {entry.id!r} ({entry.engine}) names {other!r}, a patch for "
                    f"{by_id[other].engine}; requires/conflicts/adapts stay within one engine."
                )
        if entry.adapts is not None:
            _check_adapts(path, entry, by_id)
    return parsed.patches


def _check_adapts(path: Path, entry: PatchEntry, by_id: dict[str, PatchEntry]) -> None:
    """An adapting patch follows its merged entry in catalog order and is required by it."""
    target = by_id[str(entry.adapts)]
    order = list(by_id)
    if target.state != "merged" or not target.source.commits:
        raise LlamaspecError(
            f"{path}: patch {entry.id!r} adapts {target.id!r}, which is not a merged commit "
            "entry; `adapts` rewrites part of engine commits for older pins."
        )
    if order.index(entry.id) < order.index(target.id) or entry.id not in target.requires:
        raise LlamaspecError(
            f"{path}: patch {entry.id!r} adapts {target.id!r}: list it after {target.id!r} and "
            f"in {target.id!r}'s requires, so selecting {target.id!r} brings it along."
        )


def load_defects(root: Path | None = None) -> tuple[Defect, ...]:
    """The known defects recorded beside the patch catalog (patches/series.yaml)."""
    root = root or project_root()
    path = root / "patches" / "series.yaml"
    parsed = parse(SeriesFile, read_yaml(path), str(path))
    patch_ids = {p.id: p.engine for p in parsed.patches}
    for d in parsed.defects:
        if d.engine not in ENGINES:
            raise LlamaspecError(
                f"{path}: defect {d.id!r} is for engine {d.engine!r}."
                f"{did_you_mean(d.engine, ENGINES)}"
            )
        # one word is a catalog patch id (free text, with spaces, names a fix elsewhere)
        if d.fixed_by and " " not in d.fixed_by.strip() and patch_ids.get(d.fixed_by) != d.engine:
            raise LlamaspecError(
                f"{path}: defect {d.id!r} is fixed_by {d.fixed_by!r}, which is not a catalog "
                f"patch for {d.engine}.{did_you_mean(d.fixed_by, patch_ids)} Name a patch id, or "
                "describe the fix in words."
            )
    return parsed.defects
