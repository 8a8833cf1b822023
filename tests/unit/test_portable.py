"""bench-portable's checks of its inputs, its instruction count, and its report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import load_artifact
from llamaspec.errors import LlamaspecError
from llamaspec.perf import portable

pytestmark = pytest.mark.unit
PIN = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def make(dist: Path, aid: str, **manifest) -> str:
    m = {"artifact_id": aid, "engine": "llama.cpp", "commit": PIN, "backend": "cpu"}
    m.update(manifest)
    (dist / aid / "bin").mkdir(parents=True)
    shutil.copy2(shutil.which("true"), dist / aid / "bin" / "llama-server")
    (dist / aid / "manifest.json").write_text(json.dumps(m))
    return aid


@pytest.mark.parametrize(
    ("portable_m", "native_m", "message"),
    [
        (
            {"reproducible": repro.NATIVE},
            {"reproducible": repro.NATIVE},
            "--artifact .* is not a portable",
        ),
        ({}, {}, "--native .* is not a GGML_NATIVE=ON build"),
        ({"backend": "vulkan"}, {"reproducible": repro.NATIVE}, "is a vulkan build"),
        ({}, {"reproducible": repro.NATIVE, "commit": "f" * 40}, "different commits"),
    ],
)
def test_two_cpu_builds_of_one_pin_one_portable_one_native(
    tmp_path: Path, portable_m: dict, native_m: dict, message: str
) -> None:
    a = load_artifact(tmp_path, make(tmp_path, "llamacpp-cpu-aaaaaaaaaaaa", **portable_m))
    b = load_artifact(tmp_path, make(tmp_path, "llamacpp-cpu-bbbbbbbbbbbb", **native_m))
    with pytest.raises(LlamaspecError, match=message):
        portable.bench_portable(a, b, tmp_path / "m.gguf", tmp_path / "r", Console())
    assert not (tmp_path / "r").exists()  # refused before anything ran


def test_report_says_what_ran_and_what_it_cost() -> None:
    run = {"prompt_per_second": 100.0, "predicted_per_second": 50.0}
    report = {
        "artifact": "llamacpp-cpu-aaaaaaaaaaaa",
        "native": "llamacpp-cpu-bbbbbbbbbbbb",
        "commit": PIN,
        "model": "m.gguf",
        "host_cpu": "CPU",
        "emulator": "qemu-x86_64 version 7.2",
        "emulated": {
            "portable": {
                "cpu": "Nehalem",
                "answered": True,
                "text": " Paris",
                "cpu_backend": "libggml-cpu-sse42.so",
                "illegal_instruction": False,
                "seconds": 14.0,
            },
            "native": {
                "cpu": "Nehalem",
                "answered": False,
                "cpu_backend": None,
                "illegal_instruction": True,
                "seconds": 0.3,
            },
        },
        "wide_instructions": {"portable": {"libggml-cpu-sse42.so": 0}, "native": {"x.so": 9}},
        "rounds": 3,
        "n_predict": 128,
        "median": {"portable": run, "native": {**run, "predicted_per_second": 40.0}},
        "cost": {"prompt_per_second": 0.0, "predicted_per_second": -0.25},
    }
    text = portable.markdown(report)
    assert "# Portable build llamacpp-cpu-aaaaaaaaaaaa: an emulated Nehalem CPU" in text
    assert "| portable | yes: ' Paris' | libggml-cpu-sse42.so | no | 14.0 |" in text
    assert "| native | no | — | yes | 0.3 |" in text
    assert "prompt +0.0 %, generation -25.0 %" in text


def test_a_bad_cpu_model_is_named_whether_or_not_qemu_is_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unit tier needs only Python and git (CONTRIBUTING.md): without qemu-x86_64 the
    refusal of `--cpu NoSuchCPU` still names the model, and an empty one is refused first."""
    which = shutil.which
    monkeypatch.setattr(portable.shutil, "which", lambda n: None if "qemu" in n else which(n))
    with pytest.raises(LlamaspecError, match=r"qemu-x86_64 \(here as CPU model 'NoSuchCPU'\)"):
        portable.cpu_model("NoSuchCPU")
    with pytest.raises(LlamaspecError, match=r"--cpu '' names no CPU model"):
        portable.cpu_model("")
