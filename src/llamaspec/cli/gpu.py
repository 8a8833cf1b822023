"""`llamaspec cuda-compile-check` and `llamaspec gpu-acceptance` (maint/gpu_acceptance.py:
every GPU promise checked in one command, on an NVIDIA GPU, each step its own process)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared

if TYPE_CHECKING:
    from rich.console import Console


def add_parsers(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "cuda-compile-check",
        help="no GPU needed: configure CUDA and compile a few representative CUDA sources",
    )
    options.add(c, "engine", "pin", "source", "source_dir", "cuda_arch", "cuda_toolkit")
    options.add(c, "patch", "no_patch", "variants", "defines", "jobs")
    c.add_argument(
        "--out", type=shared.out_file, help="write the record (per-object seconds) as JSON"
    )
    c.set_defaults(handler=cmd_cuda_compile_check)
    g = sub.add_parser(
        "gpu-acceptance",
        help="on an NVIDIA GPU: build CUDA for both engines, smoke, verify, bench, tune",
    )
    options.add(g, "cuda_arch", "cuda_toolkit", "source", "variants", "jobs")
    shared.add_dist(g)
    shared.add_reports(g)
    g.add_argument(
        "--engine", action="append", default=[], help="only these engines (default: both)"
    )
    g.add_argument(
        "--tune-budget", type=shared.minutes, default=5.0, help="minutes for tune (default 5)"
    )
    g.set_defaults(handler=cmd_gpu_acceptance)


def cmd_cuda_compile_check(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine.cuda import check as cuda_check

    record = cuda_check.run(options.build_spec(args, backend="cuda"), console)
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


def cmd_gpu_acceptance(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint import gpu_acceptance

    request = gpu_acceptance.Request(
        engines=tuple(args.engine),
        dist=args.dist,
        reports=args.reports,
        cuda_arch=args.cuda_arch,
        cuda_toolkit=args.cuda_toolkit,
        source=args.source,
        variants=tuple(args.variant),
        jobs=args.jobs,
        tune_budget=args.tune_budget,
    )
    gpu_acceptance.run(request, console)
