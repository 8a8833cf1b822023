"""Patch stage: apply the selected catalog patches to a scratch copy of a source tree.

The pristine source cache is never touched: patches go onto a shared clone in a
staging directory that is renamed into the work cache only when every patch applied.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from llamaspec import lock as lockfile
from llamaspec.config import Engine, PatchEntry
from llamaspec.engine import gitutil
from llamaspec.engine import patch_sources as patchsrc
from llamaspec.engine.sources import SourceTree, staging
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.paths import cache_dir

Status = Literal["applied", "in-base", "applies", "skipped", "conflict"]


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
    wanted = {
        e.id
        for e in series
        if e.engine == engine
        and e.id not in exclude
        and (e.id in include or (e.default and not no_defaults))
    }
    wanted |= _pulled(ids, wanted, exclude)
    chosen = [entry for entry in series if entry.id in wanted]
    _requirements(chosen)
    return chosen


def _needs(entry: PatchEntry) -> tuple[str, ...]:
    """What selecting `entry` brings along: its requires, and the entry it adapts."""
    return (*entry.requires, *([entry.adapts] if entry.adapts else []))


def _pulled(ids: dict[str, PatchEntry], wanted: set[str], exclude: Sequence[str]) -> set[str]:
    """Everything the wanted entries require, transitively; a requirement that --no-patch
    excludes is an error naming both (a series cannot be applied in part)."""
    out: set[str] = set()
    todo = list(wanted)
    while todo:
        pid = todo.pop()
        for need in _needs(ids[pid]):
            if need in exclude:
                raise LlamaspecError(
                    f"Patch {pid!r} requires {need!r}, which --no-patch {need} excludes. A series "
                    f"applies whole: drop --no-patch {need}, or drop {pid!r} too (--no-patch "
                    f"{pid})."
                )
            if need not in wanted and need not in out:
                out.add(need)
                todo.append(need)
    return out


def series_before(series: Sequence[PatchEntry], entry: PatchEntry) -> list[PatchEntry]:
    """The entries that selecting `entry` alone pulls in and that come before it in catalog
    order: what must be applied first for `entry`'s own diff to be judged."""
    chosen = select(series, entry.engine, include=[entry.id], no_defaults=True)
    order = [e.id for e in chosen]
    return chosen[: order.index(entry.id)]


def patch_file(entry: PatchEntry, root: Path) -> Path:
    path = root / "patches" / entry.engine / str(entry.source.file)
    if not path.is_file():
        raise LlamaspecError(
            f"Patch {entry.id!r} names {path}, which does not exist. Restore the file or remove "
            "the entry from patches/series.yaml."
        )
    return path


_OUTSIDE = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(.*)$", re.M)


def check_paths(entry: PatchEntry, text: str) -> None:
    """Refuse a diff that names a file outside the source tree (absolute or with `..`)."""
    for name in _OUTSIDE.findall(text):
        name = name.split("\t")[0].strip()
        if name == "/dev/null":
            continue
        if name.startswith("/") or ".." in Path(name).parts:
            raise LlamaspecError(
                f"Patch {entry.id!r} touches {name!r}, a path outside the source tree. Patches "
                "may only change files inside the tree; fix the patch's file headers."
            )


def _requirements(chosen: list[PatchEntry]) -> None:
    ids = {p.id for p in chosen}
    for p in chosen:
        for need in p.requires:
            if need not in ids:
                raise LlamaspecError(
                    f"Patch {p.id!r} requires {need!r}, which is not selected. Add --patch {need} "
                    f"(or drop {p.id!r})."
                )
        for other in p.conflicts:
            if other in ids:
                raise LlamaspecError(
                    f"Patches {p.id!r} and {other!r} conflict; choose one with --no-patch."
                )


def in_base_by_record(entry: PatchEntry, source: SourceTree, engine: Engine) -> str | None:
    """Why a merged patch (or a project patch carrying a fix that landed upstream) is already
    in `source`, from release/date records or ancestry."""
    if entry.state != "merged" and entry.landed is None:
        return None
    landed = entry.landed
    if landed and source.commit == engine.pin:
        if landed.release and engine.build_number and engine.build_number >= landed.release:
            return f"first in b{landed.release}; the pin is b{engine.build_number}"
        if landed.date and not landed.release and engine.pin_date >= landed.date:
            return f"merged {landed.date}; the pin is of {engine.pin_date}"
    commits = entry.source.commits
    if (
        source.has_history
        and commits
        and all(gitutil.is_ancestor(source.path, c, "HEAD") for c in commits)
    ):
        return "its commits are ancestors of the pin"
    return None


