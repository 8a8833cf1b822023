"""Images and registries: which image suits this host, pulling it (refused unless its labels
match), how to run it with a recipe, and pushing built tags."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llamaspec.config import Engine, load_engines
from llamaspec.errors import LlamaspecError, choose
from llamaspec.images import specs as images
from llamaspec.images.tools import TRANSFER_S, ContainerTool, attempt

NVIDIA_SMI_S = 30
# Words in a pull's error that mean the registry was not reached (not: no such image).
UNREACHABLE = (
    "no such host",
    "dial tcp",
    "connection refused",
    "i/o timeout",
    "network is unreachable",
    "temporary failure in name resolution",
    "tls handshake timeout",
    "could not resolve",
    "connect: ",
)


@dataclass(frozen=True)
class HostBackend:
    backend: str
    reason: str


def detect_host(
    root: Path = Path("/"),
    which: Callable[[str], str | None] = shutil.which,
) -> HostBackend:
    """NVIDIA GPU → cuda; a hardware Vulkan driver with a render node → vulkan; else cpu."""
    gpus = root / "proc/driver/nvidia/gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return HostBackend("cuda", f"NVIDIA GPU(s) in {gpus}")
    smi = which("nvidia-smi")
    if smi and root == Path("/"):
        try:
            listed = attempt([smi, "-L"], NVIDIA_SMI_S)
        except LlamaspecError as err:
            raise LlamaspecError(
                f"nvidia-smi could not list this host's GPUs ({err}) The NVIDIA driver may be "
                "hung; name the image's backend yourself with --backend cuda, vulkan or cpu."
            ) from None
        if listed.returncode == 0 and "GPU" in listed.stdout:
            return HostBackend("cuda", listed.stdout.strip().splitlines()[0])
    icds = sorted(
        p.name
        for d in ("usr/share/vulkan/icd.d", "etc/vulkan/icd.d", "usr/local/share/vulkan/icd.d")
        if (root / d).is_dir()
        for p in (root / d).glob("*.json")
    )
    hardware = [n for n in icds if not n.startswith("lvp")]
    render = sorted((root / "dev/dri").glob("renderD*")) if (root / "dev/dri").is_dir() else []
    if hardware and render:
        return HostBackend("vulkan", f"Vulkan drivers {', '.join(hardware)} and {render[0]}")
    if hardware:
        return HostBackend("cpu", "Vulkan drivers are installed but there is no GPU render node")
    return HostBackend("cpu", "no NVIDIA GPU and no hardware Vulkan driver")


def run_hint(
    ref: str,
    backend: str,
    engine: Engine,
    commit: str | None,
    recipe_name: str = images.DEFAULT_RECIPE,
    root: Path | None = None,
) -> str:
    """How to run the image with a recipe: the pair's GGUFs mounted at /models, the recipe
    rendered in the engine's dialect. The image listens on 0.0.0.0:8080 inside; the port is
    published on the host's loopback only, since llama-server has no authentication unless
    given --api-key."""
    from llamaspec.config import load_models, load_recipes
    from llamaspec.models import recipes

    catalog = load_models(root)
    known = load_recipes(root, catalog)
    recipe = known[choose("recipe", recipe_name, known)]
    pair = catalog.pairs[recipe.pair]
    target = f"{images.CONTAINER_MODELS}/{catalog.models[pair.target].file}"
    draft = f"{images.CONTAINER_MODELS}/{catalog.models[pair.draft].file}" if pair.draft else None
    dialect = engine.dialect if commit in (None, engine.pin) else "upstream"
    cmd = recipes.render(recipe, engine.name, dialect, target, draft, backend=backend)
    argv = list(cmd.argv[1:])
    for flag in ("--host", "--port"):  # the entrypoint sets them
        i = argv.index(flag)
        del argv[i : i + 2]
    device = {"cuda": "--gpus all ", "vulkan": "--device /dev/dri "}.get(backend, "")
    return (
        f"# put the GGUFs of pair {recipe.pair!r} in ./models "
        f"(`llamaspec models pull {recipe.pair}` downloads and verifies them)\n"
        "# the server has no authentication, so it is published on 127.0.0.1 only; to serve\n"
        "# other machines on purpose, use `-p 8080:8080` and add `--api-key YOUR-SECRET`\n"
        "# (clients then send `Authorization: Bearer YOUR-SECRET`)\n"
        f'docker run --rm {device}-p 127.0.0.1:8080:8080 -v "$PWD/models:/models:ro" {ref} \\\n'
        f"    {shlex.join(argv)}"
    )


def pull_target(
    engine_name: str,
    backend: str | None,
    pin: str | None,
    recipe: str,
    console: Console,
    root: Path | None = None,
) -> tuple[Engine, str]:
    """Check what `docker pull` was asked for (engine, backend, pin, recipe) before any
    container tool is looked for; the backend defaults to this host's."""
    from llamaspec.config import load_models, load_recipes

    engines = load_engines(root)
    engine = engines[choose("engine", engine_name, engines)]
    if backend is not None:
        choose("backend", backend, images.BACKENDS)
    images.validate(
        images.ImageSpec(engine=engine.name, backend=backend or "cpu", pin=pin), engines
    )
    choose("recipe", recipe, load_recipes(root, load_models(root)))
    if backend is None:
        host = detect_host()
        backend = host.backend
        console.print(f"docker-pull: this host → {backend} ({host.reason})")
    return engine, backend


