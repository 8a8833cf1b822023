"""`llamaspec doctor`: the build preflight for every backend, and the Vulkan header fix."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from llamaspec import config
from llamaspec.engine import backends, preflight, sources, toolchain
from llamaspec.engine import vulkan_headers as vkheaders
from llamaspec.engine.pipeline import BuildSpec, resolve_options
from llamaspec.errors import LlamaspecError, choose


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="check the toolchain of each backend (the build preflight)")
    d.add_argument(
        "--backend",
        action="append",
        default=[],
        help="check only this backend (repeatable); a named backend that fails exits 2",
    )
    d.add_argument("--engine", default="llama.cpp", help="whose tree's needs to check")
    d.add_argument(
        "--source",
        default="auto",
        choices=["auto", "git", "pypi", "local"],
        help="where the engine tree comes from (as for build)",
    )
    d.add_argument("--source-dir", type=Path, help="engine checkout for --source local")
    d.add_argument("--no-tree", action="store_true", help="skip checks that need the tree")
    d.add_argument("--cuda-arch", metavar="ARCHS", help="CUDA archs to check against nvcc")
    d.add_argument(
        "--define", "-D", action="append", default=[], metavar="NAME=VALUE", help="as for build"
    )
    d.add_argument(
        "--fix-vulkan-headers",
        action="store_true",
        help=f"fetch Debian 13's Vulkan/SPIR-V headers ({vkheaders.RELEASE}, sha256-pinned) "
        "into the llamaspec cache for builds on distributions with older ones",
    )


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command != "doctor":
        return False
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
        spec = BuildSpec(
            engine=engine.name,
            backend=backend,
            defines=tuple(args.define),
            cuda_arch=args.cuda_arch if backend == "cuda" else None,
        )
        opts = resolve_options(spec, engine.name)
        result = preflight.run(backend, tools, tree, opts.archs, opts.defines)
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
