"""Thin, quiet wrappers around the git command line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from llamaspec import procs
from llamaspec.errors import LlamaspecError

# Fixed identity and dates make snapshot commits reproducible: the same tree gives the same SHA.
SNAPSHOT_ENV = {
    "GIT_AUTHOR_NAME": "llamaspec",
    "GIT_AUTHOR_EMAIL": "llamaspec@localhost",
    "GIT_COMMITTER_NAME": "llamaspec",
    "GIT_COMMITTER_EMAIL": "llamaspec@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def git(
    *args: str | os.PathLike,
    cwd: Path | None = None,
    check: bool = True,
    timeout: float = 1800,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run git, capturing output. Raises LlamaspecError when git is missing or `check` fails."""
    env = {
        **os.environ,
        **SNAPSHOT_ENV,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_HTTP_LOW_SPEED_LIMIT": "1000",
        "GIT_HTTP_LOW_SPEED_TIME": "60",
        "LC_ALL": "C",
    }
    cmd = ["git", "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false", *map(str, args)]
    proc = procs.run(
        cmd,
        cwd=cwd,
        env=env,
        input=input_text,
        timeout=timeout,
        check=False,
        errors="surrogateescape",  # diffs of non-UTF-8 files keep their exact bytes
        what=f"`git {' '.join(map(str, args[:2]))}`",
        install_hint=(
            "llamaspec uses git to fetch sources and apply patches; install it "
            "(Debian/Ubuntu: `apt-get install git`) and run again."
        ),
    )
    if check and proc.returncode != 0:
        raise LlamaspecError(
            f"`git {' '.join(map(str, args))}` failed in {cwd or os.getcwd()}: "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def snapshot(path: Path, message: str) -> str:
    """Make `path` a git work tree whose single commit holds every file; return the commit."""
    git("init", "-q", path)
    # -f: vendored trees carry their own .gitignore; every shipped file belongs in the snapshot.
    git("add", "-A", "-f", ".", cwd=path)
    git("commit", "-q", "--no-verify", "--allow-empty", "-m", message, cwd=path)
    return head(path)


def head(path: Path) -> str:
    return git("rev-parse", "HEAD", cwd=path).stdout.strip()


def tree_hash(path: Path) -> str:
    return git("rev-parse", "HEAD^{tree}", cwd=path).stdout.strip()


def is_ancestor(repo: Path, older: str, newer: str) -> bool | None:
    """Whether `older` is an ancestor of `newer` (or the same commit) in `repo`; None where
    git cannot tell (a commit the clone lacks)."""
    rc = git("merge-base", "--is-ancestor", older, newer, cwd=repo, check=False).returncode
    return {0: True, 1: False}.get(rc)


def is_repo_root(path: Path) -> bool:
    proc = git("rev-parse", "--show-toplevel", cwd=path, check=False)
    return proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == path.resolve()
