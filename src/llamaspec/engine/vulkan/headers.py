"""Newer Vulkan headers in a private prefix, for distributions whose own are too old.

Debian 12 ships Vulkan headers 1.3.239; upstream llama.cpp needs newer ones. The Debian 13
packages `libvulkan-dev` and `spirv-headers` are downloaded from a Debian mirror, checked
against pinned sha256 digests and unpacked with `dpkg -x` into the llamaspec cache; the
system's own loader library and glslc are still used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from llamaspec import env, procs
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

MIRROR = "http://deb.debian.org/debian"
RELEASE = "1.4.309.0-1"  # Debian 13 (trixie)


@dataclass(frozen=True)
class Deb:
    package: str
    pool_path: str
    sha256: str


# Pinned from trixie's main/binary-amd64 Packages index (sha256 of each .deb).
DEBS: dict[str, tuple[Deb, ...]] = {
    "amd64": (
        Deb(
            "libvulkan-dev",
            "pool/main/v/vulkan-loader/libvulkan-dev_1.4.309.0-1_amd64.deb",
            "8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a",
        ),
        Deb(
            "spirv-headers",
            "pool/main/s/spirv-headers/spirv-headers_1.6.1+1.4.309.0-1_all.deb",
            "dc18db866d63680351c40ac6b6bece34cb52da64a7799ce1cc4f16f6bff4d064",
        ),
    )
}


@dataclass(frozen=True)
class HeaderPrefix:
    root: Path
    release: str

    @property
    def include_dir(self) -> Path:
        return self.root / "usr" / "include"

    @property
    def spirv_dir(self) -> Path:
        return self.root / "usr" / "share" / "cmake" / "SPIRV-Headers"

    @property
    def complete(self) -> bool:
        """Unpacked, and every file still as unpacked (checked on each use)."""
        marker = self.root / ".complete"
        if not (marker.is_file() and (self.include_dir / "vulkan" / "vulkan_core.h").is_file()):
            return False
        recorded = [
            ln.split()[1] for ln in marker.read_text().splitlines() if ln.startswith("tree ")
        ]
        return not recorded or recorded[0] == tree_digest(self.root)


def tree_digest(root: Path) -> str:
    """sha256 over every file's relative path and content (links by target), `.complete` aside."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.name != ".complete"):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            h.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            h.update(f"F {rel} {path.stat().st_size}\n".encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def mark_complete(root: Path, debs: tuple[Deb, ...]) -> None:
    """Record what was unpacked into `root` and the digest of the result."""
    lines = "".join(f"{d.package} {d.pool_path} {d.sha256}\n" for d in debs)
    (root / ".complete").write_text(lines + f"tree {tree_digest(root)}\n")


def prefix() -> HeaderPrefix:
    """Where the private headers live (present or not)."""
    return HeaderPrefix(cache_dir() / "vulkan-headers" / RELEASE, RELEASE)


def _arch() -> str:
    dpkg = shutil.which("dpkg")
    if not dpkg:
        return ""
    return procs.run(
        [dpkg, "--print-architecture"], timeout=60, check=False, what="dpkg"
    ).stdout.strip()


def install(say: Callable[[str], None] = print, mirror: str | None = None) -> HeaderPrefix:
    """Download, verify and unpack the pinned packages (a no-op when already there)."""
    target = prefix()
    if target.complete:
        say(f"vulkan headers: {RELEASE} already in {target.root}")
        return target
    if not shutil.which("dpkg"):
        raise LlamaspecError(
            "Unpacking the newer Vulkan headers needs `dpkg` (Debian/Ubuntu). On other systems "
            "install Vulkan headers that declare VK_EXT_layer_settings yourself and pass "
            "--define Vulkan_INCLUDE_DIR=PATH --define SPIRV-Headers_DIR=PATH."
        )
    arch = _arch()
    if arch not in DEBS:
        raise LlamaspecError(
            f"No pinned Vulkan header packages for architecture {arch!r} (only "
            f"{', '.join(DEBS)}). Install newer Vulkan headers yourself and pass "
            "--define Vulkan_INCLUDE_DIR=PATH --define SPIRV-Headers_DIR=PATH."
        )
    base = (mirror or env.get(env.DEBIAN_MIRROR) or MIRROR).rstrip("/")
    work = target.root.with_name(f".tmp-{RELEASE}-{os.getpid()}")
    work.parent.mkdir(parents=True, exist_ok=True)
    procs.remove_stale(work.parent, f".tmp-{RELEASE}-*")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        for deb in DEBS[arch]:
            url = f"{base}/{deb.pool_path}"
            say(f"vulkan headers: fetching {url}")
            path = work / Path(deb.pool_path).name
            _download(url, path, deb.sha256)
            procs.run(
                ["dpkg", "-x", str(path), str(work)], timeout=600, what=f"`dpkg -x {path.name}`"
            )
            path.unlink()
        mark_complete(work, DEBS[arch])
        if target.root.exists():
            shutil.rmtree(target.root)
        os.replace(work, target.root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"vulkan headers: {RELEASE} unpacked into {target.root}")
    return target


def _download(url: str, dest: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    try:
        with httpx.stream("GET", url, timeout=60, follow_redirects=True) as r:
            if r.status_code != 200:
                raise LlamaspecError(
                    f"{url} answered HTTP {r.status_code}. The pinned package may have left the "
                    "mirror; set LLAMASPEC_DEBIAN_MIRROR to another Debian mirror."
                )
            with dest.open("wb") as out:
                for chunk in r.iter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
    except httpx.HTTPError as exc:
        raise LlamaspecError(f"Could not download {url}: {exc}.") from None
    if digest.hexdigest() != sha256:
        raise LlamaspecError(
            f"{url} has sha256 {digest.hexdigest()}, expected the pinned {sha256}; "
            "nothing was unpacked."
        )