def texts_for(
    entry: PatchEntry,
    engine: Engine,
    lock: dict,
    root: Path,
    patch_source: str | None,
    say: Callable[[str], None],
) -> tuple[list[str], str]:
    """The diff(s) of an entry, in order, and a label for the manifest."""
    if entry.source.file:
        text = patch_file(entry, root).read_text(encoding="utf-8")
        return [text], f"file:patches/{entry.engine}/{entry.source.file}"
    commits = lockfile.patch_commits(entry, lock)
    if not commits:
        raise LlamaspecError(
            f"Patch {entry.id!r} ({'PR head' if entry.source.pr_head else 'short SHA'}) is not "
            "resolved in llamaspec.lock. Run `llamaspec lock --patch-source DIR` with a mirror of "
            f"{engine.git_url}, or drop it with --no-patch {entry.id}."
        )
    texts = []
    for i, sha in enumerate(commits, 1):
        try:
            texts.append(patchsrc.commit_diff(engine, sha, patch_source, say))
        except LlamaspecError as exc:
            which = f"commit {i} of {len(commits)}" if len(commits) > 1 else "its commit"
            raise LlamaspecError(
                f"Patch {entry.id!r} ({entry.title}) needs the diff of {which}, {sha}. "
                + exc.message,
                details=exc.details,
            ) from None
    label = "commits:" + ",".join(c[:12] for c in commits)
    if entry.source.exclude:
        texts = without_files(entry, texts)
        label += " without " + ",".join(entry.source.exclude)
    return texts, label


_FILE_HEADER = re.compile(r"^diff --git a/(.*?) b/(.*)$")


def without_files(entry: PatchEntry, texts: Sequence[str]) -> list[str]:
    """The diffs with the files named in `source.exclude` left out (each must be in one)."""
    drop = set(entry.source.exclude)
    seen: set[str] = set()
    out = []
    for text in texts:
        kept: list[str] = []
        keep = True
        for line in text.splitlines(keepends=True):
            m = _FILE_HEADER.match(line) if line.startswith("diff --git ") else None
            if m:
                names = {m.group(1), m.group(2).rstrip("\n")}
                keep = not (names & drop)
                seen |= names & drop
            if keep:
                kept.append(line)
        out.append("".join(kept))
    missing = sorted(drop - seen)
    if missing:
        raise LlamaspecError(
            f"Patch {entry.id!r} excludes {', '.join(missing)}, which its commits do not touch. "
            "Fix `source.exclude` in patches/series.yaml."
        )
    return [t for t in out if t.strip()]


Judged = Literal["in-base", "applies", "conflict", "skipped", "unknown", "error"]


@dataclass(frozen=True)
class Judgement:
    """A catalog patch's status on a tree, without touching it, and on what it rests.

    `basis`: `only_if_missing`, `record` (release, date or ancestry), `content` (git apply
    --check, reverse and forward), `unresolved` (no diff here) or `unusable` (a bad diff)."""

    id: str
    status: Judged
    note: str
    basis: str


def judge(
    entry: PatchEntry,
    tree: SourceTree,
    engine: Engine,
    lock: dict,
    root: Path,
    patch_source: str | None,
    say: Callable[[str], None],
    before: Sequence[str] = (),
) -> Judgement:
    """The status `patches status` and `bump` report: in-base by release record, ancestry or
    content; applies; conflict; skipped; unknown (no diff to judge); error (unusable diff).

    `before`: diffs applied first (the earlier members of a series, see `judge_series`)."""
    if entry.only_if_missing and (tree.path / entry.only_if_missing).exists():
        return Judgement(
            entry.id, "skipped", f"{entry.only_if_missing} is present", "only_if_missing"
        )
    why = in_base_by_record(entry, tree, engine)
    if why:
        return Judgement(entry.id, "in-base", why, "record")
    try:
        texts, _ = texts_for(entry, engine, lock, root, patch_source, say)
    except LlamaspecError as exc:  # not resolved or not reachable: status unknown
        return Judgement(entry.id, "unknown", exc.message.split(". ")[0], "unresolved")
    try:
        for text in texts:
            check_paths(entry, text)
    except LlamaspecError as exc:  # the patch itself is unusable
        return Judgement(entry.id, "error", exc.message, "unusable")
    status = check(tree.path, texts, before)
    note = {
        "in-base": "its diff reverse-applies",
        "applies": "its diff applies",
        "conflict": "its diff does not apply",
    }[status]
    return Judgement(entry.id, status, note, "content")  # type: ignore[arg-type]


