"""The build pipeline in one place: BuildSpec → fetch → patch → build → Artifact.

The smoke test is the proof stage's (llamaspec.proof.smoke.smoke_artifact): the CLI runs it
after the build unless --no-smoke.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from llamaspec import config
from llamaspec import lock as lockfile
from llamaspec.config import user as userconfig
from llamaspec.engine import (
    backends,
    build_report,
    patch_sources,
    preflight,
    rebuild,
    sources,
    toolchain,
)
from llamaspec.engine import build as build_stage
from llamaspec.engine import patch_queue as patches
from llamaspec.engine import profiles as flags
from llamaspec.engine.artifact import Artifact, check_dist
from llamaspec.engine.cuda import choice as cuda_choice
from llamaspec.engine.cuda.toolkit import Toolkit
from llamaspec.errors import LlamaspecError, choose


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
    patch_source: str | None = None
    variants: tuple[str, ...] = ()
    cuda_arch: str | None = None
    cuda_toolkit: str = "auto"
    check_reproducible: bool = False


def run_build(
    spec: BuildSpec,
    console: Console,
    root: Path | None = None,
    engine: config.Engine | None = None,
) -> Artifact:
    """Fetch, patch and build `spec`; a failing file operation is one paragraph too.

    `engine`: a record to build instead of engines.yaml's (`bump` builds its candidate pin
    with the candidate's release record, before engines.yaml and the lock name it)."""
    try:
        return _run_build(spec, console, root, engine)
    except OSError as exc:
        raise LlamaspecError(
            f"The build stopped: {_os_error(exc)}. Check that file, free disk space and the "
            "permissions of the cache (LLAMASPEC_CACHE) and of --dist, then run again; "
            "finished cache entries stay valid and half-made ones are not used."
        ) from None


def _os_error(exc: OSError) -> str:
    """An OSError in a few words (shutil.copytree's carries a list of per-file errors)."""
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list):
        errors = exc.args[0]
        if errors and len(errors[0]) == 3:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return f"{errors[0][2]} while copying {errors[0][0]}{more}"
    where = f" on {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


@dataclass(frozen=True)
class Prepared:
    """A fetched, patched tree whose toolchain passed preflight: what configure needs."""

    engine: config.Engine
    patched: patches.PatchedTree
    backend: str
    resolved: Options
    tools: toolchain.Toolchain
    checked: preflight.Preflight
    toolkit: Toolkit | None


def prepare(
    spec: BuildSpec, console: Console, root: Path | None, record: config.Engine | None = None
) -> Prepared:
    """Validate `spec`, fetch and patch the tree, and run preflight on it."""
    # Every input is validated before any work, and before the tools are looked for: a typo
    # is reported as a typo even on a machine without a compiler.
    check_dist(spec.dist)
    engines = config.load_engines(root)
    engine = record or engines[choose("engine", spec.engine, engines)]
    backend = backends.check_backend(spec.backend)
    resolved = resolve_options(spec, engine.name)
    series = config.load_series(root)
    selected = patches.select(
        series, engine.name, spec.patch, spec.no_patch, spec.no_default_patches
    )
    sources.check_request(engine, spec.pin, spec.source, spec.source_dir)
    if spec.patch_source:
        patch_sources.check_patch_source(spec.patch_source)
    locked = lockfile.load(root or _root())
    if record is None:  # a candidate record is in no lock yet
        lockfile.check_pin(engine, spec.pin or engine.pin, locked)
        # A history pin (engines.yaml `history`) builds with its own record: its PyPI mirror,
        # and its date for the patch queue's in-base judgement and the reproducible epoch.
        engine = config.record_for(engine, spec.pin or engine.pin) or engine
    say = console.print
    toolkit, cuda = None, backends.backend(backend).cuda
    project = root or _root()
    if cuda:
        choice = cuda_choice.check_choice(spec.cuda_toolkit)
        cuda_choice.check_archs_before_download(choice, resolved.archs, project)
        if choice not in cuda_choice.CHOICES:  # a folder: read here, nothing fetched
            toolkit = cuda_choice.resolve(choice, project, say)
    elif spec.cuda_toolkit != "auto":
        raise LlamaspecError(
            f"--cuda-toolkit applies to --backend cuda only, not {backend!r}; drop it or build "
            "CUDA."
        )
    preflight.check_archs(backend, resolved.archs)
    # the tools last: a bad input is named as such on a machine without a compiler too
    tools = toolchain.detect()
    if cuda and toolkit is None:  # may fetch the pinned CUDA wheels: after the tools are found
        toolkit = cuda_choice.resolve(choice, project, say)
    preflight.run(backend, tools, None, resolved.archs, resolved.defines, toolkit).require()
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
    checked = preflight.run(backend, tools, patched.path, resolved.archs, resolved.defines, toolkit)
    for check in checked.checks:
        console.print(f"preflight: {check.name}: {check.found}")
    checked.require()
    return Prepared(engine, patched, backend, resolved, tools, checked, toolkit)


