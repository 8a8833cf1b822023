"""Build benchmark: llamaspec's build vs plain cmake on the same tree and flags, same run.

Both builds are cold (ccache disabled, empty build directories); the no-op rebuild is
timed too, and so is the rebuild a patch author waits for: a one-line change to a project
patch (a new patched tree, a new build directory, ccache warm from the build before).
Writes reports/bench-build-<artifact>.{json,md}.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console

from llamaspec import env as envvars
from llamaspec import procs
from llamaspec.config import read_yaml
from llamaspec.engine import build as build_stage
from llamaspec.engine.artifact import Artifact
from llamaspec.engine.build import BUILD_TIMEOUT_S
from llamaspec.engine.toolchain import detect
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir, project_root

BENCH_PATCH = "bench-one-line"
# Where each engine's server lives; the one-line patch appends a line to it.
SERVER_SOURCES = ("tools/server/server.cpp", "examples/server/server.cpp")


def _ccache_stats(ccache: str | None, env: dict[str, str]) -> dict[str, int]:
    """ccache's hit/miss counters (`--print-stats`), or {} without ccache."""
    if not ccache:
        return {}
    proc = procs.run([ccache, "--print-stats"], env=env, timeout=120, check=False, what="ccache")
    stats = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
    keys = ("direct_cache_hit", "preprocessed_cache_hit", "cache_miss")
    return {k: int(stats[k]) for k in keys if stats.get(k, "").isdigit()}


def one_line_patch(tree: Path, engine: str, mark: str) -> tuple[str, str]:
    """A project patch that appends one line of code to the engine's server source."""
    rel = next((r for r in SERVER_SOURCES if (tree / r).is_file()), None)
    if rel is None:
        raise LlamaspecError(
            f"The build tree {tree.name} has none of {', '.join(SERVER_SOURCES)}; the "
            f"one-line patch benchmark does not know where {engine}'s server lives."
        )
    old = (tree / rel).read_text(encoding="utf-8").splitlines(keepends=True)
    new = [*old[:-1], old[-1] if old[-1].endswith("\n") else old[-1] + "\n"] if old else []
    new.append(f'[[maybe_unused]] static const char * const llamaspec_bench_mark = "{mark}";\n')
    diff = difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}", n=3)
    # a last line without a newline is marked as git does
    lines = (d if d.endswith("\n") else d + "\n\\ No newline at end of file\n" for d in diff)
    return rel, f"diff --git a/{rel} b/{rel}\n" + "".join(lines)


def _patch_root(root: Path, engine: str) -> Path:
    """A copy of the project's engines, patch queue and lock with the benchmark patch added."""
    tmp = Path(tempfile.mkdtemp(prefix="llamaspec-bench-root-"))
    shutil.copy2(root / "engines.yaml", tmp / "engines.yaml")
    shutil.copytree(root / "patches", tmp / "patches")
    if (root / "llamaspec.lock").is_file():
        shutil.copy2(root / "llamaspec.lock", tmp / "llamaspec.lock")
    (tmp / "patches" / engine).mkdir(exist_ok=True)
    series = tmp / "patches" / "series.yaml"
    data = read_yaml(series)  # the catalog has more than `patches:` (`defects:`)
    data["patches"] = [
        *(data.get("patches") or []),
        {
            "id": BENCH_PATCH,
            "engine": engine,
            "title": "bench-build one-line change",
            "state": "project",
            "source": {"file": f"{BENCH_PATCH}.patch"},
            "default": False,
        },
    ]
    series.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return tmp


def patch_rebuild(
    tree: Path, build_cmd: list[str], dist: Path, engine: str, console: Console
) -> dict:
    """Build with a one-line project patch (ccache primed), change that line, time the rebuild."""
    tools = detect()
    root = _patch_root(project_root(), engine)
    env = {k: v for k, v in os.environ.items() if k != "CCACHE_DISABLE"}
    env[envvars.ROOT.name] = str(root)
    cmd = [*build_cmd, "--patch", BENCH_PATCH]
    # what the benchmark adds (artifacts, patched trees with their builds, build links) goes
    places = [dist, cache_dir() / "work" / engine, cache_dir() / "build"]
    before = {p: set(p.iterdir()) if p.is_dir() else set() for p in places}
    try:
        out: dict = {}
        for mark, label in (("v1", "prime"), ("v2", "rebuild")):
            rel, text = one_line_patch(tree, engine, mark)
            (root / "patches" / engine / f"{BENCH_PATCH}.patch").write_text(text)
            console.print(f"bench-build: one-line patch to {rel} ({mark}), ccache on…")
            s0 = _ccache_stats(tools.ccache, env)
            out[f"{label}_seconds"] = round(timed(cmd, env), 1)
            s1 = _ccache_stats(tools.ccache, env)
            out[f"{label}_ccache"] = {k: s1[k] - s0.get(k, 0) for k in s1}
        out["file"] = rel
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)
        for place, old in before.items():
            for path in set(place.iterdir()) - old if place.is_dir() else ():
                if path.is_symlink() or path.is_file():
                    path.unlink()
                else:
                    shutil.rmtree(path, ignore_errors=True)


