"""A Debian base image without a registry: debootstrap `minbase`, imported with buildah
(`llamaspec docker base`), under the name the Dockerfiles use as their default base."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from llamaspec import env
from llamaspec.errors import LlamaspecError
from llamaspec.images import specs
from llamaspec.images.tools import Buildah, attempt, call

DEBOOTSTRAP_S = 1800  # a minbase root from a Debian mirror (45 s here)
TAR_S = 600
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise LlamaspecError(
            f"`llamaspec docker base` needs {tool}, which is not installed; "
            f"`apt-get install {tool}` (it also needs root, or `buildah unshare`)."
        )
    return found


def make_base_image(suite: str, tag: str, console: Console, mirror: str | None = None) -> str:
    """A Debian `minbase` root made with debootstrap, imported under `tag` (no registry)."""
    specs.check_refs(("--tag", tag))
    debootstrap = _need("debootstrap")
    buildah = Buildah(_need("buildah"))
    tar = _need("tar")
    mirror = mirror or env.get(env.DEBIAN_MIRROR) or "http://deb.debian.org/debian"
    with tempfile.TemporaryDirectory(prefix="llamaspec-rootfs-") as tmp:
        rootfs, tarball = Path(tmp) / "rootfs", Path(tmp) / "rootfs.tar"
        console.print(f"base: debootstrap --variant=minbase {suite} from {mirror}")
        proc = attempt(
            [debootstrap, "--variant=minbase", suite, str(rootfs), mirror], DEBOOTSTRAP_S
        )
        if proc.returncode != 0:
            raise LlamaspecError(
                f"debootstrap of {suite} failed (exit {proc.returncode}); it needs root and "
                f"the Debian mirror {mirror} (set LLAMASPEC_DEBIAN_MIRROR for another one).",
                details="\n".join((proc.stdout + proc.stderr).splitlines()[-15:]),
            )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        # two steps through a file, not a pipe: each has a time limit and an exit status
        call([tar, "-C", str(rootfs), "-cf", str(tarball), "."], "pack the root file system", TAR_S)
        shutil.rmtree(rootfs)
        with buildah.working_container("scratch") as ctr:
            mnt = buildah.mount(ctr)
            call(
                [tar, "-C", str(mnt), "-xpf", str(tarball)],
                f"unpack the root file system into {mnt}",
                TAR_S,
            )
            buildah.umount(ctr)
            buildah.config(ctr, ["--cmd", '["bash"]', "--env", PATH_ENV])
            buildah.commit(ctr, tag)
    console.print(f"base: {tag} (Debian {suite} minbase) is in local storage")
    return tag
