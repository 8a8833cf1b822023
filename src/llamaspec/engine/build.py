"""Configure, build and install stages: PatchedTree + defines → Artifact in dist/<id>/."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from llamaspec import __version__, procs, progress
from llamaspec.config import Engine
from llamaspec.engine import backends
from llamaspec.engine import profiles as flags
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import RPC_SERVER_NAMES, Artifact, load_artifact
from llamaspec.engine.cuda import elf
from llamaspec.engine.patch_queue import PatchedTree
from llamaspec.engine.sources import sha256_file
from llamaspec.engine.toolchain import Toolchain
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

BUILD_SUBDIR = ".llamaspec-build"
# Time limits: generous (a CUDA build of every arch on 2 cores takes hours), but finite.
CONFIGURE_TIMEOUT_S = 1800
BUILD_TIMEOUT_S = 6 * 3600

Say = Callable[[str], None]
NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


def internal_defines(engine: Engine, patched: PatchedTree) -> list[flags.Define]:
    """Defines llamaspec always sets: version stamp and a relocatable install layout."""
    commit = patched.source.short
    stamp = commit if not patched.applied else f"{commit}+{len(patched.applied)}p"
    out = [
        flags.Define("LLAMA_BUILD_COMMIT", stamp, "llamaspec (version stamp)"),
        flags.Define("CMAKE_BUILD_RPATH_USE_ORIGIN", "ON", "llamaspec (relocatable dist/)"),
        flags.Define("CMAKE_BUILD_RPATH", "$ORIGIN/../lib", "llamaspec (relocatable dist/)"),
    ]
    if engine.build_number is not None and patched.source.commit == engine.pin:
        out.append(flags.Define("LLAMA_BUILD_NUMBER", str(engine.build_number), "llamaspec"))
    return out


def artifact_id(
    engine: Engine,
    patched: PatchedTree,
    backend: str,
    defines: Sequence[flags.Define],
    tools: Toolchain,
) -> str:
    """A hash of everything that changes the binary (not of where the source came from)."""
    key = {
        "engine": engine.name,
        "commit": patched.source.commit,
        "content": patched.source.content_key if patched.source.origin == "local" else None,
        "patches": [(p.id, p.sha256) for p in patched.applied],
        "backend": backend,
        "defines": sorted((d.name, d.key or d.value) for d in defines),
        "compiler": tools.cxx_version,
        "cmake": tools.cmake_version,
        "target": engine.server_target,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"{engine.name.replace('_', '-').replace('.', '')}-{backend}-{digest[:12]}"


@dataclass(frozen=True)
class Built:
    """An installed artifact and what built it: the inputs a second build of the same tree
    needs (engine/rebuild.py)."""

    artifact: Artifact
    engine: Engine
    patched: PatchedTree
    defines: tuple[flags.Define, ...]
    build_dir: Path
    tools: Toolchain
    jobs: int | None
    extra_targets: tuple[str, ...] = ()


def build(
    engine: Engine,
    patched: PatchedTree,
    backend: str,
    extra: Sequence[flags.Define],
    tools: Toolchain,
    dist: Path,
    jobs: int | None,
    console: Console,
    variants: Sequence[str] = (),
    internal: Sequence[flags.Define] = (),
    manifest_extra: dict | None = None,
    runtime_lib_dir: Path | None = None,
) -> Built:
    """Configure and build the server, install it into dist/<id>/ (a no-op when it exists).

    `runtime_lib_dir`: the CUDA toolkit's lib/, whose runtime libraries the binaries link
    are bundled into dist/<id>/lib (see install).
    `internal`: defines preflight found necessary (e.g. private header dirs).
    The result carries what a second build needs (engine/rebuild.py checks reproducibility)."""
    declared = flags.tree_options(patched.path)
    defines = [
        *flags.merge(engine.name, backend, extra, declared, variants),
        *internal_defines(engine, patched),
        *internal,
    ]
    flags.check_known(defines, declared)
    # the prefix maps name this machine's paths; the id sees them by version only
    aid = artifact_id(
        engine,
        patched,
        backend,
        repro.with_flags(defines, repro.flag_defines(defines, [], os.environ)),
        tools,
    )
    out = dist / aid
    build_dir = build_dir_for(patched.path, aid)
    rpc_on = any(d.name == "GGML_RPC" and flags.cmake_bool(d.value) for d in defines)
    extra_targets = rpc_targets(patched.path) if rpc_on else []
    targets = tuple(extra_targets)
    if (out / "manifest.json").is_file():
        art = load_artifact(dist, aid)
        if (
            art.server.is_file()
            and sha256_file(art.server) == art.manifest["binary_sha256"]
            and all((out / "bin" / t).is_file() for t in extra_targets)
        ):
            console.print(f"build: {aid} is up to date at {out} (nothing to compile)")
            return Built(art, engine, patched, tuple(defines), build_dir, tools, jobs, targets)
    plan = plan_for(engine, patched, defines, build_dir)
    t0 = time.monotonic()
    configure(patched.path, build_dir, plan.defines, tools, console, plan.env)
    archs = read_cmake_cache(build_dir / "CMakeCache.txt").get("CMAKE_CUDA_ARCHITECTURES")
    t1 = time.monotonic()
    env = {**plan.env, **ccache_env(patched.path)}
    compile_target(build_dir, engine.server_target, tools, jobs, console, env, extra_targets)
    t2 = time.monotonic()
    manifest = {
        "artifact_id": aid,
        "llamaspec_version": __version__,
        "engine": engine.name,
        "commit": patched.source.commit,
        "source": {"origin": patched.source.origin, "detail": patched.source.origin_detail},
        "patches": [asdict(p) for p in patched.patches],
        "backend": backend,
        "variants": list(variants),
        "cuda_archs": archs if backends.backend(backend).cuda else None,
        "defines": [_recorded(d, plan) for d in plan.defines],
        **(manifest_extra or {}),
        "toolchain": {
            "cmake": tools.cmake_version,
            "ninja": tools.ninja_version,
            "compiler": tools.cxx_version,
            "ccache": bool(tools.ccache),
        },
        "reproducible_inputs": plan.inputs,
        "reproducible": repro.NATIVE if repro.is_native(defines) else {"checked": False},
        "build_seconds": {"configure": round(t1 - t0, 1), "compile": round(t2 - t1, 1)},
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    art = install(build_dir, engine, out, manifest, console, plan.backend_dl, runtime_lib_dir)
    return Built(art, engine, patched, tuple(defines), build_dir, tools, jobs, targets)


@dataclass(frozen=True)
class Plan:
    """The defines and environment of one build directory (paths differ per directory)."""

    defines: list[flags.Define]
    env: dict[str, str]
    inputs: dict
    backend_dl: bool


def plan_for(
    engine: Engine, patched: PatchedTree, defines: Sequence[flags.Define], build_dir: Path
) -> Plan:
    """Prefix maps for `build_dir`, SOURCE_DATE_EPOCH and the version stamp's environment."""
    maps = repro.path_maps(patched.path, build_dir, bool(ccache_env(patched.path)))
    final = repro.with_flags(defines, repro.flag_defines(defines, maps, os.environ))
    epoch, epoch_from = repro.source_date_epoch(engine, patched.source.commit, patched.path)
    # The version stamp also travels in the environment, for trees whose build-info
    # generator runs at build time (ik_llama.cpp's common/cmake/build-info-gen-cpp.cmake).
    stamp = {
        d.name: d.value for d in final if d.name in ("LLAMA_BUILD_COMMIT", "LLAMA_BUILD_NUMBER")
    }
    inputs = {
        "source_date_epoch": epoch,
        "source_date_from": epoch_from,
        "path_maps": repro.shown(maps, patched.path, build_dir),
    }
    dl = any(d.name == "GGML_BACKEND_DL" and flags.cmake_bool(d.value) for d in final)
    return Plan(final, {**stamp, "SOURCE_DATE_EPOCH": str(epoch)}, inputs, dl)