def judge_series(
    series: Sequence[PatchEntry],
    tree: SourceTree,
    engine: Engine,
    lock: dict,
    root: Path,
    patch_source: str | None,
    say: Callable[[str], None],
) -> list[Judgement]:
    """`judge` for every catalog entry of `engine`, in order, each as a build would meet it:
    on top of the earlier members of its series that apply (`requires`), and in base where
    the merged entry it adapts is in base."""
    out: dict[str, Judgement] = {}
    texts: dict[str, list[str]] = {}
    for entry in series:
        if entry.engine != engine.name:
            continue
        adapted = out.get(str(entry.adapts)) if entry.adapts else None
        if adapted is not None and adapted.status == "in-base":
            j = Judgement(entry.id, "in-base", f"it adapts {entry.adapts}, in base", "record")
        else:
            first = [e.id for e in series_before(series, entry)]
            first = [i for i in first if i in out and out[i].status == "applies"]
            j = judge(
                entry, tree, engine, lock, root, patch_source, say,
                before=[t for i in first for t in texts[i]],
            )  # fmt: skip
            if j.status == "applies" and first:
                j = Judgement(j.id, j.status, f"applies after {', '.join(first)}", j.basis)
        if j.status == "applies":
            texts[entry.id] = texts_for(entry, engine, lock, root, patch_source, say)[0]
        out[entry.id] = j
    return list(out.values())


def apply(
    source: SourceTree,
    entries: Sequence[PatchEntry],
    root: Path,
    say: Callable[[str], None],
    engine: Engine | None = None,
    lock: dict | None = None,
    patch_source: str | None = None,
) -> PatchedTree:
    """Apply `entries` to a copy of `source`; the result is cached by (tree, patch contents)."""
    if not entries:
        return PatchedTree(source=source, path=source.path, patches=())
    lock = lock or {"engines": {}, "patches": {}}
    decided: list[tuple[PatchEntry, str | None, list[str], str, str]] = []
    for entry in entries:
        why = in_base_by_record(entry, source, engine) if engine else None
        if entry.adapts:
            why = _adapted_in_base(entry, {e.id: w for e, w, *_ in decided})
        if why:
            decided.append((entry, why, [], "", "record"))
            continue
        if engine is None and not entry.source.file:
            raise LlamaspecError(f"Patch {entry.id!r} needs the engine to resolve its commits.")
        texts, label = texts_for(entry, engine, lock, root, patch_source, say)  # type: ignore[arg-type]
        for text in texts:
            check_paths(entry, text)
        digest = hashlib.sha256("".join(texts).encode("utf-8", "surrogateescape")).hexdigest()
        decided.append((entry, None, texts, digest, label))
    key = hashlib.sha256(
        json.dumps([source.content_key, [(e.id, d, w) for e, w, _, d, _ in decided]]).encode()
    ).hexdigest()[:16]
    final = cache_dir() / "work" / source.engine / f"{source.short}-{key}"
    meta = final.parent / f"{final.name}.json"
    if final.is_dir() and meta.is_file():
        problem = _damage(final, meta)
        if problem is None:
            statuses = tuple(PatchStatus(**s) for s in json.loads(meta.read_text()))
            say(f"patches: cached patched tree ({len(statuses)} patches) at {final}")
            return PatchedTree(source=source, path=final, patches=statuses)
        say(f"patches: the cached patched tree {final.name} is damaged ({problem}); redoing it")
        meta.unlink(missing_ok=True)
        shutil.rmtree(final, ignore_errors=True)
    if all(why for _, why, _, _, _ in decided):
        for entry, why, _, _, _ in decided:
            say(f"patches: {entry.id}: in-base ({why})")
        statuses = tuple(PatchStatus(e.id, e.title, "in-base", "", "record") for e, *_ in decided)
        return PatchedTree(source=source, path=source.path, patches=statuses)
    statuses = []
    label_tree = f"{source.engine}@{source.short}"
    with staging(final) as tmp:
        tmp.rmdir()
        # A plain copy, not a clone: mirrors may lack large blobs (models/*.gguf) that a
        # checkout would need, and the copy keeps whatever the source tree has.
        shutil.copytree(
            source.path,
            tmp,
            symlinks=True,
            # build directories inside the source tree stay behind (see build.build_dir_for)
            ignore=lambda d, names: [".llamaspec-build"] if Path(d) == source.path else [],
        )
        gitutil.git("update-index", "-q", "--refresh", cwd=tmp, check=False)
        for entry, why, texts, digest, label in decided:
            if why:
                statuses.append(PatchStatus(entry.id, entry.title, "in-base", "", "record"))
                say(f"patches: {entry.id}: in-base ({why})")
                continue
            if entry.adapts and any(
                st.id == entry.adapts and st.status == "in-base" for st in statuses
            ):
                statuses.append(PatchStatus(entry.id, entry.title, "in-base", "", "record"))
                say(f"patches: {entry.id}: in-base (it adapts {entry.adapts}, which is in base)")
                continue
            if entry.only_if_missing and (tmp / entry.only_if_missing).exists():
                statuses.append(PatchStatus(entry.id, entry.title, "skipped", digest, label))
                say(f"patches: {entry.id}: skipped ({entry.only_if_missing} is present)")
                continue
            status = _apply_all(tmp, entry, texts, label_tree, label)
            statuses.append(PatchStatus(entry.id, entry.title, status, digest, label))
            say(f"patches: {entry.id}: {status}")
        # Left staged, not committed: HEAD stays the engine commit, so trees whose build
        # info comes from git (`git rev-parse HEAD`) still name the engine commit.
        gitutil.git("add", "-A", cwd=tmp)
        _record(tmp, meta)
        meta.write_text(json.dumps([asdict(s) for s in statuses], indent=2) + "\n")
    return PatchedTree(source=source, path=final, patches=tuple(statuses))


