"""`docker build --from-artifact`: an artifact already in dist/ as the image's runtime tree.

The artifact is staged on the host as the build stage stages its own (`stage.stage_runtime`)
into the build context, and the Dockerfile's runtime stage takes its tree from there
(`TREE=artifact`) instead of compiling the engine again. Before anything is built the
artifact must fit the image: the backend asked for, CPU code that is not tuned to this
machine (GGML_NATIVE=ON needs `--allow-native`), and a llama-server that starts in the
runtime base, whose glibc and C++ runtime it links against.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from llamaspec import procs
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact, load_artifact
from llamaspec.errors import LlamaspecError
from llamaspec.images.stage import stage_runtime
from llamaspec.images.tools import ContainerTool, attempt

# In the build context (the repository root); .dockerignore lets it in, git ignores it.
STAGE_DIR = ".llamaspec-stage"
_VERSION_NEED = re.compile(r"Name:\s+(GLIBC|GLIBCXX)_(\d+(?:\.\d+)*)\b")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def runtime_needs(tree: Path) -> dict[str, str]:
    """The newest GLIBC_ and GLIBCXX_ symbol versions the ELF files under `tree` need."""
    needs: dict[str, str] = {}
    for path in sorted(tree.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        with path.open("rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
        proc = procs.run(["readelf", "-V", "--wide", str(path)], timeout=60, check=False)
        for lib, version in _VERSION_NEED.findall(proc.stdout):
            if lib not in needs or _key(version) > _key(needs[lib]):
                needs[lib] = version
    return needs


def for_image(
    dist: Path, artifact_id: str, engine: str | None, backend: str | None, allow_native: bool
) -> Artifact:
    """The artifact `artifact_id` in `dist`, refused where the image asked for (its
    `engine` and `backend`, when given) cannot carry it."""
    artifact = load_artifact(dist, artifact_id)
    if engine and artifact.manifest.get("engine") != engine:
        raise LlamaspecError(
            f"{artifact.id} is a {artifact.manifest.get('engine')} build, not {engine}; "
            "drop --engine (the artifact's own engine is used) or name another artifact."
        )
    check_fits(artifact, backend, allow_native)
    return artifact


def check_fits(artifact: Artifact, backend: str | None, allow_native: bool) -> None:
    """Refuse an artifact the image cannot carry, before anything is staged or built."""
    m = artifact.manifest
    if backend and m.get("backend") != backend:
        raise LlamaspecError(
            f"{artifact.id} is a {m.get('backend')} build, not {backend}: an image for "
            f"{backend} needs an artifact built with `--backend {backend}`. Drop --backend "
            "(the artifact's own backend is used) or build the artifact you want first."
        )
    if m.get("reproducible") == repro.NATIVE and not allow_native:
        raise LlamaspecError(
            f"{artifact.id} was compiled with GGML_NATIVE=ON: its CPU code uses every "
            "instruction set this machine's CPU has, and an image of it can stop with an "
            "illegal instruction on another CPU. Build the artifact with `--variant portable` "
            "for an image others can run, or pass --allow-native for an image meant only for "
            "machines with this CPU."
        )


@contextlib.contextmanager
def staged(artifact: Artifact, root: Path, console: Console) -> Iterator[Path]:
    """The artifact's runtime tree in `root/.llamaspec-stage`, removed afterwards."""
    out = root / STAGE_DIR
    try:
        stage_runtime(artifact, out, console)
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


def check_base_runs(tool: ContainerTool, base: str, tree: Path, artifact: Artifact) -> None:
    """`llama-server --version` from the staged tree must run in the runtime base image."""
    with tool.working_container(base) as ctr:
        argv = ["/opt/llamaspec/bin/llama-server", "--version"]
        server = attempt(tool.run_argv(ctr, argv, [(tree, "/opt/llamaspec")]), what=argv[0])
        if server.returncode == 0:
            return
        glibc = attempt(tool.run_argv(ctr, ["getconf", "GNU_LIBC_VERSION"]))
    needs = runtime_needs(tree)
    wants = ", ".join(f"{k} {v}" for k, v in sorted(needs.items())) or "nothing versioned"
    has = glibc.stdout.strip() or "an unknown glibc"
    said = (server.stderr or server.stdout or "").strip().splitlines()
    raise LlamaspecError(
        f"{artifact.id} does not run in the runtime base {base} ({has}); it needs {wants} "
        f"({said[-1] if said else f'exit {server.returncode}'}). An artifact must be built on "
        "a system no newer than the image's base: build it in the image instead (drop "
        "--from-artifact), or give a newer --base-image."
    )