def _recorded(d: flags.Define, plan: Plan) -> dict:
    """A define as the manifest records it: the prefix maps without this machine's paths."""
    if not d.origin.endswith(repro.ORIGIN):
        return asdict(d)
    user = d.key.removesuffix(f"<{repro.MAPS_VERSION}>").strip() if d.key else ""
    maps = " ".join(plan.inputs["path_maps"])
    return {**asdict(d), "value": f"{user} {maps}".strip()}


def build_dir_for(tree: Path, aid: str) -> Path:
    """The build directory of `aid`; `cache/build/<aid>` always leads to it.

    In trees llamaspec owns (fetched or patched, under the cache) it lives inside the tree,
    `<tree>/.llamaspec-build/<aid>`: with ccache's base_dir at the tree, every compile command
    then reads the same relative paths whatever the tree is called, so after a one-line
    patch change ccache recompiles one file, not the whole tree. A user's own checkout is
    not written into: its build directory is `cache/build/<aid>` itself."""
    link = cache_dir() / "build" / aid
    link.parent.mkdir(parents=True, exist_ok=True)
    if not tree.resolve().is_relative_to(cache_dir().resolve()):
        if link.is_symlink():
            link.unlink()
        link.mkdir(exist_ok=True)
        return link
    real = tree / BUILD_SUBDIR / aid
    real.mkdir(parents=True, exist_ok=True)
    exclude = tree / ".git" / "info" / "exclude"
    if exclude.parent.is_dir() and f"/{BUILD_SUBDIR}/" not in (
        exclude.read_text() if exclude.is_file() else ""
    ):
        with exclude.open("a") as f:
            f.write(f"/{BUILD_SUBDIR}/\n")
    if link.is_symlink() and link.resolve() == real.resolve():
        return real
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        shutil.rmtree(link)  # a build dir of the older layout: its objects had other paths
    link.symlink_to(real, target_is_directory=True)
    return real


