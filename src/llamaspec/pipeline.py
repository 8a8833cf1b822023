"""The build pipeline in one place: BuildSpec → fetch → patch → build (→ smoke)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from . import build as build_stage
from . import config, flags, patches, smoke, sources, toolchain
from . import lock as lockfile
from .dialects import probe_dialect
from .embedded import embedded_model
from .errors import choose
from .server import server_help


@dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs, validated before any work starts."""

    engine: str = "llama.cpp"
    pin: str | None = None
    source: sources.SourceKind = "auto"
    source_dir: Path | None = None
    backend: str = "cpu"
    patch: tuple[str, ...] = ()
    no_patch: tuple[str, ...] = ()
    no_default_patches: bool = False
    defines: tuple[str, ...] = ()
    jobs: int | None = None
    dist: Path = field(default_factory=lambda: Path("dist"))
    smoke: bool = True
    patch_source: str | None = None
    variants: tuple[str, ...] = ()


def run_build(spec: BuildSpec, console: Console, root: Path | None = None) -> build_stage.Artifact:
    engines = config.load_engines(root)
    engine = engines[choose("engine", spec.engine, engines)]
    choose("backend", spec.backend, ("cpu", "cuda", "vulkan"))
    extra = [flags.parse_define(d, "--define") for d in spec.defines]
    flags.profile(engine.name, spec.backend)
    for name in spec.variants:
        flags.variant(engine.name, name)
    series = config.load_series(root)
    selected = patches.select(
        series, engine.name, spec.patch, spec.no_patch, spec.no_default_patches
    )
    tools = toolchain.detect()
    say = console.print
    locked = lockfile.load(root or _root())
    lockfile.check_pin(engine, spec.pin or engine.pin, locked)
    tree = sources.fetch(engine, spec.pin, spec.source, spec.source_dir, say)
    patched = patches.apply(
        tree,
        selected,
        root or _root(),
        say,
        engine=engine,
        lock=locked,
        patch_source=spec.patch_source,
    )
    artifact = build_stage.build(
        engine,
        patched,
        spec.backend,
        extra,
        tools,
        spec.dist,
        spec.jobs,
        console,
        variants=spec.variants,
    )
    console.print(f"artifact: {artifact.id} → {artifact.path}")
    if spec.smoke:
        run_smoke(artifact, console, root)
    return artifact


def run_smoke(
    artifact: build_stage.Artifact, console: Console, root: Path | None = None
) -> smoke.SmokeReport:
    model = embedded_model(console.print)
    return smoke.smoke(
        artifact, dialect_for(artifact, console, root), model, artifact.path, console
    )


def _root() -> Path:
    from .paths import project_root

    return project_root()


def newest_artifact(dist: Path) -> str:
    """The id of the most recently built artifact in `dist`."""
    from .errors import LlamaspecError

    found = sorted(dist.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise LlamaspecError(f"No artifacts in {dist}; build one first with `nox -s build-cpu`.")
    return found[-1].parent.name


def dialect_for(artifact: build_stage.Artifact, console: Console, root: Path | None = None) -> str:
    """The engine's recorded dialect at its default pin; otherwise probe the binary's --help."""
    engines = config.load_engines(root)
    engine = engines[choose("engine", artifact.manifest["engine"], engines)]
    if artifact.manifest.get("commit") == engine.pin:
        return engine.dialect
    dialect = probe_dialect(engine.name, server_help(artifact.server))
    console.print(
        f"dialect: {engine.name}@{(artifact.manifest.get('commit') or 'local')[:12]} is not the "
        f"default pin; its --help speaks the {dialect!r} dialect"
    )
    return dialect
