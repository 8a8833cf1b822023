"""Reproducibility benchmark: clean builds of one artifact compared file by file, without and
with llamaspec's reproducible-build flags → reports/reproducible-<artifact>.{json,md}.

Baseline: plain cmake with the artifact's own defines minus llamaspec's flags (no prefix
maps, no SOURCE_DATE_EPOCH), in two clean build directories of the tree at two paths of
different depth, as two machines would have them; ccache off. llamaspec: a cold
`llamaspec build --check-reproducible` of the same artifact (its build directory emptied, an
empty private ccache; or, with `--reuse-build`, the artifact's existing build), which builds
a copy of the tree elsewhere a second time and compares. Each
file that differs in the baseline is explained by the build-host paths found in it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from llamaspec import procs
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact, load_artifact
from llamaspec.engine.build import BUILD_SUBDIR, BUILD_TIMEOUT_S
from llamaspec.engine.profiles import Define
from llamaspec.engine.toolchain import detect, machine
from llamaspec.errors import LlamaspecError
from llamaspec.maint.build_bench import artifact_tree, rebuild_command, timed
from llamaspec.paths import cache_dir


def baseline_defines(manifest: dict) -> list[str]:
    """The artifact's defines as `-D` arguments, without llamaspec's reproducibility flags
    (a user's own C/C++ flags, which those defines carry, stay)."""
    return [f"-D{d.name}={d.value}" for d in repro.without_maps(manifest["defines"])]


def _is_native(manifest: dict) -> bool:
    return repro.is_native(Define(d["name"], d["value"], d["origin"]) for d in manifest["defines"])


def _plain_build(tree: Path, build_dir: Path, defines: list[str], env: dict[str, str]) -> dict:
    """A cold plain-cmake build of llama-server; its outputs as `repro.shipped` sees them."""
    tools = detect()
    conf = timed(
        [tools.cmake, "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", *defines],
        env,
        "plain cmake configure (reproducibility baseline)",
    )
    comp = timed(
        [tools.cmake, "--build", str(build_dir), "--target", "llama-server"],
        env,
        "plain cmake build (reproducibility baseline)",
    )
    return {"seconds": round(conf + comp, 1), "files": repro.shipped(build_dir)}


def baseline(tree: Path, manifest: dict, scratch: Path, console: Console) -> dict:
    """Two plain-cmake builds of `tree` without llamaspec's flags, at two paths."""
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["CCACHE_DISABLE"] = "1"
    defines = baseline_defines(manifest)
    copy = scratch / "second-machine" / "home" / "builder" / "src" / tree.name
    console.print(f"reproducible: baseline: copying the tree to {copy}")
    shutil.copytree(tree, copy, symlinks=True, ignore=shutil.ignore_patterns(BUILD_SUBDIR))
    runs = []
    for label, src, bdir in (
        ("A", tree, scratch / "plain-a"),
        ("B", copy, copy / "build"),
    ):
        console.print(f"reproducible: baseline build {label}: plain cmake, cold, in {bdir}…")
        run = _plain_build(src, bdir, defines, env)
        hosts = repro.scan(bdir, repro.needles(src, bdir))
        runs.append({**run, "host_paths": hosts})
        console.print(f"reproducible: baseline build {label}: {run['seconds']:.0f} s")
    a, b = runs
    differing = repro.compare(a["files"], b["files"])
    return {
        "how": "plain cmake, the artifact's defines without llamaspec's prefix maps and "
        "SOURCE_DATE_EPOCH, ccache off; tree A where llamaspec keeps it, tree B a copy at "
        "another path and depth",
        "seconds": [a["seconds"], b["seconds"]],
        "files_compared": len(a["files"].keys() | b["files"].keys()),
        "differing": differing,
        "sha256": {k: [a["files"].get(k), b["files"].get(k)] for k in sorted(a["files"])},
        "host_paths": {"A": a["host_paths"], "B": b["host_paths"]},
        "explained": {
            f: "build-host paths (the tree or build directory) in its bytes"
            if f in a["host_paths"] or f in b["host_paths"]
            else "no build-host path found: another cause (see diffoscope)"
            for f in differing
        },
    }


def with_flags(artifact: Artifact, scratch: Path, console: Console, cold: bool = True) -> dict:
    """`llamaspec build --check-reproducible` of the artifact into a scratch dist: cold (its
    build directory emptied first) or, with `cold` off, reusing the artifact's own build."""
    link = cache_dir() / "build" / artifact.id
    if cold and link.exists():
        shutil.rmtree(link.resolve(), ignore_errors=True)  # a clean build directory
    if cold:
        link.unlink(missing_ok=True)
    out = scratch / "dist"
    cmd = [*rebuild_command(artifact.manifest, out), "--check-reproducible"]
    # cold through an empty private ccache, as the check's second build (see build.py)
    env = {k: v for k, v in os.environ.items() if k != "CCACHE_DISABLE"}
    env["CCACHE_DIR"] = str(scratch / "ccache-first")
    first = "cold (an empty ccache)" if cold else "reusing the artifact's build"
    console.print(f"reproducible: llamaspec build --check-reproducible, {first}…")
    t0 = time.monotonic()
    proc = procs.run(cmd, env=env, timeout=3 * BUILD_TIMEOUT_S, check=False, what="llamaspec build")
    seconds = round(time.monotonic() - t0, 1)
    if not (out / artifact.id / "manifest.json").is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LlamaspecError(
            f"The cold llamaspec build did not produce {artifact.id} (exit {proc.returncode}); "
            f"its last lines:\n{tail}\nRebuild with `{' '.join(cmd[2:])}` to see why."
        )
    built = load_artifact(out, artifact.id)
    record = built.manifest.get("reproducible") or {}
    return {
        "first_build": "cold, in an emptied build directory, an empty private ccache"
        if cold
        else "the artifact's existing build (its own build directory; ccache as it was built)",
        "seconds_total": seconds,
        "exit": proc.returncode,
        "inputs": built.manifest.get("reproducible_inputs"),
        "record": record,
        "build_seconds": built.manifest.get("build_seconds"),
        "files_sha256": built.manifest.get("files_sha256") or {},
    }


def bench_reproducible(
    artifact: Artifact, reports: Path, console: Console, plain: bool = True, cold: bool = True
) -> dict:
    """Run the baseline (unless `plain` is off) and the llamaspec check; write the report."""
    m = artifact.manifest
    if _is_native(m):
        raise LlamaspecError(
            f"{artifact.id} is built with GGML_NATIVE=ON, which tunes it for this CPU: it is "
            "host-specific by design and two machines would not build the same bytes. Build "
            "the portable variant (`llamaspec build --variant portable`) and bench that one."
        )
    tree = artifact_tree(artifact)
    reports.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".repro-bench-", dir=cache_dir() / "build"))
    try:
        base = baseline(tree, m, scratch, console) if plain else None
        ours = with_flags(artifact, scratch, console, cold)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = ours["record"]
    report = {
        "artifact_id": artifact.id,
        "engine": m["engine"],
        "commit": m["commit"],
        "variants": m.get("variants", []),
        "defines": baseline_defines(m),
        "toolchain": m.get("toolchain"),
        "machine": machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "baseline": base,
        "llamaspec": ours,
        "equal": bool(record.get("equal")) and not record.get("host_paths"),
    }
    stem = reports / f"reproducible-{artifact.id}"
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    stem.with_name(stem.name + ".md").write_text(markdown(report))
    verdict = "equal" if report["equal"] else "NOT equal"
    console.print(
        f"reproducible: {verdict}: llama-server sha256 {record.get('sha256_a')} / "
        f"{record.get('sha256_b')}; wrote {stem}.json and .md"
    )
    if not report["equal"]:
        what = ", ".join(record.get("differing") or []) or "no file differs"
        hosts = ", ".join(record.get("host_paths") or {}) or "none"
        raise LlamaspecError(
            f"The two llamaspec builds of {artifact.id} are not the same: differing files: "
            f"{what}; build-host paths in: {hosts}. The report {stem}.md has the details."
        )
    return report