# Every compile runs in the C locale: ccache hashes LANG and the LC_* variables it knows,
# so a build where they differ (an image's build stage has no LANG; a host usually has
# one) would miss every object the other made.
COMPILE_LOCALE = {"LANG": "C", "LC_ALL": "C", "LC_CTYPE": "C", "LC_MESSAGES": "C"}


def ccache_env(tree: Path) -> dict[str, str]:
    """ccache sees paths under `tree` as relative ones (see build_dir_for)."""
    if tree.resolve().is_relative_to(cache_dir().resolve()):
        return {"CCACHE_BASEDIR": str(tree.resolve())}
    return {}


def configure(
    tree: Path,
    build_dir: Path,
    defines: Sequence[flags.Define],
    tools: Toolchain,
    console: Console,
    env: dict[str, str] | None = None,
) -> None:
    cache_file = build_dir / "CMakeCache.txt"
    if (
        cache_file.is_file()
        and Path(read_cmake_cache(cache_file).get("CMAKE_HOME_DIRECTORY", str(tree))).resolve()
        != tree.resolve()
    ):
        # same artifact, source now at another path (e.g. a re-made patched tree):
        # CMake refuses a cache made for another source dir, so start the tree over
        shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True)
    cmd = [
        tools.cmake,
        "-S",
        str(tree),
        "-B",
        str(build_dir),
        "-G",
        "Ninja",
        *(d.arg for d in defines),
    ]
    console.print(f"configure: cmake with {len(defines)} defines → {build_dir}")
    proc = procs.run(
        cmd,
        timeout=CONFIGURE_TIMEOUT_S,
        env={**os.environ, **(env or {})},
        check=False,
        what="CMake configure",
        install_hint="Install CMake (Debian/Ubuntu: `apt-get install cmake`).",
    )
    log = proc.stdout + proc.stderr
    (build_dir / "configure.log").write_text(" ".join(cmd) + "\n\n" + log)
    if proc.returncode != 0:
        errors = [b for b in re.split(r"\n(?=CMake Error)", log) if b.startswith("CMake Error")]
        first = errors[0].strip() if errors else "\n".join(log.strip().splitlines()[-20:])
        raise LlamaspecError(
            f"CMake configure failed (full log: {build_dir / 'configure.log'}).",
            details=first[:3000],
        )
    cache = read_cmake_cache(build_dir / "CMakeCache.txt")
    flags.check_unused(log, defines, flags.tree_options(tree), cache)


