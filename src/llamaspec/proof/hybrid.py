"""A small random-weight hybrid (recurrent + attention) model for the checkpoint path.

Upstream's `test-llama-archs` tool, built from the artifact's own source tree, writes
tiny GGUFs of any architecture; `-a '^qwen35$'` gives a Qwen3.5-style hybrid of a few MB.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from llamaspec import procs
from llamaspec.engine import build as build_stage
from llamaspec.engine import profiles as flags
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact
from llamaspec.engine.toolchain import detect
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

TOOL = "test-llama-archs"


def hybrid_model(artifact: Artifact, console: Console, arch: str = "qwen35", seed: int = 1) -> Path:
    """Build the tool next to the artifact's build (CPU backend only; ccache makes it cheap)
    and write the model.

    ik_llama.cpp cannot load the tool's models: it gets the `gguf`-written equivalent."""
    if artifact.manifest.get("engine") == "ik_llama.cpp" and arch == "qwen35":
        from llamaspec.proof.hybrid_gguf import hybrid_gguf

        return hybrid_gguf(seed, console.print)
    out_dir = cache_dir() / "models" / f"{artifact.id}-{arch}-seed{seed}"
    found = sorted(out_dir.glob("*.gguf"))
    if found:
        return found[0]
    if artifact.manifest.get("engine") != "llama.cpp":
        raise LlamaspecError(
            f"The random hybrid model needs upstream llama.cpp's {TOOL}; artifact {artifact.id} "
            f"is {artifact.manifest.get('engine')}."
        )
    tools_dir = cache_dir() / "build" / f"{artifact.id}-tools"
    _build_tool(artifact, tools_dir, console)  # a no-op for ninja when nothing changed
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = procs.run(
        [str(tools_dir / "bin" / TOOL), "-a", f"^{arch}$", "-s", str(seed), "-o", str(out_dir)],
        timeout=600,
        check=False,
        what=TOOL,
    )
    found = sorted(out_dir.glob("*.gguf"))
    if proc.returncode != 0 or not found:
        raise LlamaspecError(
            f"{TOOL} did not write a {arch} model (exit {proc.returncode}).",
            details="\n".join((proc.stdout + proc.stderr).splitlines()[-20:]),
        )
    console.print(f"hybrid: wrote {found[0]} ({found[0].stat().st_size / 1e6:.1f} MB, seed {seed})")
    return found[0]


# the GPU backends a build may enable; the tool needs none of them to write its model
GPU_BACKENDS = ("GGML_CUDA", "GGML_VULKAN", "GGML_HIP", "GGML_METAL", "GGML_SYCL", "GGML_MUSA")


def tool_defines(defines: list[flags.Define]) -> list[flags.Define]:
    """The artifact's defines, changed for the tool: tests on, the CPU backend alone."""
    on = {d.name for d in defines if flags.cmake_bool(d.value)}
    # the tool runs from its build tree: it needs CMake's build-tree RPATH, not the
    # relocatable $ORIGIN/../lib a CUDA artifact installs with
    own = {"LLAMA_BUILD_TESTS": "ON", "CMAKE_BUILD_WITH_INSTALL_RPATH": "OFF"}
    # it loads no backend modules (GGML_BACKEND_DL, as in the portable variant): it needs
    # the CPU backend linked in to make its model
    if "GGML_BACKEND_DL" in on:
        own |= {"GGML_BACKEND_DL": "OFF", "GGML_CPU_ALL_VARIANTS": "OFF", "GGML_NATIVE": "OFF"}
    # the weights it writes do not depend on the backend: a GPU backend would only compile
    # every kernel a second time (ggml-cuda: 6 minutes on 16 cores, hours on 2)
    own |= {name: "OFF" for name in GPU_BACKENDS if name in on}
    kept = [d for d in defines if d.name not in own]
    return kept + [flags.Define(k, v, f"llamaspec ({TOOL})") for k, v in own.items()]


def _build_tool(artifact: Artifact, tools_dir: Path, console: Console) -> None:
    """Configure the artifact's own tree with tests on, and build only the tool."""
    cache_file = cache_dir() / "build" / artifact.id / "CMakeCache.txt"
    if not cache_file.is_file():
        raise LlamaspecError(
            f"The build tree of {artifact.id} is not in this machine's cache ({cache_file}); "
            "rebuild the artifact here first (`llamaspec build`)."
        )
    tree = Path(build_stage.read_cmake_cache(cache_file)["CMAKE_HOME_DIRECTORY"])
    # the recorded prefix maps name <source> and <build>: made again for this directory, so
    # the compile commands match the artifact's own and ccache serves its objects
    defines = tool_defines(repro.without_maps(artifact.manifest["defines"]))
    tools_dir = build_stage.build_dir_for(tree, tools_dir.name)
    maps = repro.path_maps(tree, tools_dir, bool(build_stage.ccache_env(tree)))
    defines = repro.with_flags(defines, repro.flag_defines(defines, maps, os.environ))
    tc = detect()
    console.print(f"hybrid: building {TOOL} from {tree}")
    build_stage.configure(tree, tools_dir, defines, tc, console)
    build_stage.compile_target(tools_dir, TOOL, tc, None, console, build_stage.ccache_env(tree))
