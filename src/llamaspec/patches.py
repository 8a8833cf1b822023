"""Patch stage: apply the selected catalog patches to a scratch copy of a source tree.

The pristine source cache is never touched: patches go onto a shared clone in a
staging directory that is renamed into the work cache only when every patch applied.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from . import gitutil
from .config import PatchEntry
from .errors import LlamaspecError, did_you_mean
from .paths import cache_dir
from .sources import SourceTree, staging

Status = Literal["applied", "already-in-base", "skipped", "conflict"]


@dataclass(frozen=True)
class PatchStatus:
    id: str
    title: str
    status: Status
    sha256: str
    source: str


@dataclass(frozen=True)
class PatchedTree:
    source: SourceTree
    path: Path
    patches: tuple[PatchStatus, ...]

    @property
    def applied(self) -> tuple[PatchStatus, ...]:
        return tuple(p for p in self.patches if p.status == "applied")


def select(
    series: Sequence[PatchEntry],
    engine: str,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    no_defaults: bool = False,
) -> list[PatchEntry]:
    """The catalog entries to apply for `engine`, in catalog order."""
    ids = {p.id: p for p in series}
    for pid in (*include, *exclude):
        if pid not in ids:
            raise LlamaspecError(
                f"Unknown patch id {pid!r}.{did_you_mean(pid, ids)} "
                f"Patches in patches/series.yaml: {', '.join(ids) or '(none)'}."
            )
        if ids[pid].engine != engine:
            raise LlamaspecError(
                f"Patch {pid!r} is for {ids[pid].engine}, not {engine}; drop it or pick "
                f"--engine {ids[pid].engine}."
            )
    chosen = []
    for entry in series:
        if entry.engine != engine or entry.id in exclude:
            continue
        if entry.id in include or (entry.default and not no_defaults):
            chosen.append(entry)
    return chosen


def patch_file(entry: PatchEntry, root: Path) -> Path:
    path = root / "patches" / entry.engine / entry.file
    if not path.is_file():
        raise LlamaspecError(
            f"Patch {entry.id!r} names {path}, which does not exist. Restore the file or remove "
            "the entry from patches/series.yaml."
        )
    return path


_OUTSIDE = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(.*)$", re.M)


def _check_paths(entry: PatchEntry, text: str) -> None:
    for name in _OUTSIDE.findall(text):
        name = name.split("\t")[0].strip()
        if name == "/dev/null":
            continue
        if name.startswith("/") or ".." in Path(name).parts:
            raise LlamaspecError(
                f"Patch {entry.id!r} touches {name!r}, a path outside the source tree. Patches "
                "may only change files inside the tree; fix the patch's file headers."
            )


def apply(
    source: SourceTree,
    entries: Sequence[PatchEntry],
    root: Path,
    say: Callable[[str], None],
) -> PatchedTree:
    """Apply `entries` to a copy of `source`; the result is cached by (tree, patch contents)."""
    if not entries:
        return PatchedTree(source=source, path=source.path, patches=())
    texts = []
    for entry in entries:
        text = patch_file(entry, root).read_text(encoding="utf-8")
        _check_paths(entry, text)
        texts.append((entry, text, hashlib.sha256(text.encode()).hexdigest()))
    key = hashlib.sha256(
        json.dumps([source.content_key, [(e.id, h) for e, _, h in texts]]).encode()
    ).hexdigest()[:16]
    final = cache_dir() / "work" / source.engine / f"{source.short}-{key}"
    meta = final.parent / f"{final.name}.json"
    if final.is_dir() and meta.is_file():
        statuses = tuple(PatchStatus(**s) for s in json.loads(meta.read_text()))
        say(f"patches: cached patched tree ({len(statuses)} patches) at {final}")
        return PatchedTree(source=source, path=final, patches=statuses)
    statuses = []
    with staging(final) as tmp:
        tmp.rmdir()
        gitutil.git("clone", "-q", "--shared", source.path, tmp)
        for entry, text, digest in texts:
            src = f"file:patches/{entry.engine}/{entry.file}"
            if entry.only_if_missing and (tmp / entry.only_if_missing).exists():
                statuses.append(PatchStatus(entry.id, entry.title, "skipped", digest, src))
                say(f"patches: {entry.id}: skipped ({entry.only_if_missing} is present)")
                continue
            status = _apply_one(tmp, entry, text, f"{source.engine}@{source.short}")
            statuses.append(PatchStatus(entry.id, entry.title, status, digest, src))
            say(f"patches: {entry.id}: {status}")
        gitutil.git("add", "-A", cwd=tmp)
        gitutil.git("commit", "-q", "--allow-empty", "-m", "llamaspec patches", cwd=tmp)
        meta.write_text(json.dumps([asdict(s) for s in statuses], indent=2) + "\n")
    return PatchedTree(source=source, path=final, patches=tuple(statuses))


def _apply_one(tree: Path, entry: PatchEntry, text: str, label: str) -> Status:
    rev = gitutil.git("apply", "--check", "-R", "-", cwd=tree, check=False, input_text=text)
    if rev.returncode == 0:
        return "already-in-base"
    proc = gitutil.git("apply", "--3way", "--index", "-", cwd=tree, check=False, input_text=text)
    if proc.returncode == 0:
        return "applied"
    failed = [ln for ln in proc.stderr.splitlines() if ln.startswith(("error:", "U "))]
    raise LlamaspecError(
        f"Patch {entry.id!r} ({entry.title}) does not apply to {label}: "
        + "; ".join(failed[:8] or proc.stderr.strip().splitlines()[-3:])
        + ". The cached source was left untouched. Pick a pin the patch was written for, drop "
        f"it with --no-patch {entry.id}, or refresh patches/{entry.engine}/{entry.file}."
    )