def read_cmake_cache(path: Path) -> dict[str, str]:
    entries = {}
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"^([A-Za-z0-9_.+-]+):[A-Z_]+=(.*)$", line)
        if m:
            entries[m.group(1)] = m.group(2)
    return entries


def rpc_targets(tree: Path) -> list[str]:
    """The RPC server target(s) this tree declares (`ggml-rpc-server` upstream at b11312)."""
    found = []
    for cml in (*tree.glob("tools/rpc/CMakeLists.txt"), *tree.glob("examples/rpc/CMakeLists.txt")):
        text = cml.read_text(errors="replace")
        found += [n for n in RPC_SERVER_NAMES if re.search(rf"[(\s]{n}[\s)]", text)]
    return found


def compile_target(
    build_dir: Path,
    target: str,
    tools: Toolchain,
    jobs: int | None,
    console: Console,
    env_extra: dict[str, str] | None = None,
    extra_targets: Sequence[str] = (),
) -> None:
    """Run the build with a progress bar (ninja's step counter); show the first error."""
    cmd = [tools.cmake, "--build", str(build_dir), "--target", target, *extra_targets]
    if jobs:
        cmd += ["-j", str(jobs)]
    log_path = build_dir / "build.log"
    env = {**os.environ, **(env_extra or {}), **COMPILE_LOCALE, "NINJA_STATUS": "[%f/%t] "}
    with log_path.open("w") as log, progress.bar(console, transient=False) as bar:
        task = bar.add_task(f"build {target}", total=None)
        with procs.popen(
            cmd, timeout=BUILD_TIMEOUT_S, env=env, check=False, what=f"the build of {target}"
        ) as stream:
            for line in stream.lines():
                log.write(line)
                if m := NINJA_STEP.match(line):
                    bar.update(task, completed=int(m.group(1)), total=int(m.group(2)))
        rc = stream.returncode
    if rc != 0:
        raise LlamaspecError(
            f"The build of {target} failed (full log: {log_path}). The first error:",
            details=first_error(log_path.read_text(errors="replace")),
        )


