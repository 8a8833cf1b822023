"""`llamaspec bump --build` on the tiny engine-shaped CMake project: the candidate builds for
real, its smoke test fails (the tiny binary is no server), and only the report changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_pipeline_small import SERVER, tiny_tree

from gitrepos import run_git
from helpers import ROOT

pytestmark = pytest.mark.integration


def test_a_candidate_that_fails_its_smoke_test_changes_no_file(tmp_path: Path) -> None:
    repo = tmp_path / "engine"
    pin = tiny_tree(repo)
    (repo / "tools" / "server" / "server.cpp").write_text(SERVER.replace("version: 1", "v: 2"))
    run_git(repo, "commit", "-qam", "later")
    later = run_git(repo, "rev-parse", "HEAD")
    day = run_git(repo, "show", "-s", "--format=%cs", pin)
    root = tmp_path / "project"
    (root / "patches").mkdir(parents=True)
    (root / "engines.yaml").write_text(
        "engines:\n  llama.cpp:\n    git_url: file:///nowhere\n"
        f"    pin: {pin}\n    tag: main@{day}\n    pin_date: {day}\n"
        "    server_dir: tools/server\n    dialect: upstream\n"
    )
    (root / "patches" / "series.yaml").write_text("patches: []\n")
    (root / "llamaspec.lock").write_text(f"engines:\n  llama.cpp: {pin}\npatches: {{}}\n")
    before = {p.name: p.read_text() for p in root.iterdir() if p.is_file()}
    dist = tmp_path / "dist"
    args = ("bump", "--engine", "llama.cpp", "--build", "--source-dir", str(repo))
    proc = subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", *args, "--dist", str(dist)],
        cwd=ROOT,
        env={
            **os.environ,
            "LLAMASPEC_ROOT": str(root),
            "LLAMASPEC_PYPI_URL": "http://127.0.0.1:9",
            "COLUMNS": "250",
        },
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"refused: the smoke of {later[:7]} failed" in err and "Traceback" not in err
    assert "engines.yaml and llamaspec.lock are unchanged" in err
    assert {p.name: p.read_text() for p in root.iterdir() if p.is_file()} == before
    # the candidate was built for real, at the candidate commit
    (art,) = [p for p in dist.iterdir() if (p / "manifest.json").is_file()]
    assert json.loads((art / "manifest.json").read_text())["commit"] == later
    report = json.loads((root / "reports" / f"bump-llama.cpp-{later[:7]}.json").read_text())
    assert [(s["step"], s["passed"]) for s in report["steps"]] == [
        ("build", True),
        ("smoke", False),
    ]
    assert report["outcome"] == "refused" and report["new"]["commit"] == later
    md = (root / "reports" / f"bump-llama.cpp-{later[:7]}.md").read_text()
    assert "- build: passed" in md and "- smoke: FAILED" in md
