"""The reproducibility check of `build --check-reproducible`: the artifact built again from
a copy of its tree at another path, in a clean build directory, cold, and every file it
ships compared, with both builds scanned for build-host paths (engine/reproducible.py has
the flags and the comparison; engine/build.py the stages it runs again)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from llamaspec.engine import build, gitutil
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact
from llamaspec.engine.build import Built
from llamaspec.engine.patch_queue import PatchedTree
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir


def check(built: Built, console: Console) -> Artifact:
    """Rebuild the artifact from a copy of its tree at another path, in a clean build directory,
    cold (an empty private ccache); compare every file it ships and scan both for
    build-host paths.

    The result goes into the manifest (`reproducible`). A difference, or a host path in
    either build, is an error naming the files, with the second build kept for diffoscope.
    A GGML_NATIVE=ON build is host-specific by design and is not rebuilt."""
    art, engine, patched, defines = built.artifact, built.engine, built.patched, built.defines
    tools, build_dir = built.tools, built.build_dir
    recorded = art.manifest.get("reproducible")
    if repro.is_native(defines):
        console.print(
            f"reproducible: not checked: {repro.NATIVE} tunes the build for this CPU, so it is "
            "host-specific by design; check a --variant portable build (or --define "
            "GGML_NATIVE=OFF)."
        )
        return art
    if isinstance(recorded, dict) and recorded.get("equal") and not recorded.get("host_paths"):
        console.print(
            f"reproducible: equal (checked {recorded.get('checked_at')}; llama-server "
            f"sha256 {recorded.get('sha256_a')})"
        )
        return art
    scratch = Path(tempfile.mkdtemp(prefix=f".repro-{art.id}-", dir=cache_dir() / "build"))
    keep = False
    try:
        t0 = time.monotonic()
        copy = scratch / "tree"
        console.print(
            f"reproducible: copying the tree to {copy} and building it again with an empty ccache "
            "(a cold build)"
        )
        shutil.copytree(
            patched.path, copy, symlinks=True, ignore=shutil.ignore_patterns(build.BUILD_SUBDIR)
        )
        if (copy / ".git").exists():
            # a copied index has stale stat data: ggml's version stamp would read "-dirty"
            gitutil.git("update-index", "-q", "--refresh", cwd=copy, check=False)
        other = PatchedTree(patched.source, copy, patched.patches)
        build_b = scratch / "build"
        build_b.mkdir()
        plan = build.plan_for(engine, other, defines, build_b)
        # cold, but through ccache where the first build used it: ccache hands the compiler
        # normalized relative paths (`vendor/x/../x/y.hpp` becomes `vendor/x/y.hpp` in
        # __FILE__), so an empty private cache, not none, gives the same compile commands
        env = {**plan.env, **build.ccache_env(copy), "CCACHE_DIR": str(scratch / "ccache")}
        env["CCACHE_NODISABLE" if tools.ccache else "CCACHE_DISABLE"] = "1"
        t1 = time.monotonic()
        build.configure(copy, build_b, plan.defines, tools, console, env)
        t2 = time.monotonic()
        build.compile_target(
            build_b, engine.server_target, tools, built.jobs, console, env, built.extra_targets
        )
        t3 = time.monotonic()
        stub = {"artifact_id": art.id, "commit": art.manifest.get("commit")}
        out_b = build.install(
            build_b, engine, scratch / "dist" / art.id, stub, console, plan.backend_dl
        )
        a, b = repro.shipped(art.path), repro.shipped(out_b.path)
        differing = repro.compare(a, b)
        host_b = repro.scan(out_b.path, repro.needles(copy, build_b, cache_dir()))
        host = {
            **repro.scan(art.path, repro.needles(patched.path, build_dir, cache_dir())),
            **{f"second build: {k}": v for k, v in host_b.items()},
        }
        server = f"bin/{engine.server_target}"
        record = {
            "checked": True,
            "equal": not differing,
            "sha256_a": a.get(server),
            "sha256_b": b.get(server),
            "files_compared": len(a.keys() | b.keys()),
            "differing": differing,
            "host_paths": host,
            "second_build": {
                "how": "a copy of the tree at another path, a clean build directory, "
                + ("an empty private ccache" if tools.ccache else "no ccache"),
                "seconds": {
                    "copy": round(t1 - t0, 1),
                    "configure": round(t2 - t1, 1),
                    "compile": round(t3 - t2, 1),
                },
            },
            "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        manifest = {**art.manifest, "reproducible": record}
        (art.path / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if differing or host:
            keep = True
            what = []
            if differing:
                what.append(
                    f"{len(differing)} of {record['files_compared']} files differ "
                    f"({', '.join(differing[:8])}{' …' if len(differing) > 8 else ''})"
                )
            if host:
                what.append(
                    "build-host paths are in "
                    + "; ".join(f"{k}: {', '.join(v)}" for k, v in list(host.items())[:4])
                )
            raise LlamaspecError(
                f"The build is not reproducible: {' and '.join(what)}. The second build is kept "
                f"at {scratch} ({out_b.path} beside {art.path}); "
                + repro.hint(art.path, out_b.path, differing, shutil.which("diffoscope"))
                + ". The manifest records the result."
            )
        console.print(
            f"reproducible: equal: {record['files_compared']} files, llama-server sha256 "
            f"{record['sha256_a']} in both builds (second build cold: "
            f"{round(t3 - t1)} s)"
        )
        return Artifact(art.id, art.path, manifest, art.reused)
    finally:
        if not keep:
            shutil.rmtree(scratch, ignore_errors=True)
