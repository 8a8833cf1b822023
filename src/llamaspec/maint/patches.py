"""The patch catalog's maintainer tasks: `patches status` (every catalog patch judged on an
engine tree, with the known defects at its commit) and `lock` (short SHAs and PR heads
resolved into llamaspec.lock)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.errors import LlamaspecError, choose
from llamaspec.paths import project_root

if TYPE_CHECKING:
    from rich.console import Console


def status(
    engine_name: str,
    pin: str | None,
    source: str,
    source_dir: Path | None,
    patch_source: str | None,
    console: Console,
) -> None:
    """Fetch the engine's tree and print the status of every catalog patch on it; raise
    when a patch cannot be applied as written."""
    from rich.table import Table

    from llamaspec import config
    from llamaspec import lock as lockfile
    from llamaspec.engine import patch_queue as patches
    from llamaspec.engine import patch_sources as patchsrc
    from llamaspec.engine import sources

    engines = config.load_engines()
    engine = engines[choose("engine", engine_name, engines)]
    if patch_source:
        patchsrc.check_patch_source(patch_source)
    root = project_root()
    lock = lockfile.load(root)
    tree = sources.fetch(engine, pin, source, source_dir, console.print)
    # a history pin is judged with its own record (its date), as `build --pin` builds it
    engine = config.record_for(engine, tree.commit or engine.pin) or engine
    table = Table(title=f"patches on {engine.name}@{tree.short} ({tree.origin})")
    for col in ("id", "PR", "state", "default", "status", "note"):
        table.add_column(col, overflow="fold")
    unusable: list[str] = []
    series = config.load_series(root)
    by_id = {e.id: e for e in series}
    for j in patches.judge_series(series, tree, engine, lock, root, patch_source, console.print):
        entry = by_id[j.id]
        pr = f"#{entry.upstream.pr}" if entry.upstream else "-"
        plain = j.basis == "content" and not j.note.startswith("applies after")
        state, note = j.status, entry.notes[:60] if plain else j.note
        if j.status == "error":
            unusable.append(f"{entry.id}: {j.note}")
        table.add_row(entry.id, pr, entry.state, "on" if entry.default else "off", state, note)
    console.print(table)
    from llamaspec.proof.defects import defects_for

    for d in defects_for({"engine": engine.name, "commit": tree.commit, "patches": []}):
        console.print(f"defect at {tree.short}: {d.describe()}")
    if unusable:
        raise LlamaspecError(
            f"{len(unusable)} catalog patch(es) for {engine.name} cannot be applied as written: "
            + " ".join(unusable)
        )


def relock(patch_sources: Sequence[str], console: Console) -> None:
    """Resolve every catalog entry's commits into llamaspec.lock (and record the engines'
    pins); `patch_sources`: `ENGINE=DIR|URL` mirrors. An entry that needs a mirror it was
    not given keeps its previous value; one that fails raises after the rest are written."""
    from llamaspec import config
    from llamaspec import lock as lockfile
    from llamaspec.engine import patch_sources as patchsrc

    root = project_root()
    engines = config.load_engines(root)
    mirrors = {}
    for item in patch_sources:
        name, _, where = item.partition("=")
        if not where:
            raise LlamaspecError(f"--patch-source {item!r}: write it as ENGINE=DIR|URL.")
        named = choose("engine", name, engines)  # the engine first: a typo there is named
        mirrors[named] = patchsrc.check_patch_source(where)
    lock = lockfile.load_project(root)
    lock["engines"] = {name: e.pin for name, e in engines.items()}
    failed: list[str] = []
    for entry in config.load_series(root):
        engine = engines[entry.engine]
        src = mirrors.get(entry.engine)
        try:
            commits = patchsrc.resolve_entry(entry, engine, src)
            if commits is None:
                continue
            lock["patches"][entry.id] = commits
            console.print(f"lock: {entry.id}: {len(commits)} commit(s), head {commits[-1][:12]}")
        except patchsrc.NeedsMirror as exc:  # expected without a mirror: keep what was there
            lock["patches"].setdefault(entry.id, [])
            console.print(f"lock: {entry.id}: unresolved — {exc.message}")
        except LlamaspecError as exc:
            failed.append(f"{entry.id}: {exc.message}")
            console.print(f"lock: {entry.id}: FAILED — {exc.message}")
    console.print(f"lock: wrote {lockfile.save(root, lock)}")
    if failed:
        raise LlamaspecError(
            f"{len(failed)} lock entr{'y' if len(failed) == 1 else 'ies'} could not be "
            "resolved (the others were written; a failed entry keeps its previous value): "
            + " ".join(failed)
        )
