"""`llamaspec doctor`: the build preflight for every backend, and the Vulkan header fix
(engine/preflight.py's `doctor`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import options

if TYPE_CHECKING:
    from rich.console import Console


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
    d.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine.doctor import doctor

    doctor(
        options.build_spec(args, backend="cpu"),  # each backend's spec is made from this one
        args.backend,
        console,
        tree=not args.no_tree,
        fix_vulkan_headers=args.fix_vulkan_headers,
    )
