"""`llamaspec doctor`: the build preflight for every backend, and the Vulkan header fix."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import options
from llamaspec.errors import LlamaspecError

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.engine import preflight


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="check the toolchain of each backend (the build preflight)")
    d.add_argument(
        "--backend",
        action="append",
        default=[],
        help="check only this backend (repeatable); a named backend that fails exits 2",
    )
    options.add(d, "engine", "source", "source_dir")
    d.add_argument("--no-tree", action="store_true", help="skip checks that need the tree")
    options.add(d, "cuda_arch", "cuda_toolkit", "defines")
    d.add_argument(
        "--fix-vulkan-headers",
        action="store_true",
        help="fetch Debian 13's Vulkan/SPIR-V headers (sha256-pinned) into the llamaspec "
        "cache for builds on distributions with older ones",
    )


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command != "doctor":
        return False
    from llamaspec import config
    from llamaspec.engine import backends, preflight, sources, toolchain
    from llamaspec.engine.cuda.assemble import NotAssembled
    from llamaspec.engine.cuda.choice import resolve as resolve_toolkit
    from llamaspec.engine.pipeline import resolve_options
    from llamaspec.engine.vulkan import headers as vkheaders
    from llamaspec.errors import choose
    from llamaspec.paths import project_root

    if args.fix_vulkan_headers:
        vkheaders.install(console.print)
    named = [backends.check_backend(b) for b in args.backend]
    engines = config.load_engines()
    engine = engines[choose("engine", args.engine, engines)]
    tools = toolchain.detect()
    tree = None
    if not args.no_tree:
        tree = sources.fetch(engine, None, args.source, args.source_dir, console.print).path
    failed = []
    for backend in named or list(backends.BACKENDS):
        spec = options.build_spec(
            args,
            engine=engine.name,
            backend=backend,
            cuda_arch=args.cuda_arch if backend == "cuda" else None,
        )
        opts = resolve_options(spec, engine.name)
        toolkit, note = None, ""
        if backend == "cuda":
            try:
                toolkit = resolve_toolkit(args.cuda_toolkit, project_root(), console.print, False)
            except NotAssembled as exc:
                note = exc.message
        result = preflight.run(
            backend, tools, tree, opts.archs, opts.defines, toolkit, doctor_note=note
        )
        _print(result, console)
        if result.failures:
            failed.append(backend)
    console.print(
        f"doctor: {engine.name}: "
        + ", ".join(
            f"{b} {'MISSING PIECES' if b in failed else 'ready'}"
            for b in named or backends.BACKENDS
        )
    )
    if named and failed:
        raise LlamaspecError(
            f"The {', '.join(failed)} toolchain is incomplete; the fixes are in the table above."
        )
    return True


def _print(result: preflight.Preflight, console: Console) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"doctor: {result.backend}", show_lines=False)
    for col in ("check", "status", "found", "fix"):
        table.add_column(col, overflow="fold")
    for c in result.checks:
        status = "ok" if c.ok else ("MISSING" if c.required else "note")
        table.add_row(c.name, status, escape(c.found), escape(c.fix) if not c.ok else "")
    console.print(table)
    for c in result.failures:
        console.print(f"doctor: {result.backend}: {c.name}: {c.found}. Fix: {c.fix}")
    for d in result.defines:
        console.print(f"doctor: {result.backend}: the build adds {d.arg} ({d.origin})")
