"""`llamaspec models list|check|pull`, `llamaspec recipe list|show` and `llamaspec serve`."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError, choose
from llamaspec.paths import default_out, project_root, user_config, user_data

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec import config
    from llamaspec.engine.artifact import Artifact
    from llamaspec.models import recipes

DIALECTS = ("upstream", "upstream-legacy", "ik-legacy", "ik-spec-type")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="model pairs: list, check compatibility, download")
    msub = m.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="every pair in models.yaml with its recipes")
    ck = msub.add_parser("check", help="judge a pair (or two GGUF files) with the engine's rules")
    ck.add_argument("pair", nargs="?", help="pair name from models.yaml")
    ck.add_argument("--target-file", type=Path, help="a local target GGUF (instead of the hub)")
    ck.add_argument("--draft-file", type=Path, help="a local draft GGUF (instead of the hub)")
    pl = msub.add_parser("pull", help="check, download and verify a pair into the HF cache")
    pl.add_argument("pair")
    pl.add_argument(
        "--local-dir",
        type=Path,
        metavar="DIR",
        help="also place the files in DIR as plain files (hard links or copies), e.g. for "
        "`docker run -v DIR:/models:ro` or `recipe show --format docker --models-dir DIR`",
    )

    r = sub.add_parser("recipe", help="recipes: list them, or render one for an engine")
    rsub = r.add_subparsers(dest="recipe_command", required=True)
    rsub.add_parser("list", help="every recipe with its pair and spec types")
    sh = rsub.add_parser("show", help="print the full llama-server command for a recipe")
    sh.add_argument("recipe")
    _target_args(sh)
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
        type=Path,
        metavar="DIR",
        help="with --format docker/compose: mount DIR (from `models pull --local-dir DIR`) "
        "read-only at /models instead of each file from the Hugging Face cache",
    )

    s = sub.add_parser("serve", help="download, check and run a recipe's server (foreground)")
    s.add_argument("recipe")
    _target_args(s)


def _target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--engine",
        type=options.non_empty,
        help="llama.cpp or ik_llama.cpp (default: the artifact's, else llama.cpp)",
    )
    p.add_argument(
        "--artifact", help="a built artifact id (or prefix) in dist/: its binary, pin and --help"
    )
    p.add_argument("--dist", type=Path, default=default_out("dist"))
    p.add_argument(
        "--dialect", choices=DIALECTS, help="override the dialect (default: from engine and pin)"
    )
    p.add_argument(
        "--backend",
        type=options.backend_name,
        help="cpu, cuda or vulkan (default: the artifact's, else cuda)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command == "models":
        _models(args, console)
    elif args.command == "recipe":
        _recipe(args, console)
    elif args.command == "serve":
        _serve(args, console)
    else:
        return False
    return True


def _models(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.models import catalog as models
    from llamaspec.models import compat

    root = project_root()
    catalog = config.load_models(root)
    if args.models_command == "list":
        from llamaspec.models import recipes

        console.print(models.list_table(catalog, recipes.load_all(root, _warn(console))))
        return
    if args.models_command == "pull":
        files = models.pull(catalog, args.pair, root, console)
        console.print(f"target: {files.target}")
        if files.draft:
            console.print(f"draft:  {files.draft}")
        if args.local_dir:
            placed = models.place_plain(
                models.pair_files(catalog, args.pair, root), args.local_dir, console
            )
            console.print(f"local dir: {len(placed)} file(s) in {args.local_dir}")
        return
    # check
    if args.pair:
        verdict = models.check_pair(
            catalog, args.pair, root, console, args.target_file, args.draft_file
        )
        if verdict is None:
            pair = catalog.pairs[args.pair]
            console.print(f"{args.pair}: spec {pair.spec!r} uses no draft model; nothing to check")
            return
    elif args.target_file and args.draft_file:
        verdict = compat.check(
            compat.read_local(args.target_file), compat.read_local(args.draft_file)
        )
    else:
        raise LlamaspecError(
            "models check needs a PAIR from models.yaml, or both --target-file and --draft-file."
        )
    models.render_verdict(verdict, console)
    if not verdict.ok:
        raise LlamaspecError(compat.explain(verdict))
    console.print(compat.explain(verdict))


def _warn(console: Console):
    """Print a warning line (a skipped invalid recipe file) without stopping the command."""
    return lambda message: console.print(f"warning: {message}", style="yellow")


def _recipe(args: argparse.Namespace, console: Console) -> None:
    from rich.console import Console
    from rich.table import Table

    from llamaspec import lock as lockfile
    from llamaspec.models import recipes

    root = project_root()
    if args.recipe_command == "list":
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
        return
    # stdout is the command alone (`recipe show NAME > run.sh`); notes go to stderr
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    recipe, catalog = recipes.find(args.recipe, root)
    pair = catalog.pairs[recipe.pair]
    locked = lockfile.load(root)["models"]
    if args.format in ("docker", "compose", "llama-swap-docker"):
        print(_docker_line(args, recipe, catalog, locked, console), end="")
        return
    target = _model_path(catalog.models[pair.target], locked.get(pair.target))
    draft = _model_path(catalog.models[pair.draft], locked.get(pair.draft)) if pair.draft else None
    cmd, _ = _command(args, recipe, target, draft, console)
    if args.format == "argv":
        print(json.dumps(list(cmd.argv)))
    elif args.format == "llama-swap":
        unread = [str(p) for p in (target, draft) if p is not None and str(p).startswith("hf://")]
        if unread:  # llama-swap would start a server that cannot open its model
            raise LlamaspecError(
                f"A llama-swap entry must name model files llama-server can open, and "
                f"{', '.join(unread)} not downloaded yet. Run `llamaspec models pull "
                f"{recipe.pair}` first, then this again."
            )
        print(recipes.llama_swap(recipe.name, cmd, args.ttl, args.alias), end="")
    else:
        print(cmd.shell())
    for note in cmd.notes:
        console.print(f"note: {note}", style="dim")
    missing = [p for p in (target, draft) if p is not None and str(p).startswith("hf://")]
    if missing:
        console.print(
            f"note: models not downloaded yet; `llamaspec models pull {recipe.pair}` fetches "
            "them (`llamaspec serve` does it for you)",
            style="dim",
        )


def _docker_line(args, recipe, catalog, locked: dict, console: Console) -> str:
    """`docker run` for the published image: every GGUF file of the pair mounted read-only
    from where `models pull` put it (a Hugging Face cache entry is a symlink into blobs/:
    the blob is mounted, under the file's own name), the recipe in the image's dialect."""
    from llamaspec.images import registry
    from llamaspec.images import specs as images
    from llamaspec.models import catalog as models
    from llamaspec.models import recipes

    pair = catalog.pairs[recipe.pair]
    mounts: list[tuple[str, str]] = []
    inside: dict[str, str] = {}
    local = args.models_dir.resolve() if args.models_dir else None
    for role, name in (("target", pair.target), ("draft", pair.draft)):
        if name is None:
            continue
        model = catalog.models[name]
        files = models.local_files(model, locked.get(name))
        if local is not None:
            names = [Path(f).name for f in (files or model.parts)]
            missing = [n for n in names if not (local / n).is_file()]
            if missing:
                raise LlamaspecError(
                    f"--models-dir {args.models_dir} lacks {', '.join(missing)} ({role} of "
                    f"recipe {recipe.name!r}). Put the files there with `llamaspec models pull "
                    f"{recipe.pair} --local-dir {args.models_dir}`."
                )
            inside[role] = f"{images.CONTAINER_MODELS}/{names[0]}"
            continue
        if files is None:
            raise LlamaspecError(
                f"The {role} model {name!r} of recipe {recipe.name!r} is not downloaded, and "
                f"a docker line can only mount files that exist. Run `llamaspec models pull "
                f"{recipe.pair}` first (it checks, downloads and verifies the pair)."
            )
        for part, path in zip(model.parts, files, strict=True):
            mounts.append((str(path.resolve()), f"{images.CONTAINER_MODELS}/{Path(part).name}"))
        inside[role] = f"{images.CONTAINER_MODELS}/{Path(model.parts[0]).name}"
    if local is not None:
        mounts = [(str(local), images.CONTAINER_MODELS)]
    if not args.backend and not args.artifact:
        host = registry.detect_host()
        args.backend = host.backend
        console.print(f"recipe: this host → {host.backend} image ({host.reason})", style="dim")
    cmd, artifact = _command(args, recipe, inside["target"], inside.get("draft"), console)
    backend = args.backend or (artifact.manifest.get("backend") if artifact else "cpu")
    engine = artifact.manifest["engine"] if artifact else (args.engine or "llama.cpp")
    tag = images.rolling_tag(
        engine, f"cuda{registry.CUDA_MAJORS[0]}" if backend == "cuda" else backend
    )
    image = args.image or images.image_ref(registry.configured_registry(None)[0], tag)
    if args.format == "compose":
        return registry.compose(recipe.name, image, backend, cmd.argv, mounts, args.port)
    if args.format == "llama-swap-docker":
        run = registry.docker_run_swap(image, backend, cmd.argv, mounts)
        return recipes.llama_swap_entry(
            recipe.name, run, args.ttl, args.alias, stop="docker stop ${MODEL_ID}"
        )
    return registry.docker_run(image, backend, cmd.argv, mounts, args.port) + "\n"


def _model_path(model: config.ModelFile, locked: dict | None) -> Path | str:
    from llamaspec.models import catalog as models

    return models.local_path(model, locked) or f"hf://{model.repo}/{model.file}"


def _command(
    args: argparse.Namespace,
    recipe: config.Recipe,
    target: Path | str,
    draft: Path | str | None,
    console: Console,
) -> tuple[recipes.ServerCommand, Artifact | None]:
    """Render for the artifact (checked against its --help) or for an engine's default pin."""
    from llamaspec import config
    from llamaspec.engine.artifact import load_artifact
    from llamaspec.models import recipes
    from llamaspec.models.dialects import dialect_for, server_help

    engines = config.load_engines()
    artifact = load_artifact(args.dist, args.artifact) if args.artifact else None
    if artifact is not None:
        engine = artifact.manifest["engine"]
        if args.engine and choose("engine", args.engine, engines) != engine:
            raise LlamaspecError(
                f"--engine {args.engine} but artifact {artifact.id} is a {engine} build; drop "
                "one of them."
            )
        dialect = args.dialect or dialect_for(artifact, console.print)
        backend = args.backend or artifact.manifest.get("backend", "cpu")
        variants = list(artifact.manifest.get("variants") or ())
        pin = artifact.manifest.get("commit")
        server = str(artifact.server)
    else:
        engine = choose("engine", args.engine or "llama.cpp", engines)
        dialect = args.dialect or engines[engine].dialect
        backend = args.backend or "cuda"
        variants = None  # no build known: assume it has what the recipe asks for
        pin = None if args.dialect else engines[engine].pin  # a forced dialect: no pin
        server = "llama-server"
    cmd = recipes.render(
        recipe,
        engine,
        dialect,
        target,
        draft,
        server=server,
        backend=backend,
        host=args.host,
        port=args.port,
        variants=variants,
        pin=pin,
    )
    if artifact is not None:
        recipes.check_against_help(cmd, server_help(artifact.server), f"{artifact.id}/llama-server")
    return cmd, artifact


def _serve(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.engine.artifact import newest_artifact
    from llamaspec.models import catalog as models
    from llamaspec.models import recipes

    root = project_root()
    recipe, catalog = recipes.find(args.recipe, root)
    if args.engine:  # a typo is named as one, not as "no such artifact"
        from llamaspec import config

        args.engine = choose("engine", args.engine, config.load_engines())
    if not args.artifact:
        args.artifact = newest_artifact(args.dist, args.engine)
    files = models.pull(catalog, recipe.pair, root, console)
    cmd, artifact = _command(args, recipe, files.target, files.draft, console)
    rpc_hosts = recipe.for_engine(artifact.manifest["engine"]).server.rpc if artifact else ()
    if artifact is not None and "rpc" in (artifact.manifest.get("variants") or ()) and rpc_hosts:
        from llamaspec.runtime import rpc

        for host, version in rpc.check_hosts(artifact, rpc_hosts).items():
            console.print(f"serve: rpc host {host} answers, protocol {'.'.join(map(str, version))}")
    console.print(f"serve: {cmd.shell()}")
    console.print(f"serve: listening on http://{args.host}:{args.port} (Ctrl-C stops it)")
    os.execv(cmd.argv[0], list(cmd.argv))
