"""`llamaspec doctor`: each backend's preflight on this machine, as a table with the fixes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from llamaspec.engine import backends, preflight
from llamaspec.engine.vulkan import headers as vkheaders
from llamaspec.errors import LlamaspecError, choose

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.engine.pipeline import BuildSpec


def doctor(
    spec: BuildSpec,
    named: Sequence[str],
    console: Console,
    *,
    tree: bool = True,
    fix_vulkan_headers: bool = False,
) -> None:
    """`llamaspec doctor`: the preflight of each backend in `named` (default: all) for
    `spec`'s engine, printed as a table each; raises when a named backend is not ready.

    `tree`: fetch the engine's source (`spec.source`) for the checks that need it;
    `fix_vulkan_headers`: first fetch the pinned Vulkan/SPIR-V headers into the cache."""
    from llamaspec import config
    from llamaspec.engine import sources, toolchain
    from llamaspec.engine.cuda.assemble import NotAssembled
    from llamaspec.engine.cuda.choice import resolve as resolve_toolkit
    from llamaspec.engine.pipeline import resolve_options
    from llamaspec.paths import project_root

    if fix_vulkan_headers:
        vkheaders.install(console.print)
    named = [backends.check_backend(b) for b in named]
    engines = config.load_engines()
    engine = engines[choose("engine", spec.engine, engines)]
    # every input first, the tools after: a bad option is named as such without a compiler
    plans = []
    for backend in named or list(backends.BACKENDS):
        cuda_arch = spec.cuda_arch if backends.backend(backend).cuda else None
        one = replace(spec, engine=engine.name, backend=backend, cuda_arch=cuda_arch)
        opts = resolve_options(one, engine.name)
        toolkit, note = None, ""
        if backends.backend(backend).cuda:
            try:
                toolkit = resolve_toolkit(spec.cuda_toolkit, project_root(), console.print, False)
            except NotAssembled as exc:
                note = exc.message
        plans.append((backend, opts, toolkit, note))
    if tree:
        sources.check_request(engine, None, spec.source, spec.source_dir)
    tools = toolchain.detect()
    path = None
    if tree:
        path = sources.fetch(engine, None, spec.source, spec.source_dir, console.print).path
    failed = []
    for backend, opts, toolkit, note in plans:
        result = preflight.run(
            backend, tools, path, opts.archs, opts.defines, toolkit, doctor_note=note
        )
        show(result, console)
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


def show(result: preflight.Preflight, console: Console) -> None:
    """One backend's checks as a table, then each failure and each added define as a line."""
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
