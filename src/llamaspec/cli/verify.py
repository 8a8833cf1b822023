"""`llamaspec verify`: speculation must change nothing but speed."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError


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
        help="built-in models by name: embedded, hybrid, and the random-weight reference models "
        "of the other speculation types (mtp, qwen35-mtp, qwen35moe-mtp, eagle3, gemma4, "
        "dflash, dspark; glm4moe-mtp for ik_llama.cpp). Default: every one the build can "
        "serve (hybrid only where it has no catalogued hybrid defect). A GGUF file of your "
        "own goes to --target FILE",
    )
    v.add_argument(
        "--tier",
        choices=["strict", "oracle", "both"],
        help="strict (F32 references, token-identical), oracle (per-token gaps on the model "
        "as it is) or both. Default: both for the built-in models; with --target/--recipe, "
        "by the target's precision: strict on an F32, F16 or BF16 target (and the oracle on "
        "F16/BF16 and recipes), the oracle alone on a quantized one",
    )
    v.add_argument(
        "--recipe", type=options.non_empty, help="verify a recipe's own settings (oracle tier)"
    )
    v.add_argument(
        "--target",
        type=shared.some_file,
        help="verify your own target GGUF (strict tier when it is F32, F16 or BF16; oracle "
        "tier alone when it is quantized, see --strict)",
    )
    v.add_argument("--draft", type=shared.some_file, help="with --target: a draft GGUF")
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
        help="with --recipe/--target: add the strict tier, on an F32 copy of a quantized "
        "target (4 bytes a weight on disk, written once in the cache); the same as --tier both",
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
        choices=["sequential", "parallel", "traffic"],
        help="only these request modes (default: sequential and parallel). traffic, for the "
        "built-in models' strict tier: requests at random times on 4 and 8 slots, mixed "
        "prompt lengths, streamed or not, some cancelled, some with the prompt cache; every "
        "completed output compared with sequential plain decoding, acceptance listed per slot",
    )
    v.add_argument(
        "--traffic-slots",
        type=shared.counts(1, 64),
        metavar="N[,M…]",
        help="with --mode traffic: the slot counts, one server each (default 4,8)",
    )
    v.add_argument(
        "--traffic-requests",
        type=shared.positive,
        metavar="N",
        help="with --mode traffic: requests per slot at each slot count (default 3: 12 "
        "requests on 4 slots, 24 on 8)",
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
        type=shared.some_file,
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
    shared.add_busy_max(
        v, "none; built-in models: every speculative server gets it, reports tagged <model>-busyN"
    )
    v.add_argument(
        "--repeat",
        type=shared.positive,
        default=1,
        metavar="N",
        help="built-in models: run the parallel mode N times (timing-dependent batching)",
    )
    shared.add_reports(v)
    v.set_defaults(handler=cmd_verify)
    op = sub.add_parser(
        "oracle-power",
        help="the oracle's power: defects planted into real outputs of the embedded quantized "
        "model, judged by both tiers; detection and false-alarm rates",
    )
    shared.add_artifact_args(op)
    op.add_argument(
        "--short",
        action="store_true",
        help="two prompts, one swap position, one clean method (CI's version, a few minutes)",
    )
    shared.add_reports(op)
    op.set_defaults(handler=cmd_oracle_power)


def cmd_verify(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.models.dialects import dialect_for
    from llamaspec.proof import suite

    _check(args)
    prompts = suite.load_prompts(args.prompts) if args.prompts else ()
    artifact = shared.load_artifact(args)
    dialect = dialect_for(artifact, console.print)
    tier = "both" if args.strict else args.tier  # None: the default for what is verified
    if args.recipe:
        outcome = suite.for_recipe(
            artifact, dialect, args.recipe, tier, args.mode, args.reports, console, prompts
        )
    elif args.target:
        outcome = suite.for_files(
            artifact,
            dialect,
            args.target,
            args.draft,
            args.spec,
            tier,
            args.mode,
            args.reports,
            console,
            prompts,
        )
    else:
        which = args.model
        tiers = ["strict", "oracle"] if tier in (None, "both") else [tier]
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
            args.traffic_slots or (),
            args.traffic_requests,
            args.spec_busy_max,
        )
    outcome.raise_if_failed(artifact, args.reports)


def cmd_oracle_power(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.models.dialects import dialect_for
    from llamaspec.proof import planted

    artifact = shared.load_artifact(args)
    dialect = dialect_for(artifact, console.print)
    planted.measure(artifact, dialect, args.reports, console, args.short)


def _check(args: argparse.Namespace) -> None:
    """Options that only mean something together are refused apart, before any work."""
    from llamaspec.errors import choose
    from llamaspec.models.methods import METHOD_NAMES

    for name in args.model:
        _not_a_file(name)
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
    if own and args.spec_busy_max is not None:
        raise LlamaspecError(
            "--spec-busy-max is for the built-in models; a --recipe or --target run verifies "
            "exactly its own settings. Drop it."
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
    traffic = "traffic" in args.mode
    if (args.traffic_slots or args.traffic_requests) and not traffic:
        raise LlamaspecError(
            "--traffic-slots and --traffic-requests shape the traffic mode: add --mode traffic."
        )
    if traffic and own:
        raise LlamaspecError(
            "--mode traffic runs on the built-in reference models (their F32 copies, where "
            "every output must be identical); drop --recipe/--target, or drop --mode traffic."
        )
    if traffic and args.tier == "oracle":
        raise LlamaspecError(
            "--mode traffic is a mode of the strict tier; with --tier oracle it would run "
            "nothing. Use --tier strict (or leave --tier out)."
        )
    if args.strict and args.tier:
        raise LlamaspecError(
            f"--strict is --tier both; with --tier {args.tier} the two say different things. "
            "Give one of them."
        )


def _not_a_file(name: str) -> None:
    """`--model` takes a built-in name; a path given there is pointed to --target."""
    path = Path(name)
    if "/" in name or "\\" in name or path.suffix.lower() == ".gguf" or path.is_file():
        raise LlamaspecError(
            f"--model takes the name of a built-in model (embedded, hybrid or a reference "
            f"family), and {name!r} is a file path. To verify a GGUF file of your own, give it "
            f"as --target {name} (with --draft FILE for a draft model, or --spec TYPE)."
        )
