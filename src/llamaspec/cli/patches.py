"""`llamaspec patches status|export|import` and `llamaspec lock`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError, choose
from llamaspec.paths import project_root

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patches", help="the patch catalog: status on a tree, export/import diffs")
    psub = p.add_subparsers(dest="patches_command", required=True)
    st = psub.add_parser("status", help="status of every catalog patch on an engine tree")
    options.add(st, *options.SOURCE)
    ex = psub.add_parser("export", help="copy cached patch diffs to DIR (for air-gapped machines)")
    ex.add_argument("dir", type=shared.out_dir)
    im = psub.add_parser("import", help="add diffs from a DIR written by `patches export`")
    im.add_argument("dir", type=_import_dir)
    lk = sub.add_parser("lock", help="resolve short SHAs and PR heads into llamaspec.lock")
    options.add_mirrors(lk)


def _import_dir(text: str) -> Path:
    """patches import DIR: not empty (which would import from the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "must not be empty; give the folder `llamaspec patches export DIR` wrote"
        )
    return Path(text)


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command == "lock":
        run_lock(args, console)
        return True
    if args.command != "patches":
        return False
    from llamaspec import config
    from llamaspec.engine import patch_sources as patchsrc

    engines = config.load_engines()
    if args.patches_command == "export":
        n = patchsrc.export_diffs(list(engines), args.dir)
        console.print(f"patches: exported {n} cached diffs to {args.dir}")
    elif args.patches_command == "import":
        n = patchsrc.import_diffs(args.dir)
        console.print(f"patches: imported {n} diffs into the cache")
    else:
        status(args, engines, console)
    return True


def status(args: argparse.Namespace, engines: dict, console: Console) -> None:
    from rich.table import Table

    from llamaspec import config
    from llamaspec import lock as lockfile
    from llamaspec.engine import patch_queue as patches
    from llamaspec.engine import patch_sources as patchsrc
    from llamaspec.engine import sources

    engine = engines[choose("engine", args.engine, engines)]
    if args.patch_source:
        patchsrc.check_patch_source(args.patch_source)
    root = project_root()
    lock = lockfile.load(root)
    tree = sources.fetch(engine, args.pin, args.source, args.source_dir, console.print)
    table = Table(title=f"patches on {engine.name}@{tree.short} ({tree.origin})")
    for col in ("id", "PR", "state", "default", "status", "note"):
        table.add_column(col, overflow="fold")
    unusable: list[str] = []
    series = config.load_series(root)
    by_id = {e.id: e for e in series}
    for j in patches.judge_series(
        series, tree, engine, lock, root, args.patch_source, console.print
    ):
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


def run_lock(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec import lock as lockfile
    from llamaspec.engine import patch_sources as patchsrc

    root = project_root()
    engines = config.load_engines(root)
    mirrors = {}
    for item in args.patch_source:
        name, _, where = item.partition("=")
        if not where:
            raise LlamaspecError(f"--patch-source {item!r}: write it as ENGINE=DIR|URL.")
        named = choose("engine", name, engines)
        mirrors[named] = patchsrc.check_patch_source(where)
    lock = lockfile.load(root)
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
