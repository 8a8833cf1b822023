"""Throwaway engine-shaped git repositories and Engine objects for tests."""

from __future__ import annotations

import subprocess
from datetime import date
from pathlib import Path

from llamaspec.config import Engine


def run_git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_engine_repo(path: Path, server_dir: str = "tools/server") -> list[str]:
    """A tiny engine-shaped repository with two commits; returns their SHAs (oldest first)."""
    path.mkdir(parents=True)
    run_git(path, "init", "-q", "-b", "main")
    run_git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
    (path / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14)\nproject(t)\n")
    (path / server_dir).mkdir(parents=True)
    (path / server_dir / "server.cpp").write_text("int main() { return 0; }\n")
    (path / "README.md").write_text("one\ntwo\nthree\n")
    run_git(path, "add", "-A")
    run_git(path, "commit", "-q", "-m", "base")
    first = run_git(path, "rev-parse", "HEAD")
    (path / "README.md").write_text("one\ntwo\nthree\nfour\n")
    run_git(path, "commit", "-q", "-am", "second")
    return [first, run_git(path, "rev-parse", "HEAD")]


def make_engine(pin: str, git_url: str = "file:///nonexistent", **kw) -> Engine:
    return Engine(
        name=kw.pop("name", "llama.cpp"),
        git_url=git_url,
        pin=pin,
        tag="test",
        pin_date=date(2026, 1, 1),
        server_dir=kw.pop("server_dir", "tools/server"),
        dialect=kw.pop("dialect", "upstream"),
        **kw,
    )
