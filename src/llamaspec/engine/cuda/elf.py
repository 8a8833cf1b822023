"""ELF files of a CUDA build: the toolkit libraries a binary needs, and what ldd cannot find.

A CUDA llama-server is made relocatable by bundling the toolkit's runtime libraries
(cudart, cuBLAS) into dist/<id>/lib; these read which ones (readelf's DT_NEEDED, followed
transitively) and check that every library resolves inside the artifact.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from llamaspec import procs
from llamaspec.errors import LlamaspecError

# The shared libraries a CUDA llama-server links from the toolkit (bundled into dist/<id>/lib).
RUNTIME_LIBS = re.compile(r"^lib(cudart|cublas|cublasLt)\.so(\.\d+)*$")


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
