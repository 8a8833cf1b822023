"""`llamaspec models list|check|pull`, `llamaspec recipe list|show` and `llamaspec serve`.

A recipe is rendered and served by runtime/serve.py; its `docker run` line is
images/run_line.py's."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError
from llamaspec.paths import project_root, user_config, user_data

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.runtime.serve import RenderOptions

DIALECTS = ("upstream", "upstream-legacy", "ik-legacy", "ik-spec-type")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="model pairs: list, check compatibility, download")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="every pair in models.yaml with its recipes").set_defaults(
        handler=cmd_models_list
    )
    ck = msub.add_parser("check", help="judge a pair (or two GGUF files) with the engine's rules")
    ck.add_argument("pair", nargs="?", help="pair name from models.yaml")
    ck.add_argument(
        "--target-file", type=shared.some_file, help="a local target GGUF (instead of the hub)"
    )
    ck.add_argument(
        "--draft-file", type=shared.some_file, help="a local draft GGUF (instead of the hub)"
    )
    ck.set_defaults(handler=cmd_models_check)
    pl = msub.add_parser("pull", help="check, download and verify a pair into the HF cache")
    pl.add_argument("pair")
    pl.add_argument(
        "--local-dir",
        type=shared.some_dir,
        metavar="DIR",
        help="also place the files in DIR as plain files (hard links or copies), e.g. for "
        "`docker run -v DIR:/models:ro` or `recipe show --format docker --models-dir DIR`",
    )
    pl.set_defaults(handler=cmd_models_pull)

    r = sub.add_parser("recipe", help="recipes: list them, or render one for an engine")
    rsub = r.add_subparsers(dest="recipe_command", required=True)
    rsub.add_parser("list", help="every recipe with its pair and spec types").set_defaults(
        handler=cmd_recipe_list
    )
    sh = rsub.add_parser("show", help="print the full llama-server command for a recipe")
    sh.add_argument("recipe")
    _target_args(sh, "none: rendered for --engine at its default pin")
    sh.add_argument(
        "--format",
        default="shell",
        choices=["shell", "argv", "llama-swap", "llama-swap-docker", "docker", "compose"],
        help="a shell line (default), a JSON argv, a llama-swap config entry (the server "
        "binary, or the published image's `docker run` with its cmdStop), a `docker run` "
        "line for the published image with the downloaded models mounted read-only, or the "
        "same run as a compose file",
    )
    sh.add_argument(
        "--ttl",
        type=shared.positive,
        metavar="SECONDS",
        help="with --format llama-swap*: unload the model after this many idle seconds",
    )
    sh.add_argument(
        "--alias",
        action="append",
        default=[],
        help="with --format llama-swap*: another name clients may ask for (repeatable)",
    )
    sh.add_argument("--image", help="with --format docker: the image (default: the published one)")
    sh.add_argument(
        "--models-dir",
        type=shared.some_dir,
        metavar="DIR",
        help="with --format docker/compose: mount DIR (from `models pull --local-dir DIR`) "
        "read-only at /models instead of each file from the Hugging Face cache",
    )
    sh.add_argument(
        "--with-prometheus",
        type=_monitoring_type("folder"),
        metavar="DIR",
        help="with --format compose: add a Prometheus service that evaluates the rules "
        "`recipe monitor RECIPE --out DIR` rendered in DIR (mounted read-only)",
    )
    sh.set_defaults(handler=cmd_recipe_show)
    _monitor_parser(rsub)

    s = sub.add_parser("serve", help="download, check and run a recipe's server (foreground)")
    s.add_argument("recipe")
    _target_args(s, "the newest there (of --engine)")
    s.add_argument(
        "--restart",
        action="store_true",
        help="stay as the server's parent instead of becoming it (exec): restart it when it "
        "dies on its own (crash, SIGKILL, out of memory), 1 s doubling to 30 s apart, and log "
        "how long it took to answer GET /health again; for a bare host (systemd, docker and "
        "llama-swap restart the exec'd server themselves)",
    )
    s.add_argument(
        "--max-restarts",
        type=shared.positive,
        metavar="N",
        help="with --restart: give up after N restarts in a row that did not stay healthy for "
        "60 s (default 5)",
    )
    s.add_argument(
        "--health-timeout",
        type=shared.seconds,
        metavar="SECONDS",
        help="with --restart: a server not answering GET /health with 200 this long after "
        "it (re)started is stopped and counted as a death (default 600)",
    )
    s.add_argument(
        "--hang-timeout",
        type=shared.seconds,
        metavar="SECONDS",
        help="with --restart: a server that was healthy and has not answered GET /health "
        "this long is hung; it is killed and restarted (default 60)",
    )
    s.add_argument(
        "--allow-all-interfaces",
        action="store_true",
        help="allow --host 0.0.0.0 or :: (every network this machine is on can reach the "
        "server and send it prompts)",
    )
    s.set_defaults(handler=cmd_serve)


def _monitor_parser(rsub: argparse._SubParsersAction) -> None:
    mo = rsub.add_parser(
        "monitor",
        help="render Prometheus alert rules (with their promtool tests), a scrape config and "
        "a Grafana dashboard for a recipe's server into --out DIR",
    )
    mo.add_argument("recipe")
    mo.add_argument(
        "--out", type=shared.out_dir, required=True, metavar="DIR", help="where to write"
    )
    mo.add_argument("--engine", type=options.non_empty, help="llama.cpp (default) or ik_llama.cpp")
    mo.add_argument(
        "--report",
        type=shared.some_file,
        metavar="FILE",
        help="the bench report whose acceptance is the baseline (default: the recipe's newest "
        "in reports/)",
    )
    mo.add_argument(
        "--baseline-acceptance", type=float, metavar="X", help="the baseline acceptance "
        "(0-1) instead of a report's (marked not measured)",
    )  # fmt: skip
    mo.add_argument(
        "--fraction", type=float, default=0.5,
        help="LlamaSpecAcceptanceLow fires below this share of the baseline (default 0.5)",
    )  # fmt: skip
    mo.add_argument(
        "--window", default="10m", type=_monitoring_type("duration"),
        help="the range rates are taken over (10m)",
    )  # fmt: skip
    mo.add_argument(
        "--for", dest="hold", metavar="DURATION", type=_monitoring_type("duration"),
        help="every alert's `for:` (default: 1m down, 5m deferred or idle, 15m acceptance)",
    )  # fmt: skip
    mo.add_argument(
        "--scrape-interval", default="15s", type=_monitoring_type("duration"),
        help="Prometheus's (default 15s)",
    )  # fmt: skip
    mo.add_argument(
        "--target", default="127.0.0.1:8080", metavar="HOST:PORT",
        type=_monitoring_type("target"),
        help="where Prometheus scrapes the server (default 127.0.0.1:8080)",
    )  # fmt: skip
    mo.set_defaults(handler=cmd_recipe_monitor)


def _monitoring_type(kind: str):
    """argparse type for what `recipe monitor` writes into rules, tests and compose files:
    a Prometheus duration as written, a strict HOST:PORT, a folder path without control
    characters (perf/monitoring.py's checks, run at parse time)."""

    def parse(text: str):
        from llamaspec.perf import monitoring

        try:
            if kind == "duration":
                monitoring.seconds(text, "")
                return text
            if kind == "target":
                return monitoring.check_target(text)
            return shared.some_dir(str(monitoring.check_folder(Path(text), "")))
        except LlamaspecError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None

    parse.__name__ = kind  # argparse names the type in its messages
    return parse


def _target_args(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--engine",
        type=options.non_empty,
        help="llama.cpp or ik_llama.cpp (default: the artifact's, else llama.cpp)",
    )
    shared.add_artifact_args(p, f"{default}; its binary, pin and --help decide the lines")
    p.add_argument(
        "--dialect", choices=DIALECTS, help="override the dialect (default: from engine and pin)"
    )
    p.add_argument(
        "--backend",
        type=options.backend_name,
        help="cpu, cuda or vulkan (default: the artifact's, else cuda)",
    )
    p.add_argument("--host", type=shared.host, default="127.0.0.1")
    p.add_argument("--port", type=shared.port, default=8080)
    shared.add_slots(p, "the recipe's; each keeps the recipe's context per slot")
    p.add_argument(
        "--ctx-per-slot",
        type=shared.positive,
        metavar="TOKENS",
        help="context of each slot in tokens (the server gets -c TOKENS × slots)",
    )
    shared.add_busy_max(
        p, "the largest client count the recipe's bench measured below its crossover, if any"
    )


def _render_options(args: argparse.Namespace) -> RenderOptions:
    """The `_target_args` options: what a recipe is rendered for."""
    from llamaspec.config import Serving
    from llamaspec.runtime.serve import RenderOptions

    return RenderOptions(
        engine=args.engine,
        artifact=args.artifact,
        dist=args.dist,
        dialect=args.dialect,
        backend=args.backend,
        host=args.host,
        port=args.port,
        serving=Serving(
            slots=args.slots,
            slot_ctx=args.ctx_per_slot,
            cache_ram=args.cache_ram,
            busy_max=args.spec_busy_max,
        ),
    )


def cmd_models_list(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.models import catalog as models
    from llamaspec.models import recipes

    root = project_root()
    catalog = config.load_models(root)
    console.print(models.list_table(catalog, recipes.load_all(root, _warn(console))))


def cmd_models_pull(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.models import catalog as models

    root = project_root()
    catalog = config.load_models(root)
    files = models.pull(catalog, args.pair, root, console, local_dir=args.local_dir)
    console.print(f"target: {files.target}")
    if files.draft:
        console.print(f"draft:  {files.draft}")
    if args.local_dir:
        placed = models.place_plain(
            models.pair_files(catalog, args.pair, root), args.local_dir, console
        )
        console.print(f"local dir: {len(placed)} file(s) in {args.local_dir}")


def cmd_models_check(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.models import catalog as models
    from llamaspec.models import heads

    root = project_root()
    catalog = config.load_models(root)
    if args.pair:
        verdict = models.check_pair(
            catalog, args.pair, root, console, args.target_file, args.draft_file
        )
        if verdict is None:
            pair = catalog.pairs[args.pair]
            console.print(f"{args.pair}: spec {pair.spec!r} uses no draft model; nothing to check")
            return
    elif args.target_file and args.draft_file:
        verdict = models.check_files(args.target_file, args.draft_file)
    else:
        raise LlamaspecError(
            "models check needs a PAIR from models.yaml, or both --target-file and --draft-file."
        )
    models.render_verdict(verdict, console)
    if not verdict.ok:
        raise LlamaspecError(heads.explain(verdict))
    console.print(heads.explain(verdict))


def _warn(console: Console):
    """Print a warning line (a skipped invalid recipe file) without stopping the command."""
    return lambda message: console.print(f"warning: {message}", style="yellow")


def cmd_recipe_list(args: argparse.Namespace, console: Console) -> None:
    from rich.table import Table

    from llamaspec.models import recipes

    root = project_root()
    table = Table(title="recipes (recipes/*.yaml)")
    for col in ("recipe", "pair", "spec", "from", "description"):
        table.add_column(col, no_wrap=col != "description")
    origins: dict[str, str] = {}
    known = recipes.load_all(root, _warn(console), origins)
    for row in recipes.describe(list(known.values())):
        table.add_row(*row[:3], origins.get(row[0], ""), row[3])
    console.print(table)
    console.print(
        "from: checkout or package (the project's recipes/), tuned (written by tune under "
        f"{user_data() / 'recipes'}), user (your own, {user_config() / 'recipes'}); a "
        "later one wins on a shared name, shown as 'user (over checkout)'."
    )


def cmd_recipe_show(args: argparse.Namespace, console: Console) -> None:
    from rich.console import Console

    # stdout is the command alone (`recipe show NAME > run.sh`); notes go to stderr
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    if args.with_prometheus is not None and args.format != "compose":
        raise LlamaspecError(
            f"--with-prometheus goes with --format compose only (not {args.format}): it adds "
            "a Prometheus service to the compose file."
        )
    if args.with_prometheus is not None:
        from llamaspec.images import run_line

        print(
            run_line.compose_with_prometheus(
                args.recipe,
                _render_options(args),
                console,
                args.with_prometheus,
                image=args.image,
                models_dir=args.models_dir,
            ),
            end="",
        )
        return
    if args.format in ("docker", "compose", "llama-swap-docker"):
        from llamaspec.images import run_line

        line = run_line.docker_line(
            args.recipe,
            _render_options(args),
            args.format,
            console,
            image=args.image,
            models_dir=args.models_dir,
            ttl=args.ttl,
            aliases=args.alias,
        )
        print(line, end="")
        return
    from llamaspec.runtime.serve import clients_note, recipe_command

    shown = recipe_command(args.recipe, _render_options(args), console)
    recipe, cmd = shown.recipe, shown.cmd
    if args.format == "argv":
        print(json.dumps(list(cmd.argv)))
    elif args.format == "llama-swap":
        print(shown.llama_swap(args.ttl, args.alias), end="")
    else:
        print(cmd.shell())
    for note in cmd.notes:
        console.print(f"note: {note}", style="dim")
    many = clients_note(recipe, cmd.argv)
    if many:
        console.print(f"note: {many}", style="dim")
    if shown.missing:
        console.print(
            f"note: models not downloaded yet; `llamaspec models pull {recipe.pair}` fetches "
            "them (`llamaspec serve` does it for you)",
            style="dim",
        )


def cmd_recipe_monitor(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.perf import monitoring

    settings = monitoring.Settings(
        window=args.window,
        fraction=args.fraction,
        hold=args.hold,
        scrape_interval=args.scrape_interval,
        target=args.target,
    )
    done = monitoring.for_recipe(
        args.recipe,
        settings,
        engine=args.engine,
        report=args.report,
        acceptance=args.baseline_acceptance,
    )
    for path in monitoring.write(done, args.out):
        console.print(f"wrote {path}")
    console.print(f"alerts: {', '.join(done.alerts)}")
    for alert, why in done.omitted:
        console.print(f"left out: {alert}: {why}", style="dim")
    if done.baseline is None:
        console.print("no speculation alerts, so no acceptance baseline")
    else:
        console.print(f"baseline: {done.baseline.describe()}")
        if not done.baseline.measured:
            console.print("note: the baseline is NOT MEASURED", style="yellow")
    console.print(
        f"check: promtool check rules {args.out / monitoring.RULES}; promtool test rules "
        f"{args.out / monitoring.RULES_TEST}"
    )


def cmd_serve(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.runtime import serve

    serve.serve(
        args.recipe,
        _render_options(args),
        console,
        restart=_restart_policy(args),
        allow_all_interfaces=args.allow_all_interfaces,
    )


def _restart_policy(args: argparse.Namespace):
    """`--restart`'s policy (None without it); its options alone are refused."""
    named = {
        "--max-restarts": args.max_restarts,
        "--health-timeout": args.health_timeout,
        "--hang-timeout": args.hang_timeout,
    }
    given = [flag for flag, value in named.items() if value is not None]
    if not args.restart:
        if given:
            raise LlamaspecError(
                f"{' and '.join(given)} only mean something with --restart (without it serve "
                "becomes the server, and whatever started serve restarts it); add --restart, "
                "or leave them out."
            )
        return None
    from llamaspec.runtime.supervise import Policy

    policy = Policy()
    if args.max_restarts is not None:
        policy = replace(policy, max_restarts=args.max_restarts)
    if args.health_timeout is not None:
        policy = replace(policy, health_timeout_s=args.health_timeout)
    if args.hang_timeout is not None:
        policy = replace(policy, hang_s=args.hang_timeout)
    return policy
