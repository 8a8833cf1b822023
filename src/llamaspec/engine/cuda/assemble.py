"""A CUDA toolkit root assembled from the pinned PyPI wheels, in the llamaspec cache.

The wheels are pinned in `llamaspec.lock` (`cuda_toolkit`: version, sha256 and size of
each) and checked against it before they are unpacked; a root is built in a temporary
directory and renamed into place only when complete, so an interrupted download or unpack
is never used. A system toolkit that lacks only cuBLAS is completed the same way, with the
pinned cuBLAS wheel linked over the system's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from llamaspec import config, procs
from llamaspec import lock as lockfile
from llamaspec.engine.cuda.toolkit import Toolkit, dotted, machine, missing, nvcc_version
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

Say = Callable[[str], None]
WHEEL_PREFIX = "nvidia/cu{major}/"
PIP_TIMEOUT_S = 1800


class NotAssembled(LlamaspecError):
    """The pinned toolkit is not in the cache yet (and downloading was not allowed)."""


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


def assemble(
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
        key = f"CUDA {dotted(system_version)} + {names}"
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
    procs.remove_stale(base, ".tmp-*")
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
    say(f"cuda toolkit: CUDA {dotted(version)} ready at {target}")
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
