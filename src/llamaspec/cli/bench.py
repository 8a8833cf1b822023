"""`llamaspec bench`, `tune`, `bench-build` and `bench-reproducible`: what speculation and
builds cost here, which speculative settings are fastest, and whether clean builds agree."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import shared

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_RECIPE = "gemma3-270m-ngram"


def _common(p: argparse.ArgumentParser) -> None:
    shared.add_artifact_args(p)
    p.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help="only these workloads (repeatable): conversation, translation, summarization, "
        "qa, math, rag, copy, code-edit",
    )
    shared.add_reports(p)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="a recipe's speedup with and without speculation")
    b.add_argument(
        "recipe",
        nargs="?",
        help=f"recipe name (default: {DEFAULT_RECIPE}, or an ad-hoc run with --target)",
    )
    _common(b)
    b.add_argument(
        "--target", type=shared.some_file, metavar="FILE", help="ad-hoc: the target GGUF"
    )
    b.add_argument("--draft", type=shared.some_file, metavar="FILE", help="ad-hoc: a draft GGUF")
    b.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="TYPE",
        help="ad-hoc: spec type (repeatable to stack): draft, ngram-mod, ngram-map-k, …",
    )
    b.add_argument("--n-max", type=shared.positive, help="draft length (overrides the recipe's)")
    b.add_argument("--repetitions", type=shared.positive, default=3)
    b.add_argument(
        "--concurrency",
        type=shared.positive,
        action="append",
        default=[],
        metavar="N",
        help="clients at once (repeatable; default 1 and 4)",
    )
    b.add_argument("--no-cost-model", action="store_true", help="skip the cost model")
    b.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more llama-server argument for both servers (repeatable; write values as "
        "--server-arg=-fa --server-arg=off); the report's name gains them",
    )
    b.set_defaults(handler=cmd_bench)
    t = sub.add_parser("tune", help="sweep spec types and knobs; write the fastest as a recipe")
    t.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE, help="the recipe to start from")
    _common(t)
    t.add_argument(
        "--budget", type=shared.minutes, default=10.0, help="minutes to spend (default 10)"
    )
    t.add_argument(
        "--out",
        type=shared.out_dir,
        help="where the tuned recipe goes (default: the project's recipes/)",
    )
    t.add_argument("--fresh", action="store_true", help="ignore the state of an earlier run")
    t.add_argument(
        "--candidates",
        type=shared.positive,
        metavar="N",
        help="try at most N candidates (in order)",
    )
    t.set_defaults(handler=cmd_tune)
    bb = sub.add_parser("bench-build", help="cold build time: llamaspec vs plain cmake")
    shared.add_artifact_args(bb)
    shared.add_reports(bb)
    bb.set_defaults(handler=cmd_bench_build)
    br = sub.add_parser(
        "bench-reproducible",
        help="two clean builds of a portable artifact, without and with llamaspec's "
        "reproducible-build flags, compared file by file",
    )
    shared.add_artifact_args(br)
    shared.add_reports(br)
    br.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the two plain-cmake builds without llamaspec's flags",
    )
    br.add_argument(
        "--reuse-build",
        action="store_true",
        help="compare the artifact's existing build with the cold second build instead of "
        "building it cold again first (one cold build instead of two)",
    )
    br.set_defaults(handler=cmd_bench_reproducible)
    bp = sub.add_parser(
        "bench-portable",
        help="a portable build vs a native one of the same pin: both under an emulated "
        "older CPU (qemu-user), then tokens/s side by side on this CPU",
    )
    shared.add_artifact_args(bp)
    bp.add_argument(
        "--native", required=True, metavar="ID", help="a GGML_NATIVE=ON build of the same pin"
    )
    bp.add_argument(
        "--cpu", default="Nehalem", help="qemu CPU model to emulate (default: Nehalem, no AVX)"
    )
    bp.add_argument(
        "--model", type=shared.existing_file, help="a GGUF (default: the embedded Gemma 3 270M)"
    )
    bp.add_argument("--rounds", type=shared.positive, default=3, help="alternating rounds")
    shared.add_reports(bp)
    bp.set_defaults(handler=cmd_bench_portable)


def cmd_bench_portable(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine.artifact import load_artifact
    from llamaspec.perf.portable import bench_portable

    artifact = shared.load_artifact(args)
    native = load_artifact(args.dist, args.native)
    bench_portable(
        artifact, native, args.model, args.reports, console, cpu=args.cpu, rounds=args.rounds
    )


def cmd_bench_reproducible(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint.repro_bench import bench_reproducible

    artifact = shared.load_artifact(args)
    bench_reproducible(
        artifact, args.reports, console, plain=not args.no_baseline, cold=not args.reuse_build
    )


def cmd_bench_build(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.maint.build_bench import bench_build

    artifact = shared.load_artifact(args)
    bench_build(artifact, args.dist, args.reports, console)


def cmd_tune(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.perf import tune, workloads

    artifact = shared.load_artifact(args)
    chosen = workloads.select(args.workload)  # unknown names fail before anything starts
    tune.tune(
        artifact,
        args.recipe,
        console,
        budget_minutes=args.budget,
        mix=chosen if args.workload else None,
        out_dir=args.out,
        reports=args.reports,
        fresh=args.fresh,
        max_candidates=args.candidates,
    )


def cmd_bench(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.perf import bench_plans, workloads

    artifact = shared.load_artifact(args)
    chosen = workloads.select(args.workload)  # unknown names fail before anything starts
    _check_adhoc(args)
    bench_plans.run_bench(
        artifact,
        args.recipe or DEFAULT_RECIPE,
        args.target,
        args.draft,
        args.spec,
        args.n_max,
        args.server_arg or (),
        chosen,
        args.reports,
        console,
        concurrency=args.concurrency or (1, 4),
        repetitions=args.repetitions,
        cost_model=not args.no_cost_model,
    )


def _check_adhoc(args: argparse.Namespace) -> None:
    """`--target`, `--draft` and `--spec` make an ad-hoc run: with --target, without a recipe."""
    from llamaspec.errors import LlamaspecError

    if args.target is None and (args.draft or args.spec):
        raise LlamaspecError(
            "--draft and --spec describe an ad-hoc run and need --target FILE too (or name a "
            "recipe instead)."
        )
    if args.target is not None and args.recipe:
        raise LlamaspecError(
            f"Both a recipe ({args.recipe}) and --target were given; bench either a recipe "
            "or an ad-hoc --target FILE [--draft FILE] --spec TYPE run."
        )
