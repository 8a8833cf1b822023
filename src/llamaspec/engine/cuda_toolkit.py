"""The CUDA toolkit a build compiles with: the system's, or one assembled from PyPI's wheels.

`--cuda-toolkit auto` (the default) takes a complete system toolkit (nvcc, CUDA headers,
cudart and cuBLAS); completes a system toolkit that lacks cuBLAS with the pinned cuBLAS
wheel; and where there is no system toolkit assembles one from the pinned CUDA 13 wheels
(`llamaspec.lock`, `cuda_toolkit`: version, sha256 and size of each). Wheels are checked
against the lock before they are unpacked, and a toolkit root is built in a temporary
directory and renamed into place only when complete, so an interrupted download or unpack
is never used. Compiling needs no GPU and no driver; running the binary does.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import config, procs
from llamaspec import lock as lockfile
from llamaspec.engine.profiles import Define
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

Say = Callable[[str], None]
CHOICES = ("auto", "system", "pypi")
SYSTEM_ROOTS = ("/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda")
WHEEL_PREFIX = "nvidia/cu{major}/"
PIP_TIMEOUT_S = 1800
# The oldest driver that runs each CUDA major (NVIDIA's minor-version compatibility rule).
DRIVER_MIN = {11: 450, 12: 525, 13: 580}
# The oldest CUDA each engine's CUDA backend builds with at its default pin (llama.cpp's
# docs/build.md shows CUDA 11.7 as the oldest toolkit it still builds with).
CUDA_MIN = (11, 7)
# Files every toolkit root must have: (what, candidate paths relative to the root).
PIECES: dict[str, tuple[str, ...]] = {
    "nvcc": ("bin/nvcc",),
    "CUDA headers": ("include/cuda_runtime.h", "targets/x86_64-linux/include/cuda_runtime.h"),
    "cudart": ("lib/libcudart.so", "lib64/libcudart.so", "targets/x86_64-linux/lib/libcudart.so"),
    "NVVM (cicc)": ("nvvm/bin/cicc",),
    "cuBLAS headers": ("include/cublas_v2.h", "targets/x86_64-linux/include/cublas_v2.h"),
    "cuBLAS libraries": ("lib/libcublas.so", "lib64/libcublas.so"),
}
# The shared libraries a CUDA llama-server links from the toolkit (bundled into dist/<id>/lib).
RUNTIME_LIBS = re.compile(r"^lib(cudart|cublas|cublasLt)\.so(\.\d+)*$")


class NotAssembled(LlamaspecError):
    """The pinned toolkit is not in the cache yet (and downloading was not allowed)."""


@dataclass(frozen=True)
class Toolkit:
    """A complete toolkit root: what CMake is pointed at."""

    root: Path
    version: tuple[int, ...]
    origin: str  # how it was found or made, for preflight and the manifest
    key: str  # what the artifact id sees instead of this machine's path

    @property
    def nvcc(self) -> Path:
        return self.root / "bin" / "nvcc"

    @property
    def lib_dir(self) -> Path:
        """Where the runtime libraries lie: lib/, lib64/ (a system toolkit's) or targets/."""
        for rel in ("lib", "lib64", f"targets/{machine()}-linux/lib"):
            if _has(self.root, f"{rel}/libcudart.so"):
                return self.root / rel
        return self.root / "lib"

    def link_dirs(self) -> list[Path]:
        """The toolkit's library folders (lib/, lib64/), real paths, each once."""
        out: list[Path] = []
        for d in (self.lib_dir, self.root / "lib", self.root / "lib64"):
            if d.is_dir() and d.resolve() not in out:
                out.append(d.resolve())
        return out

    @property
    def release(self) -> str:
        return ".".join(map(str, self.version[:2]))

    def defines(self) -> list[Define]:
        """CMake defines that make the build use this toolkit (paths keyed by version)."""
        origin = f"llamaspec (CUDA toolkit: {self.origin})"
        out = [
            Define("CMAKE_CUDA_COMPILER", str(self.nvcc), origin, f"nvcc {self.key}"),
            Define("CUDAToolkit_ROOT", str(self.root), origin, f"toolkit {self.key}"),
        ]
        # only $ORIGIN/../lib in the RUNPATH: the bundled CUDA libraries, not the toolkit's
        # absolute path on the build machine
        relocatable = "llamaspec (relocatable dist/: bundled CUDA libraries)"
        out += [
            Define("CMAKE_BUILD_WITH_INSTALL_RPATH", "ON", relocatable),
            Define("CMAKE_INSTALL_RPATH", "$ORIGIN/../lib", relocatable),
        ]
        # with that RUNPATH the linker cannot follow a library's own CUDA dependencies
        # (ik links cuBLAS into libggml.so) to a toolkit outside the system paths
        link = ":".join(str(d) for d in self.link_dirs())
        if link:
            linked = "llamaspec (link against the toolkit's libraries)"
            for name in ("CMAKE_EXE_LINKER_FLAGS", "CMAKE_SHARED_LINKER_FLAGS"):
                out.append(
                    Define(name, f"-Wl,-rpath-link,{link}", linked, f"rpath-link {self.key}")
                )
        if not driver_library(self.root):
            # no libcuda.so to link (wheels ship no driver stub): ggml's CUDA pool then uses
            # cudaMalloc instead of the driver's virtual-memory API
            out.append(Define("GGML_CUDA_NO_VMM", "ON", origin))
        return out


def driver_library(root: Path) -> Path | None:
    """libcuda.so to link against: the toolkit's stub or an installed driver's."""
    for cand in (
        root / "lib" / "stubs" / "libcuda.so",
        root / "lib64" / "stubs" / "libcuda.so",
        Path("/usr/lib/x86_64-linux-gnu/libcuda.so"),
        Path("/usr/lib64/libcuda.so"),
    ):
        if cand.exists():
            return cand
    return None


def pinned(root: Path) -> config.CudaToolkitLock:
    """The lock's wheel set, validated."""
    data = lockfile.load(root).get("cuda_toolkit")
    if not data:
        raise LlamaspecError(
            f"{root / lockfile.LOCK} has no `cuda_toolkit` section, so there are no pinned CUDA "
            "wheels to assemble a toolkit from. Restore it from the llamaspec repository, or "
            "use --cuda-toolkit system or --cuda-toolkit DIR."
        )
    return config.parse(config.CudaToolkitLock, data, f"{lockfile.LOCK} (cuda_toolkit)")


def check_choice(text: str) -> str:
    """`auto`, `system`, `pypi` or a directory (checked when resolved)."""
    value = text.strip()
    if not value:
        raise LlamaspecError(
            "--cuda-toolkit is empty; give auto (default), system, pypi or a toolkit directory."
        )
    return value


# ---------------------------------------------------------------- inspecting a root


def missing(root: Path) -> list[str]:
    """The PIECES a root lacks (empty: complete)."""
    return [what for what, paths in PIECES.items() if not any(_has(root, p) for p in paths)]


def _has(root: Path, rel: str) -> bool:
    path = root / rel
    if path.exists():
        return True
    if not path.name.endswith(".so") or not path.parent.is_dir():
        return False
    return any(path.parent.glob(path.name + ".*"))  # versioned only (libcudart.so.13)


def nvcc_version(nvcc: Path) -> tuple[int, ...]:
    try:
        proc = procs.run([str(nvcc), "--version"], timeout=60, check=False, what="nvcc")
    except LlamaspecError:
        return ()
    m = re.search(r"release (\d+)\.(\d+)", proc.stdout + proc.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else ()


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
        return Toolkit(system, version, f"system, {system}", f"system CUDA {_dotted(version)}")
    lock = pinned(project)
    if choice == "auto" and system is not None:
        version = nvcc_version(system / "bin" / "nvcc")
        major = int(lock.release.split(".")[0])
        gaps = missing(system)
        cublas_only = set(gaps) <= {"cuBLAS headers", "cuBLAS libraries"}
        if version and version[0] == major and cublas_only:
            return _assemble(lock, system, version, say, download)
        say(
            f"cuda toolkit: the system toolkit at {system} (CUDA {_dotted(version) or '?'}) "
            f"lacks {', '.join(gaps)}; using the pinned CUDA {lock.release} wheels instead"
        )
    return _assemble(lock, None, None, say, download)


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
    return Toolkit(root.resolve(), version, f"directory {root}", f"CUDA {_dotted(version)} (dir)")


def _dotted(v: Sequence[int] | None) -> str:
    return ".".join(map(str, v or ()))


def _pkg(version: tuple[int, ...]) -> str:
    return f"{version[0]}-{version[1]}" if len(version) >= 2 else "X-Y"


def machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


# The oldest SM each CUDA major compiles for (`nvcc --list-gpu-arch`: CUDA 13 starts at 75).
SM_FLOOR = {11: 35, 12: 50, 13: 75}


def check_archs_before_download(choice: str, archs: tuple[str, ...] | None, project: Path) -> None:
    """Refuse an arch request no download can satisfy, before anything is downloaded."""
    from llamaspec.engine import backends

    if archs is None or archs == ("native",):
        if gpu_names():
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
    release = pinned(project).release
    major = int(release.split(".")[0])
    low = [n for n in backends.sm_numbers(archs) if n < SM_FLOOR.get(major, 0)]
    if low:
        raise LlamaspecError(
            f"--cuda-arch {';'.join(archs)}: CUDA {release} (the pinned PyPI toolkit) cannot "
            f"compile for {', '.join(f'sm_{n}' for n in low)}; it targets sm_"
            f"{SM_FLOOR[major]} and newer. For older GPUs use a system CUDA 12 toolkit "
            "(--cuda-toolkit system or DIR), or drop those architectures. Nothing was downloaded."
        )


def gpu_names() -> list[str]:
    """`name, compute capability` of each visible NVIDIA GPU (empty without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        proc = procs.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            timeout=30,
            check=False,
            what="nvidia-smi",
        )
    except LlamaspecError:
        return []
    if proc.returncode != 0:
        return []
    return [ln.strip() for ln in proc.stdout.splitlines() if "," in ln]


# ---------------------------------------------------------------- wheels → a root


def _wheels(
    lock: config.CudaToolkitLock, completing: bool
) -> list[tuple[str, config.CudaWheelFile]]:
    arch = machine()
    chosen = [w for w in lock.wheels if not completing or w.name == "nvidia-cublas"]
    missing_arch = [w.name for w in chosen if arch not in w.files]
    if missing_arch:
        raise LlamaspecError(
            f"llamaspec.lock pins no {arch} wheel for {', '.join(missing_arch)} (CUDA "
            f"{lock.release}); only {', '.join(sorted({a for w in lock.wheels for a in w.files}))}"
            ". "
            "Use a system CUDA toolkit (--cuda-toolkit system, or DIR)."
        )
    return [(f"{w.name}=={w.version}", w.files[arch]) for w in chosen]


def root_name(lock: config.CudaToolkitLock, system: Path | None) -> str:
    wheels = _wheels(lock, system is not None)
    h = hashlib.sha256(json.dumps([w[1].sha256 for w in wheels] + [str(system)]).encode())
    kind = "system-cublas" if system else "pypi"
    return f"{kind}-{lock.release}-{h.hexdigest()[:12]}"


def _assemble(
    lock: config.CudaToolkitLock,
    system: Path | None,
    system_version: tuple[int, ...] | None,
    say: Say,
    download: bool,
) -> Toolkit:
    wheels = _wheels(lock, system is not None)
    names = ", ".join(n for n, _ in wheels)
    base = cache_dir() / "cuda-toolkit"
    target = base / root_name(lock, system)
    if system is not None:
        origin = f"system {system} completed with {names} from PyPI"
        key = f"CUDA {_dotted(system_version)} + {names}"
    else:
        origin = f"PyPI wheels {names}"
        key = f"PyPI {names}"
    if (target / ".complete").is_file() and not missing(target):
        version = system_version or nvcc_version(target / "bin" / "nvcc")
        return Toolkit(target, version, f"{origin} (in {target})", key)
    if not download:
        size = sum(f.size for _, f in wheels) / 1e6
        raise NotAssembled(
            f"{origin}: not assembled yet; a build downloads {names} "
            f"({size:.0f} MB) from PyPI into {target}."
        )
    _check_disk(base, wheels)
    files = [_fetch(name, f, say) for name, f in wheels]
    say(f"cuda toolkit: assembling {target.name} from {len(files)} wheel(s)")
    work = base / f".tmp-{target.name}-{os.getpid()}"
    _clean_stale(base)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        major = lock.release.split(".")[0]
        for path in files:
            _unzip(path, WHEEL_PREFIX.format(major=major), work)
        if system is not None:
            _link_tree(system, work)
        _finish_links(work)
        gaps = missing(work)
        if gaps:
            raise LlamaspecError(
                f"The assembled CUDA toolkit lacks {', '.join(gaps)}: the pinned wheels "
                f"({names}) do not make a whole toolkit. llamaspec.lock's cuda_toolkit section "
                "is wrong; restore it from the llamaspec repository."
            )
        (work / ".complete").write_text(
            json.dumps({"wheels": [n for n, _ in wheels], "system": str(system or "")}) + "\n"
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    version = system_version or nvcc_version(target / "bin" / "nvcc")
    say(f"cuda toolkit: CUDA {_dotted(version)} ready at {target}")
    return Toolkit(target, version, f"{origin} (in {target})", key)


def _check_disk(base: Path, wheels: list[tuple[str, config.CudaWheelFile]]) -> None:
    """Refuse before downloading when the wheels and their unpacked files would not fit."""
    store = base.parent / "cuda-wheels"
    need = sum(f.unpacked for _, f in wheels)
    need += sum(f.size for _, f in wheels if not (store / f.file).is_file())
    free = shutil.disk_usage(base.parent).free
    if free < need * 1.1:
        raise LlamaspecError(
            f"Not enough disk for the CUDA toolkit: the wheels need {need / 1e9:.2f} GB "
            f"(download and unpacked) in {base.parent}, and {free / 1e9:.2f} GB is free. Free "
            "some space or set LLAMASPEC_CACHE to a larger disk; nothing was downloaded."
        )


def _fetch(name: str, wheel: config.CudaWheelFile, say: Say) -> Path:
    """The wheel file from the cache, or pip-downloaded into it and checked against the lock."""
    store = cache_dir() / "cuda-wheels"
    store.mkdir(parents=True, exist_ok=True)
    final = store / wheel.file
    if final.is_file():
        if _sha256(final) == wheel.sha256:
            return final
        final.unlink()
    say(f"cuda toolkit: downloading {name} ({wheel.size / 1e6:.0f} MB) from PyPI")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=store, prefix=f".tmp-dl-{os.getpid()}-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary", ":all:", "--dest", tmp, *_platform_args(wheel.file), name,
        ]  # fmt: skip
        proc = procs.run(cmd, timeout=PIP_TIMEOUT_S, check=False, what="pip download")
        got = Path(tmp) / wheel.file
        if proc.returncode != 0 or not got.is_file():
            last = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise LlamaspecError(
                f"Could not download {name} ({wheel.file}) from PyPI: {last or 'no such file'}. "
                "Check that PyPI (or your pip index) is reachable and run again; a download "
                "that stopped half-way is not used. Or use --cuda-toolkit system / DIR."
            )
        digest = _sha256(got)
        if digest != wheel.sha256:
            raise LlamaspecError(
                f"{wheel.file} from PyPI has sha256 {digest}, but llamaspec.lock pins "
                f"{wheel.sha256}. The file was deleted and nothing was unpacked: either the "
                "index served another file (a mirror or a re-upload) or the lock is wrong."
            )
        os.replace(got, final)
    say(f"cuda toolkit: {name} downloaded in {time.monotonic() - t0:.0f} s")
    return final


def _platform_args(filename: str) -> list[str]:
    """pip's --platform/--python-version for a wheel file name's platform tags."""
    tags = filename.removesuffix(".whl").split("-")[-1].split(".")
    out = []
    for tag in tags:
        out += ["--platform", tag]
    return [*out, "--python-version", f"{sys.version_info[0]}.{sys.version_info[1]}"]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _unzip(wheel: Path, prefix: str, dest: Path) -> None:
    """The wheel's files under `prefix` into `dest`, with their permission bits."""
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not info.filename.startswith(prefix) or info.is_dir():
                    continue
                rel = info.filename[len(prefix) :]
                if not rel or rel.startswith(".metadata/") or ".." in Path(rel).parts:
                    continue
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    out.chmod(mode | stat.S_IRUSR | stat.S_IWUSR)
    except zipfile.BadZipFile as exc:
        wheel.unlink(missing_ok=True)
        raise LlamaspecError(
            f"{wheel.name} is not a readable wheel ({exc}); it was deleted. Run again to "
            "download it anew."
        ) from None


def _link_tree(system: Path, dest: Path) -> None:
    """Every file of the system toolkit, linked into `dest` where the wheels put none."""
    for dirpath, dirnames, filenames in os.walk(system):
        here = Path(dirpath)
        rel = here.relative_to(system)
        if rel.parts and rel.parts[0] in ("dist-info",):
            dirnames[:] = []
            continue
        for name in [*filenames, *(d for d in dirnames if (here / d).is_symlink())]:
            src = here / name
            out = dest / rel / name
            if out.exists() or out.is_symlink():
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink() and not os.path.isabs(os.readlink(src)):
                out.symlink_to(os.readlink(src))  # keep relative links relative (lib64 → lib)
            else:
                out.symlink_to(src)
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]


def _finish_links(root: Path) -> None:
    """The layout CMake and nvcc expect: lib64, targets/<arch>-linux, unversioned .so links."""
    (root / "lib").mkdir(exist_ok=True)
    if not (root / "lib64").exists() and not (root / "lib64").is_symlink():
        (root / "lib64").symlink_to("lib")
    target = root / "targets" / f"{machine()}-linux"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("include", "lib"):
        if not (target / name).exists() and not (target / name).is_symlink():
            (target / name).symlink_to(Path("..") / ".." / name)
    for lib in sorted((root / "lib").glob("lib*.so.*")):
        plain = lib.with_name(lib.name.split(".so", 1)[0] + ".so")
        if not plain.exists() and not plain.is_symlink():
            plain.symlink_to(lib.name)


def _clean_stale(parent: Path) -> None:
    """Remove assembly directories of runs that were killed (`.tmp-<name>-<pid>`)."""
    for entry in parent.glob(".tmp-*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
            except PermissionError:
                pass


# ---------------------------------------------------------------- the driver


def driver_version() -> str | None:
    """The NVIDIA driver's version where nvidia-smi answers, else None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        proc = procs.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            timeout=30,
            check=False,
            what="nvidia-smi",
        )
    except LlamaspecError:
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    return lines[0] if proc.returncode == 0 and lines else None


def driver_ok(driver: str, cuda_major: int) -> bool:
    m = re.match(r"(\d+)", driver)
    return bool(m) and int(m.group(1)) >= DRIVER_MIN.get(cuda_major, 0)


# ---------------------------------------------------------------- bundling


def runtime_libraries(binaries: Sequence[Path], toolkit_lib: Path) -> list[Path]:
    """The toolkit's shared libraries the binaries need (DT_NEEDED, transitively)."""
    wanted: dict[str, Path] = {}
    queue = list(binaries)
    seen: set[Path] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in needed(path):
            src = toolkit_lib / name
            if RUNTIME_LIBS.match(name) and src.exists() and name not in wanted:
                wanted[name] = src
                queue.append(src.resolve())
    return list(wanted.values())


def needed(path: Path) -> list[str]:
    """An ELF file's DT_NEEDED entries (readelf -d)."""
    readelf = shutil.which("readelf")
    if not readelf:
        raise LlamaspecError(
            "readelf is not installed; llamaspec reads the CUDA libraries a binary needs with "
            "it. Install binutils (Debian/Ubuntu: `apt-get install binutils`)."
        )
    proc = procs.run([readelf, "-d", str(path)], timeout=60, check=False, what="readelf")
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", proc.stdout)


def unresolved(directory: Path) -> dict[str, list[str]]:
    """Per ELF file under bin/ and lib/: libraries `ldd` cannot find, or finds outside
    `directory` although they are bundled CUDA libraries (libcuda.so.1, the driver's, aside)."""
    ldd = shutil.which("ldd")
    if not ldd:
        raise LlamaspecError(
            "ldd is not installed (it comes with glibc: `apt-get install libc-bin`)."
        )
    problems: dict[str, list[str]] = {}
    root = str(directory.resolve())
    for path in sorted([*directory.glob("bin/*"), *directory.glob("lib/*.so*")]):
        if path.is_symlink() or not path.is_file() or not _is_elf(path):
            continue
        proc = procs.run([ldd, str(path)], timeout=60, check=False, what="ldd")
        bad = []
        for line in proc.stdout.splitlines():
            m = re.match(r"\s*(\S+) => (.*?)(?: \(0x[0-9a-f]+\))?$", line)
            if not m or m.group(1).startswith("libcuda.so"):
                continue
            name, where = m.group(1), m.group(2).strip()
            if where == "not found":
                bad.append(f"{name} not found")
            elif RUNTIME_LIBS.match(name) and not os.path.realpath(where).startswith(root):
                bad.append(f"{name} from {where}, outside the artifact")
        if bad:
            problems[str(path.relative_to(directory))] = bad
    return problems


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"
