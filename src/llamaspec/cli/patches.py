"""The maintainers' commands on the pins and the patch catalog: `llamaspec patches
status|export|import` and `llamaspec lock` (maint/patches.py), and `llamaspec bump`
(maint/bump_run.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "patches",
        help="the patch catalog: status on a tree, export/import diffs, patched vs stock (ab)",
    )
    psub = p.add_subparsers(dest="patches_command", required=True)
    st = psub.add_parser("status", help="status of every catalog patch on an engine tree")
    options.add(st, *options.SOURCE)
    st.set_defaults(handler=cmd_patches_status)
    ex = psub.add_parser("export", help="copy cached patch diffs to DIR (for air-gapped machines)")
    ex.add_argument("dir", type=shared.out_dir)
    ex.set_defaults(handler=cmd_patches_export)
    im = psub.add_parser("import", help="add diffs from a DIR written by `patches export`")
    im.add_argument("dir", type=_import_dir)
    im.set_defaults(handler=cmd_patches_import)
    ab = psub.add_parser(
        "ab",
        help="the default (patched) build against the stock build of the same pin: "
        "patched ÷ stock per scenario, from one run",
    )
    shared.add_artifact_args(ab)
    ab.add_argument(
        "--stock",
        required=True,
        type=shared.artifact_id,
        metavar="ID",
        help="the same pin built with --no-default-patches (an id or prefix in --dist)",
    )
    ab.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        help="only these scenarios (repeatable; default: all of them)",
    )
    ab.add_argument("--repetitions", type=shared.positive, default=3)
    shared.add_reports(ab)
    ab.set_defaults(handler=cmd_patches_ab)
    lk = sub.add_parser("lock", help="resolve short SHAs and PR heads into llamaspec.lock")
    options.add_mirrors(lk)
    lk.set_defaults(handler=cmd_lock)
    _bump_parser(sub)


def _import_dir(text: str) -> Path:
    """patches import DIR: not empty (which would import from the working directory), and a
    folder, or a path one could be at (whether it holds a queue is the command's to say)."""
    fix = "give the folder `llamaspec patches export DIR` wrote"
    return options.checked_path(text, "some-dir", fix)


def cmd_patches_ab(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint import patch_ab

    scenarios = patch_ab.select(args.scenario)  # unknown names fail before anything starts
    patch_ab.run(
        shared.load_artifact(args),
        args.dist,
        args.stock,
        scenarios,
        args.reports,
        console,
        repetitions=args.repetitions,
    )


def cmd_lock(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint import patches

    patches.relock(args.patch_source, console)


def cmd_patches_export(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.engine import patch_sources as patchsrc

    n = patchsrc.export_diffs(list(config.load_engines()), args.dir)
    console.print(f"patches: exported {n} cached diffs to {args.dir}")


def cmd_patches_import(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine import patch_sources as patchsrc

    n = patchsrc.import_diffs(args.dir)
    console.print(f"patches: imported {n} diffs into the cache")


def cmd_patches_status(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint import patches

    patches.status(args.engine, args.pin, args.source, args.source_dir, args.patch_source, console)


def _bump_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bump",
        help="move an engine's pin to a newer commit: re-judge the patch queue, optionally "
        "build, smoke and verify; update engines.yaml and llamaspec.lock when all pass",
    )
    p.add_argument(
        "--engine", required=True, type=options.non_empty, help="llama.cpp or ik_llama.cpp"
    )
    p.add_argument(
        "--to",
        default="latest",
        metavar="SHA|latest",
        help="the candidate commit: `latest` (default: the remote's or mirror's HEAD; for "
        "engines pinned at releases, the newest release) or a SHA (abbreviated needs a mirror)",
    )
    p.add_argument(
        "--source-dir",
        type=shared.some_dir,
        metavar="DIR",
        help="a clone or mirror of the engine with history (bare or not) instead of the remote",
    )
    p.add_argument(
        "--build", action="store_true", help="also build, smoke-test and verify the candidate"
    )
    p.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="accept a candidate older than the current pin (or on another branch)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="judge and write the report; change no other file"
    )
    shared.add_reports(p)
    p.set_defaults(reports=None)  # not given: reports/ in the project, wherever bump runs
    options.add(p, "patch_source", "dist", "jobs")
    p.set_defaults(handler=cmd_bump)


def cmd_bump(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint import bump_run

    request = bump_run.Request(
        engine=args.engine,
        to=args.to,
        source_dir=args.source_dir,
        build=args.build,
        allow_downgrade=args.allow_downgrade,
        dry_run=args.dry_run,
        reports=args.reports,
        patch_source=args.patch_source,
        dist=args.dist,
        jobs=args.jobs,
    )
    bump_run.run(request, console)