def timed(cmd: list[str], env: dict[str, str], what: str | None = None) -> float:
    """Seconds `cmd` took to run to completion (a failure is an error)."""
    t0 = time.monotonic()
    procs.run(
        cmd,
        env=env,
        timeout=BUILD_TIMEOUT_S,
        what=what or f"`{' '.join(cmd[:4])} …` (build benchmark)",
    )
    return time.monotonic() - t0


def artifact_tree(artifact: Artifact) -> Path:
    """The source tree `artifact` was built from (its cached build directory names it)."""
    cache_file = cache_dir() / "build" / artifact.id / "CMakeCache.txt"
    if not cache_file.is_file():
        raise LlamaspecError(
            f"Build {artifact.id} here first (`llamaspec build` with the same options): its "
            "build tree is not in this machine's llamaspec cache."
        )
    return Path(build_stage.read_cmake_cache(cache_file)["CMAKE_HOME_DIRECTORY"])


def rebuild_command(manifest: dict, dist: Path) -> list[str]:
    """`llamaspec build` of the same engine, pin, source, backend and variants into `dist`."""
    src = manifest["source"]["origin"]
    return [
        sys.executable,
        "-m",
        "llamaspec.cli",
        "build",
        "--engine",
        manifest["engine"],
        "--pin",
        manifest["commit"],
        "--source",
        {"pypi-sdist": "pypi"}.get(src, src),
        "--dist",
        str(dist),
        "--no-smoke",
        "--backend",
        manifest["backend"],
        *(a for v in manifest.get("variants", []) for a in ("--variant", v)),
    ]


def bench_build(artifact: Artifact, dist: Path, reports: Path, console: Console) -> dict:
    """Time a cold plain-cmake build and a cold llamaspec build of the same artifact."""
    m = artifact.manifest
    tree = artifact_tree(artifact)
    tools = detect()
    env = {**os.environ, "CCACHE_DISABLE": "1"}
    defines = [f"-D{d['name']}={d['value']}" for d in m["defines"]]
    target = "llama-server"
    with tempfile.TemporaryDirectory(prefix="llamaspec-plain-") as plain:
        console.print("bench-build: plain cmake, cold (ccache disabled)…")
        t_conf = timed([tools.cmake, "-S", str(tree), "-B", plain, "-G", "Ninja", *defines], env)
        t_build = timed([tools.cmake, "--build", plain, "--target", target], env)
    plain_s = t_conf + t_build
    console.print(f"bench-build: plain cmake {plain_s:.0f}s; llamaspec, cold…")
    link = cache_dir() / "build" / artifact.id
    shutil.rmtree(link.resolve())
    link.unlink(missing_ok=True)
    shutil.rmtree(artifact.path)
    cmd = rebuild_command(m, dist)
    ls_s = timed(cmd, env)
    noop_s = timed(cmd, env)
    one_line = patch_rebuild(tree, cmd, dist, m["engine"], console)
    hits = one_line["rebuild_ccache"]
    report = {
        "artifact_id": artifact.id,
        "engine": m["engine"],
        "commit": m["commit"],
        "cores": os.cpu_count(),
        "plain_cmake_seconds": round(plain_s, 1),
        "llamaspec_seconds": round(ls_s, 1),
        "ratio": round(ls_s / plain_s, 3),
        "noop_rebuild_seconds": round(noop_s, 2),
        "one_line_patch": one_line,
    }
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / f"bench-build-{artifact.id}"
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(
        f"# Build benchmark: {artifact.id}\n\n"
        f"{m['engine']}@{m['commit'][:12]}, `{target}`, {report['cores']} cores, cold, ccache "
        "disabled, same tree and defines.\n\n"
        "| build | seconds |\n|---|---|\n"
        f"| plain cmake (configure + build) | {report['plain_cmake_seconds']} |\n"
        f"| llamaspec build (fetch cached, patch, configure, build, install) | "
        f"{report['llamaspec_seconds']} |\n"
        f"| ratio llamaspec ÷ plain | {report['ratio']} |\n"
        f"| no-op rebuild (same request again) | {report['noop_rebuild_seconds']} |\n"
        f"| first build with a one-line project patch (new tree, ccache on) | "
        f"{one_line['prime_seconds']} |\n"
        f"| rebuild after changing that line (ccache warm) | {one_line['rebuild_seconds']} |\n"
        f"\nThe one-line patch appends a line of code to `{one_line['file']}`; ccache over that "
        f"rebuild: {hits.get('direct_cache_hit', 0)} direct hits, "
        f"{hits.get('preprocessed_cache_hit', 0)} preprocessed hits, "
        f"{hits.get('cache_miss', 0)} misses.\n"
    )
    console.print(
        f"bench-build: llamaspec {ls_s:.0f}s (×{report['ratio']}), no-op {noop_s:.1f}s; "
        f"wrote {stem}.json and .md"
    )
    return report