def _run_build(
    spec: BuildSpec, console: Console, root: Path | None, record: config.Engine | None
) -> Artifact:
    p = prepare(spec, console, root, record)
    built = build_stage.build(
        p.engine,
        p.patched,
        p.backend,
        p.resolved.defines,
        p.tools,
        spec.dist,
        p.resolved.jobs,
        console,
        variants=p.resolved.variants,
        internal=p.checked.defines,
        manifest_extra={
            "preflight": p.checked.summary(),
            "user_config": p.resolved.config_file,
            **(
                {"cuda_toolkit": {"version": p.toolkit.release, "origin": p.toolkit.origin}}
                if p.toolkit
                else {}
            ),
        },
        runtime_lib_dir=p.toolkit.lib_dir if p.toolkit else None,
    )
    artifact = rebuild.check(built, console) if spec.check_reproducible else built.artifact
    console.print(f"artifact: {artifact.id} → {artifact.path}")
    if backends.backend(p.backend).cuda:
        report = build_report.cuda_report(artifact)
        console.print(f"build: CUDA build report in {report}")
    return artifact


@dataclass(frozen=True)
class Options:
    """Build options after layering: CLI > user config > profile."""

    defines: tuple[flags.Define, ...]
    variants: tuple[str, ...]
    archs: tuple[str, ...] | None
    jobs: int | None
    config_file: str | None


def resolve_options(spec: BuildSpec, engine: str) -> Options:
    """Merge the user config under the CLI and validate it all before any work starts."""
    if spec.jobs is not None and spec.jobs < 1:
        raise LlamaspecError(
            f"--jobs {spec.jobs} is not a number of parallel compile jobs; give 1 or more "
            "(or leave it out: the build then uses every core)."
        )
    user, path = userconfig.load()
    mine = user.for_backend(spec.backend)
    origin = f"user config {path}"
    extra = [flags.parse_define(f"{k}={v}", origin) for k, v in mine.defines.items()]
    arch_text, arch_origin = (
        (spec.cuda_arch, "--cuda-arch") if spec.cuda_arch else (mine.cuda_arch, origin)
    )
    if arch_text:
        archs = backends.parse_cuda_arch(arch_text, arch_origin)
        extra.append(backends.cuda_arch_define(archs, arch_origin))
    extra += [flags.parse_define(d, "--define") for d in spec.defines]
    final_arch = [d for d in extra if d.name == "CMAKE_CUDA_ARCHITECTURES"]
    archs_final = (
        backends.parse_cuda_arch(final_arch[-1].value, final_arch[-1].origin)
        if final_arch
        else None
    )
    variants = spec.variants or tuple(mine.variants or ())
    merged = flags.merge(engine, spec.backend, extra, None, variants)
    backends.check_conflicts(spec.backend, merged)
    return Options(
        tuple(extra), variants, archs_final, spec.jobs or user.jobs, str(path) if path else None
    )


def _root() -> Path:
    from llamaspec.paths import project_root

    return project_root()
