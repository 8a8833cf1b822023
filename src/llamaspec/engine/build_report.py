"""The build report of a CUDA artifact: time, size, bundled libraries and the ldd check.

Written beside the manifest as dist/<id>/build-report.{json,md}; every figure comes from
the manifest and from the files of the artifact as they are now.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from llamaspec import procs
from llamaspec.engine.artifact import Artifact
from llamaspec.engine.cuda import elf
from llamaspec.engine.toolchain import machine
from llamaspec.paths import cache_dir

# Defines that decide how much CUDA code is compiled, shown with their values.
COMPILE_SIZE_DEFINES = (
    "CMAKE_CUDA_ARCHITECTURES",
    "GGML_CUDA_FA_QUANTS",
    "GGML_CUDA_FA_ALL_QUANTS",
    "GGML_CUDA_NO_VMM",
    "GGML_NATIVE",
)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def cuda_report(art: Artifact) -> Path:
    """Write dist/<id>/build-report.{json,md}; returns the Markdown path."""
    m = art.manifest
    defines = {d["name"]: d["value"] for d in m.get("defines", []) if isinstance(d, dict)}
    seconds = m.get("build_seconds", {})
    bundled = m.get("bundled_libs", [])
    lib_sizes = {b["name"]: (art.path / "lib" / b["name"]).stat().st_size for b in bundled}
    ldd = elf.unresolved(art.path)
    needs_driver = sorted(
        {
            str(p.relative_to(art.path))
            for p in (*art.path.glob("bin/*"), *art.path.glob("lib/*.so*"))
            if p.is_file() and not p.is_symlink() and "libcuda.so.1" in _ldd_text(p)
        }
    )
    outputs = _ninja_outputs(art)
    steps = len(outputs) if outputs is not None else None
    cuda_objects = sum(o.endswith(".cu.o") for o in outputs) if outputs is not None else None
    record = {
        "artifact_id": art.id,
        "engine": m.get("engine"),
        "commit": m.get("commit"),
        "toolkit": _scrub(m.get("preflight", {}).get("CUDA toolkit") or ""),
        "variants": m.get("variants") or [],
        "machine": machine()["description"],
        "ccache": m.get("toolchain", {}).get("ccache"),
        "seconds": seconds,
        "ninja_steps": steps,
        "cuda_objects": cuda_objects,
        "compile_size_defines": {k: defines[k] for k in COMPILE_SIZE_DEFINES if k in defines},
        "bytes": {
            "total": _size(art.path),
            "bin": _size(art.path / "bin"),
            "lib": _size(art.path / "lib"),
        },
        "bundled_libs": {
            b["name"]: {"bytes": lib_sizes[b["name"]], "sha256": b["sha256"]} for b in bundled
        },
        "ldd_unresolved": ldd,
        "needs_driver_libcuda": needs_driver,
        "server_version": m.get("server_version"),
    }
    (art.path / "build-report.json").write_text(json.dumps(record, indent=2) + "\n")
    mb = 1e6
    rows = "\n".join(f"| `{k}` | `{v}` |" for k, v in record["compile_size_defines"].items())
    libs = "\n".join(
        f"| `{n}` | {v['bytes'] / mb:.1f} MB |" for n, v in record["bundled_libs"].items()
    )
    verdict = (
        "every binary and library resolves every library inside the artifact, except the "
        "driver's `libcuda.so.1`"
        if not ldd
        else "unresolved: " + "; ".join(f"`{f}`: {', '.join(v)}" for f, v in ldd.items())
    )
    md = f"""# CUDA build {art.id}

{record["engine"]} at `{record["commit"]}` ({record["server_version"]}),
toolkit: {record["toolkit"]}.
Built on {record["machine"]}; ccache {"on" if record["ccache"] else "off"}; variants:
{", ".join(record["variants"]) or "none"}.

| stage | seconds |
|---|---|
| configure | {seconds.get("configure", "?")} |
| compile ({steps or "?"} ninja steps, {cuda_objects or "?"} of them CUDA objects) | \
{seconds.get("compile", "?")} |

Defines that decide how much CUDA code is compiled:

| define | value |
|---|---|
{rows}

Size: {record["bytes"]["total"] / mb:.0f} MB in all (`bin/` {record["bytes"]["bin"] / mb:.0f} MB,
`lib/` {record["bytes"]["lib"] / mb:.0f} MB), of which the bundled CUDA libraries:

| library | size |
|---|---|
{libs}

`ldd` check: {verdict}. Files that need the driver's `libcuda.so.1`:
{", ".join(f"`{f}`" for f in needs_driver) or "none (the CUDA runtime loads the driver itself)"}.
"""
    out = art.path / "build-report.md"
    out.write_text(md)
    return out


def _ldd_text(path: Path) -> str:
    ldd = shutil.which("ldd")
    if not ldd:
        return ""
    return procs.run([ldd, str(path)], timeout=60, check=False, what="ldd").stdout


def _ninja_outputs(art: Artifact) -> set[str] | None:
    """The outputs in the build's ninja log (one per step built), where the build dir
    remains."""
    log = cache_dir() / "build" / art.id / ".ninja_log"
    if not log.is_file():
        return None
    return {ln.split("\t")[3] for ln in log.read_text().splitlines()[1:] if ln.count("\t") >= 3}


def _scrub(text: str) -> str:
    """Paths of this machine in a report, said without them: the llamaspec cache and the
    home directory by name."""
    return text.replace(str(cache_dir()), "<llamaspec cache>").replace(str(Path.home()), "~")