def _staged_digest(tree: Path) -> str | None:
    """sha256 of what the patches changed (the index against HEAD), or None if unreadable."""
    proc = gitutil.git(
        "--no-optional-locks", "diff", "--cached", "--binary", "--full-index", "HEAD",
        cwd=tree, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return None
    return hashlib.sha256(proc.stdout.encode("utf-8", "surrogateescape")).hexdigest()


def _record(tree: Path, meta: Path) -> None:
    """Remember the patched tree's content next to its metadata (`<name>.staged`)."""
    meta.with_suffix(".staged").write_text(f"{_staged_digest(tree)}\n")


def _damage(tree: Path, meta: Path) -> str | None:
    """Why a cached patched tree is no longer what was made (None: intact).

    The patches sit staged over the engine commit: every tracked file must match the index
    and the index must hold exactly the recorded changes. Build output is untracked."""
    try:
        json.loads(meta.read_text())
    except (OSError, ValueError):
        return "its record is unreadable"
    if not (tree / ".git").exists():
        return "its .git is missing"
    worktree = gitutil.git("--no-optional-locks", "diff", "--quiet", cwd=tree, check=False)
    if worktree.returncode != 0:
        return "tracked files differ from what was patched"
    record = meta.with_suffix(".staged")
    if not record.is_file():  # made before records were kept: adopt it
        _record(tree, meta)
        return None
    if _staged_digest(tree) != record.read_text().strip():
        return "the patched changes differ from the record"
    return None


def _adapted_in_base(entry: PatchEntry, decided: dict[str, str | None]) -> str | None:
    why = decided.get(str(entry.adapts))
    return f"it adapts {entry.adapts}, which is in base: {why}" if why else None


def check(tree: Path, texts: Sequence[str], before: Sequence[str] = ()) -> Status | str:
    """in-base | applies | conflict, without touching `tree`.

    `before`: the diffs of entries applied first (a series), so the entry is judged on the
    tree as a build would give it to it."""
    if texts and all(
        gitutil.git("apply", "--check", "-R", "-", cwd=tree, check=False, input_text=t).returncode
        == 0
        for t in texts
    ):
        return "in-base"
    stacked = "".join(_ending(t) for t in (*before, *texts))
    proc = gitutil.git("apply", "--check", "-", cwd=tree, check=False, input_text=stacked)
    return "applies" if proc.returncode == 0 else "conflict"


def _ending(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _apply_all(tree: Path, entry: PatchEntry, texts: Sequence[str], label: str, src: str) -> Status:
    if all(
        gitutil.git("apply", "--check", "-R", "-", cwd=tree, check=False, input_text=t).returncode
        == 0
        for t in texts
    ):
        return "in-base"
    for text in texts:
        proc = gitutil.git(
            "apply", "--3way", "--index", "-", cwd=tree, check=False, input_text=text
        )
        if proc.returncode != 0:
            failed = [ln for ln in proc.stderr.splitlines() if ln.startswith(("error:", "U "))]
            written = (
                f"it was written against {entry.source.commits[0][:12]}^"
                if entry.source.commits
                else f"it comes from {src}"
            )
            raise LlamaspecError(
                f"Patch {entry.id!r} ({entry.title}) does not apply to {label}: "
                + "; ".join(failed[:8] or proc.stderr.strip().splitlines()[-3:])
                + f". The cached source was left untouched; {written}. Pick a pin the patch "
                f"was written for, drop it with --no-patch {entry.id}, or refresh it."
            )
    return "applied"
