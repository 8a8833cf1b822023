"""Reproducible builds: what keeps build-host paths and dates out of the binary, and the
comparison of two builds.

Every build gets prefix maps in `CMAKE_C_FLAGS`/`CMAKE_CXX_FLAGS` that rewrite the source
tree and the build directory out of `__FILE__` (ggml's asserts, llama.cpp's unity-built
model sources) and debug info, and a fixed `SOURCE_DATE_EPOCH`. With ccache's base_dir at
the tree (see build.build_dir_for), ccache hands the compiler paths relative to the build
directory (`../../ggml/src/ggml.c`); one more map rewrites that form too. ccache also
normalizes include directories (`vendor/x/../x/y.hpp` in `__FILE__` becomes `vendor/x/y.hpp`),
which no map can undo, so a build with ccache and one without can still differ: the check
builds its second copy through an empty private ccache. ccache leaves the maps' values out
of its hash, so they cost no cache hits. `build --check-reproducible`
(engine/rebuild.py) rebuilds a copy of the tree elsewhere, cold, and compares the two
with `compare` and `scan`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from llamaspec.config import Engine
from llamaspec.engine import gitutil
from llamaspec.engine.profiles import Define, cmake_bool

# Bumped when the flags below change: it is what the artifact id sees of them.
MAPS_VERSION = "path-maps-v1"
ORIGIN = "llamaspec (reproducible: no build-host paths)"
FLAG_VARS = (("CMAKE_C_FLAGS", "CFLAGS"), ("CMAKE_CXX_FLAGS", "CXXFLAGS"))
NATIVE = "host-specific (GGML_NATIVE=ON)"


def _forms(path: Path) -> list[str]:
    """A path as CMake sees it (as given, made absolute) and as the kernel resolves it."""
    given = os.path.abspath(path)
    real = str(path.resolve())
    return [given] if given == real else [given, real]


def path_maps(tree: Path, build_dir: Path, ccache_relative: bool) -> list[str]:
    """GCC/Clang prefix maps that take `tree` and `build_dir` out of the output.

    Source files become tree-relative (`ggml/src/ggml.c`), build-dir files build-relative
    (`common/build-info.cpp`), the debug info's compile directory `.`. The compiler uses the
    last map that matches, so the build directory (inside the tree for trees llamaspec owns)
    comes after the tree. `ccache_relative`: ccache runs with base_dir at the tree and hands
    the compiler tree paths relative to the build directory (`../../x`, and `./x` for the
    build directory itself); those are mapped the same way."""
    maps = [f"-ffile-prefix-map={p}/=" for p in _forms(tree)]
    if ccache_relative:
        rel = os.path.relpath(os.path.abspath(tree), os.path.abspath(build_dir))
        if rel != "." and not os.path.isabs(rel):
            maps.append(f"-ffile-prefix-map={rel}/=")
        maps.append("-ffile-prefix-map=./=")  # the build directory itself (`-I.`)
    maps += [f"-fdebug-prefix-map={p}=." for p in _forms(build_dir)]
    maps += [f"-ffile-prefix-map={p}/=" for p in _forms(build_dir)]
    return maps


def shown(maps: Iterable[str], tree: Path, build_dir: Path) -> list[str]:
    """The maps with this machine's paths written as <build> and <source> (for manifests)."""
    out = []
    for m in maps:
        for p in _forms(build_dir):
            m = m.replace(p, "<build>")
        for p in _forms(tree):
            m = m.replace(p, "<source>")
        out.append(m)
    return out


def flag_defines(
    defines: Sequence[Define], maps: Sequence[str], environ: Mapping[str, str]
) -> list[Define]:
    """`CMAKE_C_FLAGS` and `CMAKE_CXX_FLAGS` carrying `maps` after the user's own flags.

    The user's flags are a `--define CMAKE_C_FLAGS=…` when given, else `$CFLAGS`/`$CXXFLAGS`
    (which CMake would otherwise have read). The define's key, what the artifact id sees,
    names the maps by version, not by path: the same inputs get the same id anywhere."""
    out = []
    for name, env in FLAG_VARS:
        given = [d for d in defines if d.name == name]
        user = given[-1].value.strip() if given else environ.get(env, "").strip()
        came = f"{given[-1].origin} + " if given else (f"${env} + " if user else "")
        value = " ".join([*([user] if user else []), *(shlex.quote(m) for m in maps)])
        key = " ".join([*([user] if user else []), f"<{MAPS_VERSION}>"])
        out.append(Define(name, value, came + ORIGIN, key))
    return out


