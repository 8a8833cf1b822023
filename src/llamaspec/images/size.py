"""The size report of an image: the bytes it adds over its base, what /opt/llamaspec holds,
the system libraries copied in, and the CPU image's budget."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from llamaspec.engine import backends
from llamaspec.images import specs
from llamaspec.images.tools import ContainerTool, call, detect

CPU_BUDGET_MB = 60


def size_report(
    ref: str,
    base: str,
    reports: Path,
    console: Console,
    tool: ContainerTool | None = None,
    record: Mapping | None = None,
) -> dict:
    """reports/docker-size-<tag>.{json,md}: image size and the bytes it adds over its base."""
    specs.check_refs(("image", ref), ("--base", base))
    tool = tool or detect()
    with tool.working_container(ref) as ctr:
        manifest = json.loads(tool.read_file(ctr, "/opt/llamaspec/manifest.json"))
        du = call(tool.run_argv(ctr, ["du", "-sb", "/opt/llamaspec"]), "measure /opt/llamaspec")
        libs = tool.read_file(ctr, "/opt/llamaspec/runtime-libs.txt").split()
    opt_bytes = int(du.split()[0])
    added, base_size = tool.added_bytes(ref, base)
    total = added + base_size
    cpu = not backends.backend(manifest["backend"]).gpu
    seconds = (record or {}).get("seconds") or {}
    report = {
        "image": ref,
        "base": base,
        "artifact_id": manifest["artifact_id"],
        "backend": manifest["backend"],
        "image_bytes": total,
        "base_bytes": base_size,
        "added_bytes": added,
        "added_mb": round(added / 1e6, 1),
        "opt_llamaspec_bytes": opt_bytes,
        "system_libraries": libs,
        "budget_mb": CPU_BUDGET_MB if cpu else None,
        "within_budget": added <= CPU_BUDGET_MB * 1e6 if cpu else None,
        "measured_with": tool.name,
        "build_seconds": dict(seconds) if seconds else None,
    }
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / f"docker-size-{manifest['artifact_id']}"
    stem.with_name(stem.name + ".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# Image size: {manifest['artifact_id']}",
        "",
        f"Image `{ref}` on base `{base}` (uncompressed, {tool.name} local storage).",
        "",
        "| | MB |",
        "|---|---|",
        f"| image | {total / 1e6:.1f} |",
        f"| base | {base_size / 1e6:.1f} |",
        f"| **added by llamaspec** | **{added / 1e6:.1f}** |",
        f"| of which /opt/llamaspec | {opt_bytes / 1e6:.1f} |",
        "",
        f"System libraries copied from the build image: {', '.join(libs) or 'none'}.",
    ]
    if {"build_stage", "runtime_stage"} <= seconds.keys():
        md.append(
            f"Build ({(record or {}).get('tool', '?')}): build stage {seconds['build_stage']} s, "
            f"runtime stage {seconds['runtime_stage']} s."
        )
    if report["budget_mb"]:
        md.append(
            f"Budget for the CPU image: ≤ {CPU_BUDGET_MB} MB added — "
            f"{'met' if report['within_budget'] else 'NOT met'}."
        )
    stem.with_name(stem.name + ".md").write_text("\n".join(md) + "\n")
    console.print(f"size: {ref}: {added / 1e6:.1f} MB over {base} → {stem}.json")
    return report
