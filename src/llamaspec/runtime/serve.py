"""A recipe's llama-server command, and `serve`: pull, check, render, run.

A recipe is rendered for a built artifact (in its dialect, checked against its own
`--help`) or, without one, for an engine at its default pin (`recipe show`). `serve` pulls
and checks the pair, renders it for the artifact, checks its RPC hosts and becomes the
server (exec)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from llamaspec.errors import LlamaspecError, choose
from llamaspec.paths import project_root

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec import config
    from llamaspec.engine.artifact import Artifact
    from llamaspec.models.dialects import ServerCommand


@dataclass(frozen=True)
class RenderOptions:
    """What a recipe is rendered for: a built artifact, else an engine at its default pin."""

    engine: str | None = None  # default: the artifact's, else llama.cpp
    artifact: str | None = None  # an artifact id (or prefix) in `dist`
    dist: Path = field(default_factory=lambda: Path("dist"))
    dialect: str | None = None  # default: from the engine and pin
    backend: str | None = None  # default: the artifact's, else cuda
    host: str = "127.0.0.1"
    port: int = 8080


@dataclass(frozen=True)
class Rendered:
    """A recipe rendered into a server command, and what it is missing."""

    recipe: config.Recipe
    cmd: ServerCommand
    artifact: Artifact | None
    missing: tuple[str, ...]  # model files not downloaded yet (hf://… in the command)

    def llama_swap(self, ttl: int | None = None, aliases: Sequence[str] = ()) -> str:
        """The command as a llama-swap `models:` entry; refused while a model file is not
        downloaded (llama-swap would start a server that cannot open its model)."""
        from llamaspec.models import recipes

        if self.missing:
            raise LlamaspecError(
                f"A llama-swap entry must name model files llama-server can open, and "
                f"{', '.join(self.missing)} not downloaded yet. Run `llamaspec models pull "
                f"{self.recipe.pair}` first, then this again."
            )
        return recipes.llama_swap(self.recipe.name, self.cmd, ttl, aliases)


def model_path(model: config.ModelFile, locked: dict | None) -> Path | str:
    """The model's file where it was downloaded, else its hf:// address."""
    from llamaspec.models import catalog as models

    return models.local_path(model, locked) or f"hf://{model.repo}/{model.file}"


def recipe_command(
    name: str, opts: RenderOptions, console: Console, root: Path | None = None
) -> Rendered:
    """`recipe show`: the recipe `name` rendered with its models where `models pull` put
    them (their hf:// addresses where not yet downloaded)."""
    from llamaspec import lock as lockfile
    from llamaspec.models import recipes

    root = root or project_root()
    recipe, catalog = recipes.find(name, root)
    pair = catalog.pairs[recipe.pair]
    locked = lockfile.load(root)["models"]
    target = model_path(catalog.models[pair.target], locked.get(pair.target))
    draft = model_path(catalog.models[pair.draft], locked.get(pair.draft)) if pair.draft else None
    cmd, artifact = render(opts, recipe, target, draft, console)
    missing = tuple(str(p) for p in (target, draft) if p is not None and str(p).startswith("hf://"))
    return Rendered(recipe, cmd, artifact, missing)


def render(
    opts: RenderOptions,
    recipe: config.Recipe,
    target: Path | str,
    draft: Path | str | None,
    console: Console,
) -> tuple[ServerCommand, Artifact | None]:
    """Render for the artifact (checked against its --help) or for an engine's default pin."""
    from llamaspec import config
    from llamaspec.engine.artifact import load_artifact
    from llamaspec.models import recipes
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.server_help import server_help

    engines = config.load_engines()
    artifact = load_artifact(opts.dist, opts.artifact) if opts.artifact else None
    if artifact is not None:
        engine = artifact.manifest["engine"]
        if opts.engine and choose("engine", opts.engine, engines) != engine:
            raise LlamaspecError(
                f"--engine {opts.engine} but artifact {artifact.id} is a {engine} build; drop "
                "one of them."
            )
        dialect = opts.dialect or dialect_for(artifact, console.print)
        backend = opts.backend or artifact.manifest.get("backend", "cpu")
        variants = list(artifact.manifest.get("variants") or ())
        pin = artifact.manifest.get("commit")
        server = str(artifact.server)
    else:
        engine = choose("engine", opts.engine or "llama.cpp", engines)
        dialect = opts.dialect or engines[engine].dialect
        backend = opts.backend or "cuda"
        variants = None  # no build known: assume it has what the recipe asks for
        pin = None if opts.dialect else engines[engine].pin  # a forced dialect: no pin
        server = "llama-server"
    cmd = recipes.render(
        recipe,
        engine,
        dialect,
        target,
        draft,
        server=server,
        backend=backend,
        host=opts.host,
        port=opts.port,
        variants=variants,
        pin=pin,
    )
    if artifact is not None:
        help_text = server_help(artifact.server)
        recipes.check_spec_types(cmd, recipe, help_text, f"build {artifact.id}")
        recipes.check_against_help(cmd, help_text, f"{artifact.id}/llama-server")
    return cmd, artifact


def serve(name: str, opts: RenderOptions, console: Console, root: Path | None = None) -> NoReturn:
    """Check the build and the recipe's RPC hosts, then download and check its pair, render
    it for the artifact (default: the newest in `dist`) and become the server (foreground)."""
    from llamaspec.engine.artifact import load_artifact, newest_artifact
    from llamaspec.models import catalog as models
    from llamaspec.models import recipes

    root = root or project_root()
    recipe, catalog = recipes.find(name, root)
    if opts.engine:  # a typo is named as one, not as "no such artifact"
        from llamaspec import config

        opts = replace(opts, engine=choose("engine", opts.engine, config.load_engines()))
    if not opts.artifact:
        opts = replace(opts, artifact=newest_artifact(opts.dist, opts.engine))
    # cheap checks first: the build and the rpc hosts, before any download
    artifact = load_artifact(opts.dist, opts.artifact)
    rpc_hosts = recipe.for_engine(artifact.manifest["engine"]).server.rpc
    if rpc_hosts:
        from llamaspec.models.dialects import no_rpc_build
        from llamaspec.runtime import rpc

        if "rpc" not in (artifact.manifest.get("variants") or ()):
            raise LlamaspecError(no_rpc_build(f"Recipe {recipe.name!r}", rpc_hosts))
        for host, version in rpc.check_hosts(artifact, rpc_hosts).items():
            console.print(f"serve: rpc host {host} answers, protocol {'.'.join(map(str, version))}")
    files = models.pull(catalog, recipe.pair, root, console)
    cmd, _ = render(opts, recipe, files.target, files.draft, console)
    console.print(f"serve: {cmd.shell()}")
    console.print(f"serve: listening on http://{opts.host}:{opts.port} (Ctrl-C stops it)")
    os.execv(cmd.argv[0], list(cmd.argv))
