"""How to run a recipe with the published image: a `docker run` line (or a compose file, or
a llama-swap entry running the image) with the pair's GGUF files mounted read-only.

A Hugging Face cache entry is a symlink into blobs/: the blob is mounted, under the file's
own name; `models pull --local-dir DIR` files are mounted as one directory instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.engine import backends
from llamaspec.errors import LlamaspecError
from llamaspec.images import commands
from llamaspec.paths import project_root

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.runtime.serve import RenderOptions

FORMATS = ("docker", "compose", "llama-swap-docker")


def docker_line(
    name: str,
    opts: RenderOptions,
    fmt: str,
    console: Console,
    *,
    image: str | None = None,
    models_dir: Path | None = None,
    ttl: int | None = None,
    aliases: Sequence[str] = (),
    root: Path | None = None,
) -> str:
    """The recipe `name` run by the published image, in `fmt` (one of FORMATS): every GGUF
    file of the pair mounted read-only from where `models pull` put it (or `models_dir`),
    the recipe in the image's dialect. `image` overrides the published image."""
    from llamaspec import lock as lockfile
    from llamaspec.images import registry
    from llamaspec.images import specs as images
    from llamaspec.models import catalog as models
    from llamaspec.models import recipes
    from llamaspec.runtime.serve import render

    root = root or project_root()
    recipe, catalog = recipes.find(name, root)
    locked = lockfile.load(root)["models"]
    pair = catalog.pairs[recipe.pair]
    mounts: list[tuple[str, str]] = []
    inside: dict[str, str] = {}
    local = models_dir.resolve() if models_dir else None
    for role, model_name in (("target", pair.target), ("draft", pair.draft)):
        if model_name is None:
            continue
        model = catalog.models[model_name]
        files = models.local_files(model, locked.get(model_name))
        if local is not None:
            names = [Path(f).name for f in (files or model.parts)]
            missing = [n for n in names if not (local / n).is_file()]
            if missing:
                raise LlamaspecError(
                    f"--models-dir {models_dir} lacks {', '.join(missing)} ({role} of "
                    f"recipe {recipe.name!r}). Put the files there with `llamaspec models pull "
                    f"{recipe.pair} --local-dir {models_dir}`."
                )
            inside[role] = f"{images.CONTAINER_MODELS}/{names[0]}"
            continue
        if files is None:
            raise LlamaspecError(
                f"The {role} model {model_name!r} of recipe {recipe.name!r} is not downloaded, "
                f"and a docker line can only mount files that exist. Run `llamaspec models pull "
                f"{recipe.pair}` first (it checks, downloads and verifies the pair)."
            )
        for part, path in zip(model.parts, files, strict=True):
            mounts.append((str(path.resolve()), f"{images.CONTAINER_MODELS}/{Path(part).name}"))
        inside[role] = f"{images.CONTAINER_MODELS}/{Path(model.parts[0]).name}"
    if local is not None:
        mounts = [(str(local), images.CONTAINER_MODELS)]
    if not opts.backend and not opts.artifact:
        host = registry.detect_host()
        opts = replace(opts, backend=host.backend)
        console.print(f"recipe: this host → {host.backend} image ({host.reason})", style="dim")
    cmd, artifact = render(opts, recipe, inside["target"], inside.get("draft"), console)
    backend = opts.backend or (artifact.manifest.get("backend") if artifact else "cpu")
    engine = artifact.manifest["engine"] if artifact else (opts.engine or "llama.cpp")
    tag = images.rolling_tag(engine, backends.backend(backend).tag_name(registry.CUDA_MAJORS[0]))
    image = image or images.image_ref(registry.configured_registry(None)[0], tag)
    if fmt == "compose":
        return commands.compose(recipe.name, image, backend, cmd.argv, mounts, opts.port)
    if fmt == "llama-swap-docker":
        run = commands.docker_run_swap(image, backend, cmd.argv, mounts)
        return recipes.llama_swap_entry(
            recipe.name, run, ttl, aliases, stop="docker stop ${MODEL_ID}"
        )
    return commands.docker_run(image, backend, cmd.argv, mounts, opts.port) + "\n"


def compose_with_prometheus(
    name: str, opts: RenderOptions, console: Console, prometheus: Path, **kw
) -> str:
    """`docker_line(..., "compose")` with a Prometheus service beside the server that
    evaluates the rules `recipe monitor` rendered into the folder `prometheus`
    (perf/monitoring.py); that folder is checked before any model is looked for."""
    from llamaspec.models import recipes
    from llamaspec.perf import monitoring

    recipe, _ = recipes.find(name, kw.get("root") or project_root())
    monitoring.read_record(prometheus, recipe.name)
    text = docker_line(name, opts, "compose", console, **kw)
    return monitoring.compose_prometheus(text, recipe.name, prometheus)