def pull_error(output: str, ref: str, registry: str, engine: str, backend: str) -> LlamaspecError:
    """What a failed pull means: the registry was not reached, or it has no such image."""
    last = output.strip().splitlines()[-1] if output.strip() else ""
    build = f"nox -s docker-build -- --engine {engine} --backend {backend}"
    if any(word in output.lower() for word in UNREACHABLE):
        return LlamaspecError(
            f"Cannot reach the registry {registry.split('/')[0]} to pull {ref} "
            f"({last or 'no answer'}). Check the network or proxy, or build the same image "
            f"here instead: `{build}`."
        )
    return LlamaspecError(
        f"{registry} has no image {ref} ({last or 'pull failed'}). See the published tags "
        f"of {registry}/{images.REPOSITORY}, or build it: `{build}`."
    )


def pull(
    tool: ContainerTool,
    engine: Engine,
    backend: str,
    pin: str | None,
    registry: str,
    tag: str | None,
    console: Console,
    recipe: str = images.DEFAULT_RECIPE,
) -> str:
    """Pull the image (checked by `pull_target`), refuse it unless its labels match, and
    print how to run it with `recipe`."""
    ref = images.image_ref(registry, tag or images.rolling_tag(engine.name, backend))
    proc = attempt(tool.pull_argv(ref), TRANSFER_S)
    if proc.returncode != 0:
        raise pull_error(proc.stderr or proc.stdout or "", ref, registry, engine.name, backend)
    labels = tool.labels(ref)
    images.check_labels(labels, ref, engine.name, backend, pin)
    commit = labels.get(images.LABEL_PREFIX + "engine-commit")
    patches = labels.get(images.LABEL_PREFIX + "patches") or "-"
    console.print(
        f"docker-pull: {ref} = {labels.get(images.LABEL_PREFIX + 'artifact-id')} "
        f"({engine.name}@{(commit or '?')[:12]}, patches {patches})"
    )
    console.print(f"Run it with the recipe {recipe!r}:\n")
    print(run_hint(ref, backend, engine, commit, recipe))
    return ref


def push(tool: ContainerTool, refs: Sequence[str]) -> str:
    """Push every tag; return `<repository>@sha256:…`, the reference to sign."""
    if not refs:
        raise LlamaspecError("The build record names no tags to push; run `docker build` again.")
    digest = ""
    for ref in refs:
        digest = tool.push(ref) or digest
    if not digest:
        raise LlamaspecError(f"Pushed {', '.join(refs)} but the push named no digest.")
    return f"{refs[0].rsplit(':', 1)[0]}@{digest}"