def without_maps(recorded: Iterable[Mapping]) -> list[Define]:
    """A manifest's recorded defines without llamaspec's prefix-map flags, whose recorded
    values name <source> and <build>, not paths (a user's own C/C++ flags stay)."""
    out = []
    for d in recorded:
        if not d["origin"].endswith(ORIGIN):
            out.append(Define(d["name"], d["value"], d["origin"]))
            continue
        user = (d.get("key") or "").removesuffix(f"<{MAPS_VERSION}>").strip()
        if user:
            out.append(Define(d["name"], user, d["origin"].removesuffix(f" + {ORIGIN}")))
    return out


def with_flags(defines: Sequence[Define], flags: Sequence[Define]) -> list[Define]:
    """`defines` with the user's C/C++ flag defines replaced by `flags` (which include them)."""
    names = {d.name for d in flags}
    return [*(d for d in defines if d.name not in names), *flags]


def is_native(defines: Iterable[Define]) -> bool:
    """Whether the build tunes for the build machine's CPU (GGML_NATIVE on, the default)."""
    value = next((d.value for d in reversed(list(defines)) if d.name == "GGML_NATIVE"), "ON")
    return cmake_bool(value) is not False


def source_date_epoch(engine: Engine, commit: str | None, tree: Path) -> tuple[int, str]:
    """A fixed SOURCE_DATE_EPOCH for `commit` and where it came from.

    The default pin: midnight UTC of its `pin_date` in engines.yaml (the same for every
    origin, since the PyPI mirror carries no commit dates); another commit: its committer
    date from git; a plain tree (no commit): 0."""
    if commit and commit == engine.pin:
        midnight = dt.datetime.combine(engine.pin_date, dt.time(0), tzinfo=dt.timezone.utc)
        return int(midnight.timestamp()), f"pin_date {engine.pin_date} in engines.yaml"
    if commit:
        proc = gitutil.git("log", "-1", "--format=%ct", commit, cwd=tree, check=False)
        if proc.returncode == 0 and proc.stdout.strip().isdigit():
            return int(proc.stdout.strip()), f"committer date of {commit[:12]}"
    return 0, "no commit (a plain tree): 1970-01-01"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shipped(artifact: Path) -> dict[str, str]:
    """Every file an artifact ships under bin/ and lib/ → its sha256 (`->target` for links)."""
    out = {}
    for sub in ("bin", "lib"):
        base = artifact / sub
        for p in sorted(base.rglob("*")) if base.is_dir() else ():
            rel = str(p.relative_to(artifact))
            if p.is_symlink():
                out[rel] = "->" + os.readlink(p)
            elif p.is_file():
                out[rel] = _digest(p)
    return out


def compare(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """Files that differ between two `shipped` maps (or are in one only)."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def scan(artifact: Path, needles: Iterable[str]) -> dict[str, list[str]]:
    """Build-host paths found in the bytes of an artifact's files: file → the paths found."""
    wanted = sorted({n.rstrip("/") for n in needles if len(n.rstrip("/")) > 1})
    found = {}
    for rel in shipped(artifact):
        p = artifact / rel
        if p.is_symlink():
            continue
        data = p.read_bytes()
        hits = [n for n in wanted if n.encode() in data]
        if hits:
            found[rel] = hits
    return found


def needles(*paths: Path) -> list[str]:
    """The strings `scan` looks for: each path as given and resolved."""
    return sorted({form for p in paths for form in _forms(p)})


def hint(a: Path, b: Path, which: Sequence[str], diffoscope: str | None) -> str:
    """What to run to see how two builds differ."""
    first = which[0] if which else "bin/llama-server"
    if diffoscope:
        return f"see how: {diffoscope} {a / first} {b / first}"
    return (
        f"see how: `cmp -l {a / first} {b / first} | head` and `strings` on both, or install "
        f"diffoscope (`pip install diffoscope` / `apt-get install diffoscope`) and run "
        f"`diffoscope {a / first} {b / first}`"
    )
