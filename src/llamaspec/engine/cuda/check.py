"""CUDA compile check: configure an engine for CUDA and compile a few chosen sources.

For machines without a GPU or a CUDA toolkit (CI): the same fetch → patch → preflight
path as a build, the engine's CUDA flag profile, the toolkit `--cuda-toolkit` resolves
(the pinned PyPI wheels where there is none), then only the sources below instead of the
whole 400-step build. A compile error fails the check with the compiler's first error.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llamaspec import procs
from llamaspec.engine import backends, pipeline
from llamaspec.engine import build as build_stage
from llamaspec.engine import profiles as flags
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

TIMEOUT_S = 3600


@dataclass(frozen=True)
class Kernel:
    source: str  # relative to the tree
    why: str


# What each engine's check compiles, and why those (the full list is every .cu file).
KERNELS: dict[str, tuple[Kernel, ...]] = {
    "llama.cpp": (
        Kernel(
            "ggml/src/ggml-cuda/ggml-cuda.cu",
            "the backend itself: device setup, the memory pool (its GGML_CUDA_NO_VMM path), "
            "CUDA graphs, the cuBLAS calls: breaks when the toolkit, cuBLAS or the flags change",
        ),
        Kernel(
            "ggml/src/ggml-cuda/template-instances/mmq-instance-q4_k.cu",
            "quantized matrix multiplication for Q4_K, the embedded model's type: MMQ "
            "instances are most of the compile time and the most architecture-specific code",
        ),
        Kernel(
            "ggml/src/ggml-cuda/cpy.cu",
            "tensor copies, which the KV cache and the speculative checkpoints of recurrent "
            "models (spec-checkpointing) go through on the GPU",
        ),
    ),
    "ik_llama.cpp": (
        Kernel(
            "ggml/src/ggml-cuda.cu",
            "ik's CUDA backend itself (device setup, memory pool, graphs, cuBLAS calls); it "
            "compiles as C++20, which needs CMake ≥ 3.26",
        ),
        Kernel(
            "ggml/src/ggml-cuda/delta-net.cu",
            "the CUDA source the patch queue touches (ik-spec-checkpoints, ik-delta-net-sync): "
            "the gated delta-net of Qwen3.5-style hybrid models",
        ),
        Kernel(
            "ggml/src/ggml-cuda/cpy.cu",
            "tensor copies (KV cache, checkpoint save and restore) in ik's own CUDA backend",
        ),
    ),
}


def object_targets(build_dir: Path, tree: Path, sources: list[str]) -> dict[str, str]:
    """source → its ninja object target, from compile_commands.json."""
    commands = json.loads((build_dir / "compile_commands.json").read_text())
    found: dict[str, str] = {}
    top = tree.resolve()
    for entry in commands:
        src = (Path(entry["directory"]) / entry["file"]).resolve()
        rel = src.relative_to(top).as_posix() if src.is_relative_to(top) else ""
        if rel in sources and "output" in entry:
            found[rel] = entry["output"]
    gone = [s for s in sources if s not in found]
    if gone:
        raise LlamaspecError(
            f"The CUDA compile check names {', '.join(gone)}, which this tree's CUDA build "
            "does not compile (moved or renamed at this pin?). Update KERNELS in "
            "llamaspec/engine/cuda/check.py."
        )
    return found


def run(spec: pipeline.BuildSpec, console: Console, root: Path | None = None) -> dict:
    """Configure for CUDA and compile KERNELS[engine]; a record with per-object seconds."""
    if not backends.backend(spec.backend).cuda:
        raise LlamaspecError("The CUDA compile check is for --backend cuda.")
    p = pipeline.prepare(spec, console, root)
    declared = flags.tree_options(p.patched.path)
    defines = [
        *flags.merge(p.engine.name, "cuda", p.resolved.defines, declared, p.resolved.variants),
        *build_stage.internal_defines(p.engine, p.patched),
        *p.checked.defines,
    ]
    key = json.dumps(sorted((d.name, d.key or d.value) for d in defines))
    slug = p.engine.name.replace("_", "-").replace(".", "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    build_dir = cache_dir() / "build" / f"cuda-check-{slug}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    build_stage.configure(p.patched.path, build_dir, defines, p.tools, console)
    configured = time.monotonic() - t0
    kernels = KERNELS[p.engine.name]
    targets = object_targets(build_dir, p.patched.path, [k.source for k in kernels])
    cmd = [p.tools.ninja, "-C", str(build_dir), *targets.values()]
    if p.resolved.jobs:
        cmd += ["-j", str(p.resolved.jobs)]
    console.print(f"cuda check: compiling {len(targets)} sources of {p.engine.name}")
    t1 = time.monotonic()
    env = {**os.environ, **build_stage.ccache_env(p.patched.path)}
    proc = procs.run(cmd, timeout=TIMEOUT_S, env=env, check=False, what="the CUDA compile check")
    log = proc.stdout + proc.stderr
    (build_dir / "check.log").write_text(log)
    if proc.returncode != 0:
        raise LlamaspecError(
            f"The CUDA compile check of {p.engine.name} failed (log: {build_dir / 'check.log'}). "
            "The first error:",
            details=build_stage.first_error(log),
        )
    seconds = _object_seconds(build_dir, list(targets.values()))
    rows = [
        {"source": k.source, "why": k.why, "seconds": seconds.get(targets[k.source])}
        for k in kernels
    ]
    for r in rows:
        took = f"{r['seconds']:.0f} s" if r["seconds"] is not None else "cached"
        console.print(f"cuda check: {r['source']}: compiled ({took})")
    record = {
        "engine": p.engine.name,
        "commit": p.patched.source.commit,
        "toolkit": p.toolkit.origin if p.toolkit else None,
        "archs": list(p.resolved.archs or ()),
        "configure_seconds": round(configured, 1),
        "compile_seconds": round(time.monotonic() - t1, 1),
        "objects": rows,
    }
    console.print(
        f"cuda check: {p.engine.name} at {p.patched.source.short}: configured in "
        f"{configured:.0f} s, {len(rows)} sources compiled in {record['compile_seconds']:.0f} s"
    )
    return record


def _object_seconds(build_dir: Path, outputs: list[str]) -> dict[str, float]:
    """Each output's compile time from .ninja_log (its last entry), in seconds."""
    times: dict[str, float] = {}
    log = build_dir / ".ninja_log"
    if not log.is_file():
        return times
    for line in log.read_text().splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) >= 4 and parts[3] in outputs:
            times[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return times
