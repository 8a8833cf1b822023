"""`llamaspec load`: a bounded load test of a recipe's server on loopback, speculative and
plain phases taking turns, with optional faults (perf/load.py, perf/load_report.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from llamaspec.cli import shared

if TYPE_CHECKING:
    from rich.console import Console

# The defaults (perf/load_plan.py holds the same; a unit test keeps them equal).
CLIENTS = "1,8"
REQUESTS = 32
DURATION = 300.0
N_PREDICT = 32
STREAM_SHARE = 0.5
CANCEL_SHARE = 0.25
REQUEST_TIMEOUT = 120.0
READY_TIMEOUT = 300.0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "load",
        help="a bounded load test of a recipe's server: many clients, streams, hang-ups, "
        "prompts at the context edge, faults",
        description="Run a recipe's server on 127.0.0.1 under bounded load: for each client\n"
        "count a speculative phase then a plain phase (plain only for a recipe without\n"
        "speculation), each a fresh server with one slot per client (or --slots N).\n"
        "Reports outcomes, latency percentiles, throughput, acceptance, the server's memory\n"
        "over time and, on an F32 reference target, whether every completed output equals a\n"
        "sequential plain run.",
    )
    p.add_argument("recipe", help="recipe name, e.g. gemma3-270m-q4-draft")
    shared.add_artifact_args(p)
    p.add_argument(
        "--clients",
        action="append",
        default=[],
        metavar="N[,M…]",
        help=f"clients at once, 1 to 64 (repeatable or a list; default {CLIENTS})",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=REQUESTS,
        metavar="N",
        help=f"requests per phase, 1 or more (default {REQUESTS})",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=DURATION,
        metavar="S",
        help=f"time limit in seconds for all load phases together (default {DURATION:g})",
    )
    p.add_argument(
        "--n-predict",
        type=shared.positive,
        default=N_PREDICT,
        metavar="N",
        help=f"tokens an answer (default {N_PREDICT})",
    )
    p.add_argument(
        "--stream-share",
        type=float,
        default=STREAM_SHARE,
        metavar="F",
        help=f"share of requests streamed (default {STREAM_SHARE})",
    )
    p.add_argument(
        "--cancel-share",
        type=float,
        default=CANCEL_SHARE,
        metavar="F",
        help=f"share of streams hung up after a few tokens (default {CANCEL_SHARE})",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="FAULT",
        help="kill@SECONDS (SIGKILL the server, restart it), stall (a client stops reading "
        "a stream), overflow (answers that overflow the slot's context); repeatable",
    )
    p.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on an F32 reference target, compare every completed output with a sequential "
        "plain run (default: on)",
    )
    p.add_argument(
        "--speculative-only",
        action="store_true",
        help="run no plain phases: a soak of the speculative server (the report then has "
        "no plain figures to compare with)",
    )
    p.add_argument(
        "--ctx",
        type=shared.positive,
        metavar="N",
        help="context per slot in tokens (default: the recipe's)",
    )
    shared.add_slots(p, "one per client; more clients than slots queue")
    p.add_argument(
        "--threads",
        "-t",
        type=shared.positive,
        metavar="N",
        help="llama-server threads (default: the engine's)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT,
        metavar="S",
        help=f"every request's deadline in seconds (default {REQUEST_TIMEOUT:g})",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=READY_TIMEOUT,
        metavar="S",
        help=f"how long a server may take to become healthy (default {READY_TIMEOUT:g})",
    )
    shared.add_reports(p)
    p.set_defaults(handler=cmd_load)


def plan_from(args: argparse.Namespace):
    """The LoadPlan the arguments ask for; a bad value is a one-paragraph error."""
    from llamaspec.perf.load_plan import LoadPlan, parse_clients, parse_fault

    clients: tuple[int, ...] = ()
    for text in args.clients or [CLIENTS]:
        clients += parse_clients(text)
    return LoadPlan(
        clients=tuple(dict.fromkeys(clients)),
        requests=args.requests,
        duration=args.duration,
        n_predict=args.n_predict,
        stream_share=args.stream_share,
        cancel_share=args.cancel_share,
        faults=tuple(parse_fault(f) for f in args.fault),
        exact=args.exact,
        speculative_only=args.speculative_only,
        ctx=args.ctx,
        threads=args.threads,
        slots=args.slots,
        cache_ram=args.cache_ram,
        request_timeout=args.request_timeout,
        ready_timeout=args.ready_timeout,
    )


def cmd_load(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.models import recipes
    from llamaspec.perf import load_report

    plan = plan_from(args)  # a bad value is refused before anything starts
    recipes.find(args.recipe)  # an unknown recipe too
    artifact = shared.load_artifact(args)
    load_report.run(artifact, args.recipe, plan, args.reports, console)
