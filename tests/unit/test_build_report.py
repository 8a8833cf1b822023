"""The CUDA build report: figures from the manifest, the files and the ninja log, and no
path of the build machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llamaspec.engine import build_report
from llamaspec.engine.artifact import load_artifact

pytestmark = pytest.mark.unit


def test_report_counts_cuda_objects_and_names_no_machine_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLAMASPEC_CACHE", str(cache))
    aid = "llamacpp-cuda-0123456789ab"
    art_dir = tmp_path / "dist" / aid
    (art_dir / "bin").mkdir(parents=True)
    (art_dir / "lib").mkdir()
    shutil.copy2(shutil.which("true"), art_dir / "bin" / "llama-server")  # a real ELF file
    (art_dir / "lib" / "libcudart.so.13").write_bytes(b"\0" * 1000)
    toolkit = f"CUDA 13.0: pinned wheels from PyPI (in {cache}/cuda-toolkit/pypi-13.0-x)"
    manifest = {
        "artifact_id": aid,
        "engine": "llama.cpp",
        "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        "backend": "cuda",
        "variants": ["portable", "fast-build"],
        "defines": [{"name": "CMAKE_CUDA_ARCHITECTURES", "value": "90"}],
        "preflight": {"CUDA toolkit": toolkit},
        "build_seconds": {"configure": 3.6, "compile": 3153.0},
        "bundled_libs": [{"name": "libcudart.so.13", "sha256": "a" * 64}],
        "server_version": "0.5.0-dev",
    }
    (art_dir / "manifest.json").write_text(json.dumps(manifest))
    log = cache / "build" / aid / ".ninja_log"
    log.parent.mkdir(parents=True)
    rows = ["# ninja log v5"] + [
        f"0\t1\t0\t{out}\tx"
        for out in ("a.cu.o", "b.cu.o", "c.cpp.o", "a.cu.o", "bin/llama-server")
    ]
    log.write_text("\n".join(rows) + "\n")
    md = build_report.cuda_report(load_artifact(tmp_path / "dist", aid)).read_text()
    assert "compile (4 ninja steps, 2 of them CUDA objects) | 3153.0 |" in " ".join(md.split())
    assert "variants: portable, fast-build" in " ".join(md.split())
    assert "in <llamaspec cache>/cuda-toolkit/pypi-13.0-x" in md
    assert str(tmp_path) not in md + (art_dir / "build-report.json").read_text()
    assert "| `libcudart.so.13` | 0.0 MB |" in md and "| `CMAKE_CUDA_ARCHITECTURES` | `90` |" in md
