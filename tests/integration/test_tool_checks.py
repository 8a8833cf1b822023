"""Checks that need a tool the unit tier does not have (it runs with Python, git and a POSIX
userland only, `nox -s tests`): a compiler and objdump, promtool, buildah. CI installs them
(.ci/run); a missing one is a failure here, never a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.models import recipes
from llamaspec.perf import monitoring as mon
from llamaspec.perf import portable

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_wide_instructions_are_counted_from_a_real_disassembly(tmp_path: Path) -> None:
    """Compile one function with AVX2 and one without; objdump sees ymm registers in one."""
    src = tmp_path / "v.c"
    src.write_text(
        "void add(float *a, const float *b) { for (int i = 0; i < 64; i++) a[i] += b[i]; }\n"
    )
    for name, flags in (("wide.so", ["-mavx2"]), ("narrow.so", ["-mno-avx"])):
        cmd = ["cc", "-O3", "-shared", "-fPIC", *flags, str(src), "-o", str(tmp_path / name)]
        subprocess.run(cmd, check=True, timeout=120)
    counts = portable.wide_instructions([tmp_path / "wide.so", tmp_path / "narrow.so"])
    assert counts["wide.so"] > 0 and counts["narrow.so"] == 0


def test_promtool_passes_the_rules_and_tests_of_each_kind_of_recipe(tmp_path: Path) -> None:
    kinds = {  # a draft model, n-grams, MTP heads; an engine without counters
        ("gemma3-270m-self", "llama.cpp"), ("gemma3-270m-ngram", "llama.cpp"),
        ("qwen3.5-27b-mtp", "llama.cpp"), ("qwen3.5-27b-mtp", "ik_llama.cpp"),
    }  # fmt: skip
    assert {n for n, _ in kinds} <= set(recipes.load_all(ROOT))
    for name, engine in sorted(kinds):
        out = tmp_path / f"{name}-{engine}"
        mon.write(mon.for_recipe(name, mon.Settings(), engine=engine, root=ROOT), out)
        for argv in (
            ["check", "rules", mon.RULES],
            ["test", "rules", mon.RULES_TEST],
            ["check", "config", mon.SCRAPE],
            ["check", "config", mon.SCRAPE_COMPOSE],
        ):
            run = subprocess.run(
                ["promtool", *argv], cwd=out, capture_output=True, text=True, timeout=60
            )
            assert run.returncode == 0, (name, engine, run.stdout + run.stderr)


def test_unreachable_registry_suggests_docker_build(tmp_path: Path) -> None:
    """A real pull with buildah from a registry nobody listens on (loopback, closed port)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llamaspec.cli",
            "docker",
            "pull",
            "--tool",
            "buildah",
            "--backend",
            "cpu",
            "--registry",
            "127.0.0.1:9/nobody",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "LLAMASPEC_CACHE": str(tmp_path), "HOME": str(tmp_path)},
        check=False,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert "Cannot reach the registry 127.0.0.1:9" in text
    assert "llamaspec docker build --engine llama.cpp --backend cpu" in text
