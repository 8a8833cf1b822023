"""`docker build --from-artifact`: which artifacts an image may carry, and how it is tagged."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llamaspec.config import load_engines, load_series
from llamaspec.engine import profiles as flags
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import load_artifact
from llamaspec.errors import LlamaspecError
from llamaspec.images import artifact as from_artifact
from llamaspec.images import specs as images

import runcli

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
ENGINES = load_engines(ROOT)
SERIES = load_series(ROOT)
PIN = ENGINES["llama.cpp"].pin


def make_artifact(dist: Path, **manifest) -> str:
    """A dist/<id> with a manifest and a real ELF binary (this machine's `true`)."""
    m = {
        "artifact_id": "llamacpp-cpu-0123456789ab",
        "engine": "llama.cpp",
        "commit": PIN,
        "backend": "cpu",
        "variants": [],
        "defines": [{"name": "GGML_NATIVE", "value": "OFF", "origin": "variant portable"}],
        "patches": [],
        "reproducible": {"checked": False},
        **manifest,
    }
    path = dist / m["artifact_id"]
    (path / "bin").mkdir(parents=True)
    (path / "lib").mkdir()
    shutil.copy2(shutil.which("true"), path / "bin" / "llama-server")
    (path / "manifest.json").write_text(json.dumps(m))
    return m["artifact_id"]


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    """The CLI with no container tool on PATH: refusals must come before any tool is needed."""
    return runcli.cli(*args, env_cache=home, path=str(home / "no-tools"))


def test_an_artifact_of_another_backend_is_refused(tmp_path: Path) -> None:
    art = load_artifact(tmp_path, make_artifact(tmp_path, backend="vulkan"))
    with pytest.raises(LlamaspecError, match="is a vulkan build, not cpu"):
        from_artifact.check_fits(art, "cpu", allow_native=False)
    from_artifact.check_fits(art, None, allow_native=False)  # its own backend is used


def test_a_native_artifact_needs_allow_native(tmp_path: Path) -> None:
    art = load_artifact(tmp_path, make_artifact(tmp_path, reproducible=repro.NATIVE))
    with pytest.raises(LlamaspecError, match=r"GGML_NATIVE=ON.*--variant portable.*--allow-native"):
        from_artifact.check_fits(art, "cpu", allow_native=False)
    from_artifact.check_fits(art, "cpu", allow_native=True)


def test_the_spec_comes_from_the_manifest_and_only_a_default_build_rolls() -> None:
    base = {"engine": "llama.cpp", "commit": PIN, "backend": "cpu", "artifact_id": "x-abc"}
    base["variants"] = ["portable"]  # what an image is built with
    spec = images.artifact_spec(base, ENGINES, SERIES, "localhost")
    assert spec.is_default and spec.pin is None and spec.variants == ()
    assert len(images.tags(spec, base)) == 2  # immutable + rolling
    assert spec.build_args()["VARIANTS"] == "portable"
    native = images.artifact_spec({**base, "variants": []}, ENGINES, SERIES, "localhost")
    assert not native.portable and len(images.tags(native, base)) == 1  # --allow-native
    other = images.artifact_spec({**base, "commit": "f" * 40}, ENGINES, SERIES, "localhost")
    assert other.pin == "f" * 40 and not other.is_default
    variant = images.artifact_spec({**base, "variants": ["portable", "rpc"]}, ENGINES, SERIES, "r")
    assert variant.variants == ("rpc",) and len(images.tags(variant, base)) == 1
    assert variant.build_args()["VARIANTS"] == "portable,rpc"
    user = {"name": "GGML_OPENMP", "value": "OFF", "origin": "--define"}
    profile = {"name": "GGML_NATIVE", "value": "ON", "origin": "profile llama.cpp/cpu"}
    defined = images.artifact_spec({**base, "defines": [user, profile]}, ENGINES, SERIES, "r")
    assert defined.defines == ("GGML_OPENMP=OFF",)
    default_ids = [e.id for e in SERIES if e.engine == "llama.cpp" and e.default]
    optional = [e.id for e in SERIES if e.engine == "llama.cpp" and not e.default]
    patches = [{"id": i, "status": "skipped"} for i in default_ids[:1]]
    patches += [{"id": i, "status": "applied"} for i in optional[:1]]
    patched = images.artifact_spec({**base, "patches": patches}, ENGINES, SERIES, "r")
    assert patched.patches == (*(f"-{i}" for i in default_ids[:1]), *optional[:1])
    assert patched.is_default is (not patches)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pin", PIN], "--from-artifact takes the build's inputs from the artifact's manifest"),
        (["--ccache-dir", "/tmp"], "compiles nothing in the image; drop --ccache-dir"),
        (["--engine", "ik_llama.cpp"], "is a llama.cpp build, not ik_llama.cpp"),
        (["--backend", "vulkan"], "is a cpu build, not vulkan"),
        ([], "GGML_NATIVE=ON"),
    ],
)
def test_cli_refuses_before_any_container_tool(extra: list[str], message: str, tmp_path) -> None:
    dist = tmp_path / "dist"
    aid = make_artifact(dist, reproducible=repro.NATIVE)
    proc = cli(
        "docker", "build", "--from-artifact", aid, "--dist", str(dist), *extra, home=tmp_path
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert message in " ".join(proc.stderr.split())


def test_cli_names_an_unknown_artifact(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    aid = make_artifact(dist)
    proc = cli("docker", "build", "--from-artifact", "nope", "--dist", str(dist), home=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"'nope' is not an artifact in {dist}. Built artifacts: {aid}" in proc.stderr


def test_cpu_needs_txt_says_what_the_entrypoint_checks(tmp_path: Path) -> None:
    from llamaspec.images.stage import cpu_needs_txt

    def manifest(engine: str, variants: list[str]) -> dict:
        merged = flags.merge(engine, "cpu", [], variants=variants)
        return {"engine": engine, "defines": [{"name": d.name, "value": d.value} for d in merged]}

    assert cpu_needs_txt(manifest("llama.cpp", ["portable"])) == "\nCPU code chosen at run time\n"
    ik = cpu_needs_txt(manifest("ik_llama.cpp", ["portable"])).splitlines()
    assert ik[0] == "avx f16c fma avx2" and "fixed instruction-set baseline" in ik[1]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse4_2 avx avx2 fma\n")
    native = cpu_needs_txt(manifest("llama.cpp", []), cpuinfo).splitlines()
    assert native == ["sse4_2 avx fma avx2", "GGML_NATIVE=ON: built for the image builder's CPU"]
