"""--cuda-toolkit: the choice (auto, system, pypi or a directory) resolved to a Toolkit.

`--cuda-toolkit auto` (the default) takes a complete system toolkit (nvcc, CUDA headers,
cudart and cuBLAS); completes a system toolkit that lacks cuBLAS with the pinned cuBLAS
wheel; and where there is no system toolkit assembles one from the pinned CUDA 13 wheels
(assemble.py). Compiling needs no GPU and no driver; running the binary does.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from llamaspec import procs
from llamaspec.engine.cuda import assemble, host
from llamaspec.engine.cuda.toolkit import PIECES, Toolkit, dotted, missing, nvcc_version
from llamaspec.errors import LlamaspecError

Say = Callable[[str], None]
CHOICES = ("auto", "system", "pypi")
SYSTEM_ROOTS = ("/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda")


def check_choice(text: str) -> str:
    """`auto`, `system`, `pypi` or a directory (checked when resolved)."""
    value = text.strip()
    if not value:
        raise LlamaspecError(
            "--cuda-toolkit is empty; give auto (default), system, pypi or a toolkit directory."
        )
    return value


def system_root() -> Path | None:
    """The system toolkit: CUDACXX's, nvcc on PATH's, or a standard prefix's."""
    cands = [os.environ.get("CUDACXX"), shutil.which("nvcc")]
    cands += [f"{r}/bin/nvcc" for r in SYSTEM_ROOTS]
    for cand in cands:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            root = Path(cand).resolve().parent.parent
            if (root / "bin" / "nvcc.profile").is_file():
                return root
            top = _top(Path(cand))  # a wrapper script (e.g. /usr/local/bin/nvcc): ask nvcc
            if top is not None:
                return top
    return None


def _top(nvcc: Path) -> Path | None:
    """The toolkit root nvcc itself reports (`nvcc --dryrun` prints `#$ TOP=...`)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = procs.run(
                [str(nvcc), "--dryrun", "-c", f"{tmp}/x.cu", "-o", f"{tmp}/x.o"],
                timeout=60,
                check=False,
                what="nvcc --dryrun",
            )
        except LlamaspecError:
            return None
    m = re.search(r"^#\$ TOP=(.*)$", proc.stdout + proc.stderr, re.M)
    top = Path(os.path.normpath(m.group(1).strip())) if m else None
    return top.resolve() if top and (top / "bin" / "nvcc").is_file() else None


# ---------------------------------------------------------------- resolving a choice


def resolve(choice: str, project: Path, say: Say, download: bool = True) -> Toolkit:
    """The toolkit for `--cuda-toolkit choice`; `download=False` only looks (doctor)."""
    choice = check_choice(choice)
    if choice not in CHOICES:
        return _from_dir(Path(choice).expanduser())
    system = system_root()
    if choice == "system" or (choice == "auto" and system and not missing(system)):
        if system is None:
            raise LlamaspecError(
                "--cuda-toolkit system: no CUDA toolkit is installed (no nvcc on PATH, in "
                f"CUDACXX or under {', '.join(SYSTEM_ROOTS)}). Install one, or use "
                "--cuda-toolkit pypi (the pinned CUDA wheels from PyPI, assembled in the cache)."
            )
        gaps = missing(system)
        if gaps:
            raise LlamaspecError(
                f"--cuda-toolkit system: the toolkit at {system} lacks {', '.join(gaps)}. Use "
                "--cuda-toolkit auto (completes it from the pinned PyPI wheels) or install the "
                "missing packages (NVIDIA's apt repository: `apt-get install "
                f"libcublas-dev-{_pkg(nvcc_version(system / 'bin' / 'nvcc'))}`)."
            )
        version = nvcc_version(system / "bin" / "nvcc")
        return Toolkit(system, version, f"system, {system}", f"system CUDA {dotted(version)}")
    lock = assemble.pinned(project)
    if choice == "auto" and system is not None:
        version = nvcc_version(system / "bin" / "nvcc")
        major = int(lock.release.split(".")[0])
        gaps = missing(system)
        cublas_only = set(gaps) <= {"cuBLAS headers", "cuBLAS libraries"}
        if version and version[0] == major and cublas_only:
            return assemble.assemble(lock, system, version, say, download)
        say(
            f"cuda toolkit: the system toolkit at {system} (CUDA {dotted(version) or '?'}) "
            f"lacks {', '.join(gaps)}; using the pinned CUDA {lock.release} wheels instead"
        )
    return assemble.assemble(lock, None, None, say, download)


def _from_dir(root: Path) -> Toolkit:
    if not root.is_dir():
        raise LlamaspecError(
            f"--cuda-toolkit {root}: no such directory. Give the root of a CUDA toolkit (the "
            "directory holding bin/nvcc, include/ and lib/ or lib64/), or auto, system or pypi."
        )
    gaps = missing(root)
    if gaps:
        raise LlamaspecError(
            f"--cuda-toolkit {root} is not a complete CUDA toolkit: it lacks "
            f"{', '.join(gaps)} (looked for {', '.join(p for g in gaps for p in PIECES[g])}). "
            "Point it at a toolkit root that has them, or use --cuda-toolkit auto, which "
            "completes a toolkit that lacks only cuBLAS from the pinned PyPI wheel."
        )
    version = nvcc_version(root / "bin" / "nvcc")
    if not version:
        raise LlamaspecError(
            f"--cuda-toolkit {root}: {root / 'bin' / 'nvcc'} --version names no CUDA release "
            "(not a working nvcc?). Check that it runs, or point at another toolkit."
        )
    return Toolkit(root.resolve(), version, f"directory {root}", f"CUDA {dotted(version)} (dir)")


def _pkg(version: tuple[int, ...]) -> str:
    return f"{version[0]}-{version[1]}" if len(version) >= 2 else "X-Y"


# The oldest SM each CUDA major compiles for (`nvcc --list-gpu-arch`: CUDA 13 starts at 75).
SM_FLOOR = {11: 35, 12: 50, 13: 75}


def check_archs_before_download(choice: str, archs: tuple[str, ...] | None, project: Path) -> None:
    """Refuse an arch request no download can satisfy, before anything is downloaded."""
    from llamaspec.engine import backends

    if archs is None or archs == ("native",):
        if host.gpu_names():
            return
        asked = "--cuda-arch native" if archs else "no --cuda-arch"
        raise LlamaspecError(
            f"{asked}, and no NVIDIA GPU is visible here to detect the architecture from "
            "(compiling needs no GPU, but then the build must be told what to compile for). "
            "Give the SM numbers of the GPUs it will run on, e.g. --cuda-arch 90 (H100), "
            "--cuda-arch 89 (RTX 40xx/L4), --cuda-arch 86 (RTX 30xx/A10) or '80;86;89;90'."
        )
    system = system_root()
    if choice not in ("auto", "pypi") or (choice == "auto" and system and not missing(system)):
        return  # the toolkit's own nvcc is asked later, in preflight
    release = assemble.pinned(project).release
    major = int(release.split(".")[0])
    low = [n for n in backends.sm_numbers(archs) if n < SM_FLOOR.get(major, 0)]
    if low:
        raise LlamaspecError(
            f"--cuda-arch {';'.join(archs)}: CUDA {release} (the pinned PyPI toolkit) cannot "
            f"compile for {', '.join(f'sm_{n}' for n in low)}; it targets sm_"
            f"{SM_FLOOR[major]} and newer. For older GPUs use a system CUDA 12 toolkit "
            "(--cuda-toolkit system or DIR), or drop those architectures. Nothing was downloaded."
        )