def markdown(r: dict) -> str:
    """The report as Markdown."""
    ours, rec, base = r["llamaspec"], r["llamaspec"]["record"], r["baseline"]
    lines = [
        f"# Reproducible build: {r['artifact_id']}",
        "",
        f"{r['engine']}@{r['commit'][:12]}, `llama-server`, variants "
        f"{', '.join(r['variants']) or 'none'}; {r['machine']['description']}; "
        f"{(r['toolchain'] or {}).get('compiler', '?')}, cmake "
        f"{(r['toolchain'] or {}).get('cmake', '?')}; {r['date']}.",
        "",
        f"**Verdict: {'equal' if r['equal'] else 'NOT equal'}.** Two clean builds with "
        f"llamaspec's flags, the second from a copy of the tree at another path, cold: "
        f"llama-server sha256 `{rec.get('sha256_a')}` and `{rec.get('sha256_b')}`; "
        f"{rec.get('files_compared')} files compared, "
        f"{len(rec.get('differing') or [])} differ; build-host paths found: "
        f"{len(rec.get('host_paths') or {})}.",
        "",
    ]
    if rec.get("differing"):
        lines += [
            "Differing: " + ", ".join(f"`{f}`" for f in rec["differing"]) + " (see how with "
            "diffoscope, or `strings` on both).",
            "",
        ]
    inputs = ours.get("inputs") or {}
    lines += [
        "## With llamaspec's flags",
        "",
        f"`llamaspec build --check-reproducible`; first build: {ours['first_build']}; second "
        f"build: a copy of the tree at another path, a clean build directory, an empty ccache "
        f"({ours['seconds_total']} s in all). SOURCE_DATE_EPOCH {inputs.get('source_date_epoch')} "
        f"({inputs.get('source_date_from')}); prefix maps: "
        + ", ".join(f"`{p}`" for p in inputs.get("path_maps") or [])
        + ".",
        "",
    ]
    if base:
        lines += [
            "## Baseline: the same defines without them",
            "",
            f"{base['how']}: {base['seconds'][0]} s and {base['seconds'][1]} s. "
            f"{len(base['differing'])} of {base['files_compared']} files differ.",
            "",
            "| file | build A sha256 | build B sha256 | why it differs |",
            "|---|---|---|---|",
        ]
        for f, (a, b) in base["sha256"].items():
            why = base["explained"].get(f, "equal")
            hosts = {h for side in base["host_paths"].values() for h in side.get(f, [])}
            if hosts:
                why += f" ({len(hosts)} distinct paths)"
            lines.append(f"| `{f}` | `{(a or '-')[:16]}…` | `{(b or '-')[:16]}…` | {why} |")
        lines.append("")
    lines += [
        "## Files of the llamaspec build",
        "",
        "| file | sha256 |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | `{v}` |" for k, v in sorted(ours["files_sha256"].items())]
    return "\n".join(lines).rstrip() + "\n"
