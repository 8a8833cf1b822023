"""Tests that read real ELF files with the system's binary tools (readelf from binutils,
ldd from glibc): moved here from the unit tier, which runs with Python and git alone
(noxfile.py's UNIT_PATH_TOOLS). The binaries are the machine's own (`true`, Python)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.config import load_engines
from llamaspec.engine import build_report
from llamaspec.engine.artifact import load_artifact
from llamaspec.engine.cuda import elf
from llamaspec.images import artifact as from_artifact
from llamaspec.images import build, tools
from llamaspec.images import specs as images
from llamaspec.images.stage import BASE_LIBS, system_libs
from unit.test_docker_from_artifact import make_artifact

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ENGINE = load_engines(ROOT)["llama.cpp"]


def containers_base(name: str) -> bool:
    return bool(BASE_LIBS.match(name))


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


def test_runtime_libraries_follow_needed_entries(tmp_path: Path) -> None:
    """DT_NEEDED read by the real readelf from real binaries (the system's own libraries)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    true = Path("/bin/true").resolve()
    libc = next(n for n in elf.needed(true) if n.startswith("libc.so"))
    assert elf.runtime_libraries([true], lib) == []  # libc is no CUDA runtime library
    assert libc == "libc.so.6"


def test_system_libraries_exclude_the_base_set(tmp_path: Path) -> None:
    """Real ldd on a real binary: the C library stays out, anything else is copied."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    binary = Path(sys.executable).resolve()
    shutil.copy2(binary, tmp_path / "bin" / "server")
    found = system_libs(tmp_path)
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    assert "libc.so.6" in ldd and "libc.so.6" not in found
    assert not any(n.startswith(("libm.so", "ld-linux", "libstdc++")) for n in found)
    expected = {
        ln.split()[0]
        for ln in ldd.splitlines()
        if "=>" in ln and not containers_base(ln.split()[0])
    }
    assert set(found) == expected


def test_runtime_needs_reads_the_glibc_versions_of_real_elf_files(tmp_path: Path) -> None:
    aid = make_artifact(tmp_path)
    (tmp_path / aid / "lib" / "notes.txt").write_text("not an ELF file")
    needs = from_artifact.runtime_needs(tmp_path / aid)
    assert set(needs) == {"GLIBC"}  # coreutils' `true` is C: no libstdc++
    assert needs["GLIBC"].startswith("2.")


def test_build_image_of_an_artifact_keeps_no_layers(tmp_path: Path) -> None:
    """What `docker build --from-artifact` asks buildah for (the build is not run here)."""
    from llamaspec.engine.artifact import load_artifact

    class Stop(Exception):
        pass

    seen: list[tools.BuildSettings] = []

    class Recording(tools.Buildah):
        def build_settings(self, base_image, ccache, say):
            return tools.BuildSettings(pull_never=True)

        @contextlib.contextmanager
        def working_container(self, ref):
            yield "ctr"

        def run_argv(self, ctr, argv, mounts=(), env=None, network=False):
            return ["true"]  # llama-server --version runs in the base

        def build_argv(self, dockerfile, context, target, args, settings=None, **kw):
            seen.append(settings)
            raise Stop

    dist, repo, aid = tmp_path / "dist", tmp_path / "repo", "llamacpp-cpu-0123456789ab"
    (dist / aid / "bin").mkdir(parents=True)
    (dist / aid / "lib").mkdir()
    shutil.copy2(shutil.which("true"), dist / aid / "bin" / "llama-server")
    manifest = {"artifact_id": aid, "engine": "llama.cpp", "commit": ENGINE.pin,
                "backend": "cpu", "variants": ["portable"], "patches": []}  # fmt: skip
    (dist / aid / "manifest.json").write_text(json.dumps(manifest))
    (repo / "docker").mkdir(parents=True)
    shutil.copy2(ROOT / "docker" / "Dockerfile.cpu", repo / "docker")
    art = load_artifact(dist, aid)
    with pytest.raises(Stop):
        build.build_image(Recording(), images.ImageSpec(), Console(), root=repo, logs=tmp_path,
                          artifact=art)  # fmt: skip
    assert [s.keep_layers for s in seen] == [False]
    assert not (repo / ".llamaspec-stage").exists()  # the staged tree is gone too