def first_error(log: str) -> str:
    """The first compiler/linker error with a little context, not the whole log."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if re.search(r"\b(error|Error)\b[: ]", line) and not line.startswith("["):
            start = max(0, i - 2)
            return "\n".join(lines[start : i + 6])
    failed = [i for i, ln in enumerate(lines) if ln.startswith("FAILED:")]
    if failed:
        return "\n".join(lines[failed[0] : failed[0] + 10])
    return "\n".join(lines[-15:])


def shared_libs(build_dir: Path) -> dict[str, Path]:
    """The shared libraries a build made, in bin/ (llama.cpp) or beside their targets (ik):
    lib*.so[.N] files or links, none under node_modules (mid-2026 builds run npm)."""
    libs: dict[str, Path] = {}
    for lib in sorted(build_dir.rglob("lib*.so*")):
        skip = {"CMakeFiles", "node_modules"} & set(lib.relative_to(build_dir).parts)
        if not skip and re.fullmatch(r"lib.*\.so(\.[0-9]+)*", lib.name) and not lib.is_dir():
            libs.setdefault(lib.name, lib)
    return libs


def install(
    build_dir: Path,
    engine: Engine,
    out: Path,
    manifest: dict,
    console: Console,
    backend_dl: bool = False,
    runtime_lib_dir: Path | None = None,
) -> Artifact:
    """Copy the server and its shared libraries into dist/<id>/ atomically, with manifest.

    `runtime_lib_dir` (CUDA): the toolkit libraries the binaries link (cudart, cuBLAS,
    cuBLASLt) are copied into lib/ and listed in the manifest with their sha256; then every
    ELF file must resolve each library inside the artifact, the driver's libcuda aside.

    `backend_dl` (GGML_BACKEND_DL=ON): ggml loads its backends (libggml-cpu-haswell.so, …)
    from the executable's directory, so bin/ links to each of them in lib/."""
    bin_dir = build_dir / "bin"
    server = bin_dir / engine.server_target
    if not server.is_file():
        raise LlamaspecError(f"The build finished but {server} is missing; see {build_dir}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    (tmp / "lib").mkdir()
    shutil.copy2(server, tmp / "bin" / engine.server_target)
    extra_bins = [b for b in RPC_SERVER_NAMES if (bin_dir / b).is_file()]
    for name in extra_bins:
        shutil.copy2(bin_dir / name, tmp / "bin" / name)
    for name, lib in shared_libs(build_dir).items():
        dest = tmp / "lib" / name
        if lib.is_symlink():
            dest.symlink_to(os.readlink(lib))
        else:
            shutil.copy2(lib, dest)
    if backend_dl:
        for module in sorted(bin_dir.glob("libggml-*.so")):
            if module.is_file() and not module.is_symlink():
                (tmp / "bin" / module.name).symlink_to(Path("..") / "lib" / module.name)
    bundled = bundle_runtime(tmp, runtime_lib_dir) if runtime_lib_dir else []
    version = _version(tmp / "bin" / engine.server_target)
    short = manifest["commit"][:7] if manifest["commit"] else None
    if short and short not in version:
        raise LlamaspecError(
            f"The built server reports {version!r}, which does not name commit {short}; "
            "the version stamp did not take. See the configure log in " + str(build_dir)
        )
    manifest = {
        **manifest,
        "server_version": version,
        "binary_sha256": sha256_file(tmp / "bin" / engine.server_target),
        **({"bundled_libs": bundled} if runtime_lib_dir else {}),
        "files": sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if not p.is_dir()),
        "files_sha256": repro.shipped(tmp),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    console.print(f"build: installed {out / 'bin' / engine.server_target} ({version})")
    return Artifact(manifest["artifact_id"], out, manifest, False)


def bundle_runtime(tree: Path, lib_dir: Path) -> list[dict]:
    """Copy the toolkit libraries the tree's binaries need into tree/lib; check with ldd."""
    elfs = [p for p in (*tree.glob("bin/*"), *tree.glob("lib/*.so*")) if not p.is_symlink()]
    bundled = []
    for src in elf.runtime_libraries(elfs, lib_dir):
        dest = tree / "lib" / src.name
        shutil.copy2(src.resolve(), dest)
        bundled.append(
            {"name": src.name, "sha256": sha256_file(dest), "from": str(src.resolve().name)}
        )
    problems = elf.unresolved(tree)
    if problems:
        listing = "; ".join(f"{f}: {', '.join(v)}" for f, v in problems.items())
        raise LlamaspecError(
            f"The CUDA artifact would not run with only a driver installed: {listing}. The "
            f"bundled libraries are {', '.join(b['name'] for b in bundled) or 'none'}; nothing "
            "was installed into dist/."
        )
    return bundled


def _version(server: Path) -> str:
    proc = procs.run([str(server), "--version"], timeout=60, check=False, what=f"{server.name}")
    text = (proc.stdout + proc.stderr).strip()
    lines = [ln for ln in text.splitlines() if ln.startswith("version:")]
    if proc.returncode != 0 and not lines:
        raise LlamaspecError(
            f"{server} --version failed (exit {proc.returncode}); the binary does not run here.",
            details="\n".join(text.splitlines()[-20:]),
        )
    return lines[0] if lines else text.splitlines()[0]
