"""`llamaspec verify`: speculation must change nothing but speed."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError
from llamaspec.paths import default_out


def add_parsers(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser(
        "verify",
        help="equivalence suite: strict tier on F32 reference copies, per-token oracle tier",
    )
    shared.add_artifact_args(v)
    v.add_argument(
        "--model",
        action="append",
        default=[],
        help="built-in models: embedded, hybrid, and the random-weight reference models of the "
        "other speculation types (mtp, eagle3, gemma4, dflash, dspark; glm4moe-mtp for "
        "ik_llama.cpp). Default: every one the build can serve (hybrid only where it has no "
        "catalogued hybrid defect)",
    )
    v.add_argument(
        "--tier",
        choices=["strict", "oracle", "both"],
        default="both",
        help="built-in models: strict (F32 reference, token-identical), oracle (per-token "
        "gaps on the quantized model) or both (default)",
    )
    v.add_argument(
        "--recipe", type=options.non_empty, help="verify a recipe's own settings (oracle tier)"
    )
    v.add_argument("--target", type=Path, help="verify your own target GGUF (oracle tier)")
    v.add_argument("--draft", type=Path, help="with --target: a draft GGUF")
    v.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="TYPE",
        help="with --target: draft, ngram-simple, ngram-map-k, ngram-mod or mtp",
    )
    v.add_argument(
        "--strict",
        action="store_true",
        help="with --recipe/--target: add the strict tier on F32 reference copies",
    )
    v.add_argument(
        "--method",
        action="append",
        default=[],
        help="built-in models: only these methods (draft, ngram-simple, ngram-map-k, "
        "ngram-mod, draft+ngram-mod; plain: no speculation, the control that shows whether a "
        "parallel difference is the engine's own batch variance)",
    )
    v.add_argument(
        "--mode",
        action="append",
        default=[],
        choices=["sequential", "parallel"],
        help="only these request modes (default: both)",
    )
    v.add_argument(
        "--prompt",
        action="append",
        default=[],
        metavar="NAME",
        help="built-in models: only these prompts (short, code, prose, rewrite, chat)",
    )
    v.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help="your own prompts instead of the built-in ones: JSON Lines, one object a line "
        '({"text": ..., "n_predict": N} or {"messages": [...], "n_predict": N}; '
        "see docs/guides/verify.md)",
    )
    v.add_argument(
        "--server-defaults",
        action="store_true",
        help="built-in models: run every server with its defaults instead of the determinism "
        "flags (--no-kv-unified, -fa off); measures what the defaults change, reports tagged "
        "<model>-defaults (exactness is not claimed)",
    )
    v.add_argument(
        "--repeat",
        type=shared.positive,
        default=1,
        metavar="N",
        help="built-in models: run the parallel mode N times (timing-dependent batching)",
    )
    v.add_argument("--reports", type=shared.out_dir, default=default_out("reports"))
    v.set_defaults(handler=cmd_verify)


def cmd_verify(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.models.dialects import dialect_for
    from llamaspec.proof import suite

    _check(args)
    prompts = suite.load_prompts(args.prompts) if args.prompts else ()
    artifact = shared.load_artifact(args)
    dialect = dialect_for(artifact, console.print)
    if args.recipe:
        outcome = suite.for_recipe(
            artifact, dialect, args.recipe, args.strict, args.mode, args.reports, console, prompts
        )
    elif args.target:
        outcome = suite.for_files(
            artifact,
            dialect,
            args.target,
            args.draft,
            args.spec,
            args.strict,
            args.mode,
            args.reports,
            console,
            prompts,
        )
    else:
        which = args.model
        tiers = ["strict", "oracle"] if args.tier == "both" else [args.tier]
        outcome = suite.builtin(
            artifact,
            dialect,
            which,
            tiers,
            args.method or None,
            args.mode,
            args.reports,
            console,
            args.repeat,
            args.prompt,
            prompts,
            args.server_defaults,
        )
    outcome.raise_if_failed(artifact, args.reports)


def _check(args: argparse.Namespace) -> None:
    """Options that only mean something together are refused apart, before any work."""
    from llamaspec.errors import choose
    from llamaspec.models.methods import METHOD_NAMES

    # every method verify knows (which ones a build offers is read from its --help, later)
    for method in args.method:
        choose("method", method, ("plain", *METHOD_NAMES))
    own = args.recipe or args.target
    if args.recipe and args.target:
        raise LlamaspecError("Give --recipe or --target, not both.")
    if own and (args.model or args.method or args.prompt or args.repeat > 1):
        raise LlamaspecError(
            "--model, --method, --prompt and --repeat shape the built-in run; a --recipe or "
            "--target run verifies exactly its own settings. Drop one of them."
        )
    if args.prompts and args.prompt:
        raise LlamaspecError(
            "--prompt NAME picks built-in prompts and --prompts FILE replaces them; give one."
        )
    if own and args.server_defaults:
        raise LlamaspecError(
            "--server-defaults is for the built-in models (a --recipe run adds the recipe "
            "under its own flags, the server's defaults, by itself). Drop it."
        )
    if not args.target and (args.draft or args.spec):
        raise LlamaspecError("--draft and --spec go with --target FILE.")
    if args.strict and not own:
        raise LlamaspecError(
            "--strict adds the strict tier to a --recipe or --target run; the built-in models "
            "choose tiers with --tier."
        )
