"""Inside the image's build stage: `llamaspec build`, then the runtime tree in /opt/llamaspec.

The runtime tree is the artifact (bin/, lib/, manifest.json, unchanged) plus the shared
libraries it needs from the build image's distribution that a slim base lacks (OpenSSL,
libgomp, …), and labels.txt, the labels the runtime stage must carry.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from llamaspec import procs
from llamaspec.engine import profiles as flags
from llamaspec.engine.artifact import Artifact
from llamaspec.engine.pipeline import BuildSpec, run_build
from llamaspec.errors import LlamaspecError
from llamaspec.images import specs as images
from llamaspec.paths import cache_dir

# Provided by every base image (glibc and the C++ runtime), or by the backend's base
# image and the host's driver (CUDA, Vulkan loader): never copied into the image.
BASE_LIBS = re.compile(
    r"^(linux-vdso|ld-linux(-[\w-]+)?|libc|libm|libdl|libpthread|librt|libresolv|libutil"
    r"|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnvrtc|libvulkan)\.so"
    r"|^libnvidia-"
)
_LDD = re.compile(r"^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)")


def ldd_libs(binary: Path) -> dict[str, Path]:
    """soname → resolved path of every shared library `binary` loads (ldd)."""
    proc = procs.run(["ldd", str(binary)], timeout=60, check=False, what="ldd")
    missing = [ln.strip() for ln in proc.stdout.splitlines() if "not found" in ln]
    if proc.returncode != 0 or missing:
        raise LlamaspecError(
            f"{binary} cannot be loaded here (ldd): {'; '.join(missing) or proc.stderr.strip()}"
        )
    return {
        m.group(1): Path(m.group(2)) for ln in proc.stdout.splitlines() if (m := _LDD.match(ln))
    }


def system_libs(artifact: Path) -> dict[str, Path]:
    """Libraries of the artifact's binaries that come from the system, minus the base set."""
    found: dict[str, Path] = {}
    own = artifact / "lib"
    for binary in sorted((artifact / "bin").iterdir()):
        for name, path in ldd_libs(binary).items():
            if path.resolve().parent != own.resolve() and not BASE_LIBS.match(name):
                found.setdefault(name, path)
    return found


def cpu_needs_txt(manifest: dict, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """cpu-needs.txt for the entrypoint: the CPU flags the build needs, then why. A
    GGML_NATIVE=ON build needs what the machine that builds the image has."""
    engine = manifest["engine"]
    needs = flags.cpu_needs(engine, manifest.get("defines", []))
    if needs is None:
        text = cpuinfo.read_text() if cpuinfo.is_file() else ""
        needs, why = flags.host_cpu_flags(text), "GGML_NATIVE=ON: built for the image builder's CPU"
    elif needs:
        why = f"{engine} compiled for a fixed instruction-set baseline (GGML_NATIVE=OFF)"
    else:
        why = "CPU code chosen at run time"
    return f"{' '.join(needs)}\n{why}\n"


def stage_runtime(artifact: Artifact, out: Path, console: Console) -> list[str]:
    """Copy the artifact and the system libraries it needs into `out`; write labels.txt."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(artifact.path, out, symlinks=True, ignore=shutil.ignore_patterns("logs"))
    extra = system_libs(artifact.path)
    for name, path in sorted(extra.items()):
        shutil.copy2(path.resolve(), out / "lib" / name)
    (out / "runtime-libs.txt").write_text("".join(f"{n}\n" for n in sorted(extra)))
    (out / "labels.txt").write_text(images.labels_txt(artifact.manifest))
    (out / "cpu-needs.txt").write_text(cpu_needs_txt(artifact.manifest))
    console.print(
        f"stage: {artifact.id} → {out} (+ system libraries: {', '.join(sorted(extra)) or 'none'})"
    )
    return sorted(extra)


def build_stage(
    engine: str,
    pin: str,
    backend: str,
    patches: str,
    variants: str,
    defines: str,
    jobs: str,
    out: Path,
    console: Console,
) -> Artifact:
    """The image's build stage: build without smoke, stage, drop the source and build trees."""
    include, exclude, no_defaults = images.parse_patches(patches)
    dist = Path(tempfile.mkdtemp(prefix="llamaspec-dist-"))
    artifact = run_build(
        BuildSpec(
            engine=engine,
            pin=pin or None,
            backend=backend,
            patch=tuple(include),
            no_patch=tuple(exclude),
            no_default_patches=no_defaults,
            variants=tuple(images.split_list(variants)),
            defines=tuple(defines.split()),
            jobs=int(jobs) if jobs else None,
            dist=dist,
        ),
        console,
    )
    stage_runtime(artifact, out, console)
    # the image layer keeps only the runtime tree (ccache and downloads may be mounted in)
    for sub in ("build", "sources", "work"):
        shutil.rmtree(cache_dir() / sub, ignore_errors=True)
    shutil.rmtree(dist, ignore_errors=True)
    return artifact
