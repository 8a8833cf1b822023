"""Where commit patches come from: the engine's remote or a mirror, cached by SHA.

Diffs of engine commits are fetched shallowly (the commit and its parent), or read from a
local mirror the user names, and cached under the user cache so rebuilds and air-gapped
machines work (`llamaspec patches export DIR` / `import DIR`). A cached diff is written
atomically with its sha256 beside it (`<sha>.diff.sha256`) and checked on every read: a
damaged entry is removed and fetched again.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from llamaspec.config import FULL_SHA, Engine, PatchEntry
from llamaspec.engine import gitutil
from llamaspec.engine.sources import UNREACHABLE_HINTS
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

Say = Callable[[str], None]


class NeedsMirror(LlamaspecError):
    """Resolving this needs the engine's history (a local mirror); not a fault of the entry."""


def diff_cache(engine: str) -> Path:
    path = cache_dir() / "patches" / engine
    path.mkdir(parents=True, exist_ok=True)
    return path


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8", errors="surrogateescape")
    os.replace(tmp, path)


def check_diff(text: str, what: str) -> None:
    """Refuse text that is not a git diff (`git apply --numstat` must parse every hunk)."""
    if not text.startswith("diff --git "):
        raise LlamaspecError(
            f"{what} is not a git diff (it does not start with 'diff --git'); it may be "
            "truncated or another file. Remove it, or export it again with `llamaspec patches "
            "export DIR` on a machine that has it."
        )
    proc = gitutil.git("apply", "--numstat", "-", input_text=text, check=False, timeout=120)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "unparseable"
        raise LlamaspecError(
            f"{what} is not a valid git diff ({why}); it is probably truncated or damaged. "
            "Remove it, or export it again with `llamaspec patches export DIR`."
        )


def store_diff(engine: str, sha: str, text: str) -> None:
    """Put a diff into the cache: the sha256 first, then the diff, each renamed into place."""
    path = diff_cache(engine) / f"{sha}.diff"
    _write_atomic(path.with_name(f"{sha}.diff.sha256"), _digest(text) + "\n")
    _write_atomic(path, text)


def cached_diff(engine: str, sha: str, say: Say | None = None) -> str | None:
    """The cached diff of `sha` if it is intact; a damaged entry is removed (None)."""
    path = diff_cache(engine) / f"{sha}.diff"
    record = path.with_name(f"{sha}.diff.sha256")
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        want = record.read_text().strip() if record.is_file() else None
    except (OSError, UnicodeDecodeError):
        text, want = "", ""
    if want is None and text:  # written before digests were recorded: adopt it if it parses
        try:
            check_diff(text, str(path))
        except LlamaspecError:
            want = ""
        else:
            _write_atomic(record, _digest(text) + "\n")
            return text
    if want == _digest(text):
        return text
    if say is not None:
        say(f"patches: the cached diff of {sha[:12]} is damaged; removing it and fetching again")
    path.unlink(missing_ok=True)
    record.unlink(missing_ok=True)
    return None


def check_patch_source(source: str) -> str:
    """A --patch-source that names a local folder must be one; otherwise git would take it
    for a remote and fail late (after the download), saying the commit is missing."""
    remote = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://|[^/]*@[^/]*:|[^/:]+:[^/]", source)
    if not remote and not Path(source).expanduser().is_dir():
        raise LlamaspecError(
            f"--patch-source {source}: no such folder. Give a local mirror (a clone of the "
            "engine), a git URL, or leave the option out for the engine's own repository."
        )
    return source


def _is_local_repo(source: str) -> Path | None:
    path = Path(source).expanduser()
    if (
        path.is_dir()
        and gitutil.git("rev-parse", "--git-dir", cwd=path, check=False).returncode == 0
    ):
        return path.resolve()
    return None


def commit_diff(engine: Engine, sha: str, patch_source: str | None, say: Say) -> str:
    """The diff of `sha` against its first parent, from the cache, a mirror or the remote."""
    if not FULL_SHA.match(sha):
        raise LlamaspecError(
            f"Patch commit {sha!r} is not a full SHA. Short SHAs and PR heads are resolved into "
            "llamaspec.lock by `llamaspec lock` (needs the engine's remote or --patch-source DIR)."
        )
    if (text := cached_diff(engine.name, sha, say)) is not None:
        return text
    source = patch_source or engine.git_url
    local = _is_local_repo(source)
    if local is not None:
        have = gitutil.git("cat-file", "-e", f"{sha}^{{commit}}", cwd=local, check=False)
        if have.returncode != 0:
            raise LlamaspecError(
                f"The mirror {local} has no commit {sha}. Update it (`git -C {local} fetch`) or "
                "point --patch-source at a mirror that has it."
            )
        text = _diff(local, sha)
    else:
        say(f"patches: fetching commit {sha[:12]} and its parent from {source}")
        with tempfile.TemporaryDirectory(prefix="llamaspec-patch-") as tmp:
            gitutil.git("init", "-q", tmp)
            proc = gitutil.git(
                "fetch", "-q", "--depth", "2", "--no-tags", source, sha, cwd=Path(tmp), check=False
            )
            if proc.returncode != 0:
                err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
                if any(h in proc.stderr.lower() for h in UNREACHABLE_HINTS):
                    raise LlamaspecError(
                        f"Cannot fetch patch commit {sha}: {source} is unreachable ({err}) and "
                        f"the local diff cache ({diff_cache(engine.name)}) has no {sha}.diff. "
                        "On a machine with access run `llamaspec patches export DIR`, copy DIR "
                        "here and run `llamaspec patches import DIR`, or give --patch-source DIR "
                        f"with a local mirror of {engine.name} that has the commit."
                    )
                raise LlamaspecError(
                    f"{source} has no commit {sha}: {err}. Check the SHA in patches/series.yaml "
                    "or llamaspec.lock."
                )
            text = _diff(Path(tmp), sha)
    check_diff(text, f"The diff of commit {sha[:12]} from {source}")
    store_diff(engine.name, sha, text)
    return text


def _diff(repo: Path, sha: str) -> str:
    return gitutil.git("diff", "--binary", "--full-index", f"{sha}^", sha, cwd=repo).stdout


def resolve_commitish(engine: Engine, ref: str, patch_source: str | None) -> str:
    """A full SHA for an abbreviated SHA (needs a local mirror) or a full one (checked)."""
    local = _is_local_repo(patch_source) if patch_source else None
    if local is None:
        if FULL_SHA.match(ref):
            return ref
        raise NeedsMirror(
            f"Cannot resolve the short SHA {ref!r} without the engine's history: git remotes "
            f"cannot be asked for abbreviated SHAs. Run `llamaspec lock --patch-source DIR` with "
            f"a clone or mirror of {engine.git_url}."
        )
    proc = gitutil.git("rev-parse", "--verify", "-q", f"{ref}^{{commit}}", cwd=local, check=False)
    if proc.returncode != 0:
        raise LlamaspecError(f"The mirror {local} has no commit {ref!r}.")
    return proc.stdout.strip()


def resolve_pr(engine: Engine, pr: int, patch_source: str | None) -> list[str]:
    """The commits of pull request `pr` that are not on the engine's main branch, oldest first."""
    source = patch_source or engine.git_url
    local = _is_local_repo(source)
    if local is None:
        raise NeedsMirror(
            f"Resolving PR #{pr} needs the engine's history; run `llamaspec lock --patch-source "
            f"{engine.name}=DIR` with a mirror of {engine.git_url} that has refs/pull/*."
        )
    head = gitutil.git(
        "rev-parse", "--verify", "-q", f"refs/pull/{pr}/head", cwd=local, check=False
    )
    if head.returncode != 0:
        raise LlamaspecError(f"The mirror {local} has no refs/pull/{pr}/head.")
    return gitutil.git(
        "rev-list", "--reverse", "--no-merges", f"HEAD..{head.stdout.strip()}", cwd=local
    ).stdout.split()


def resolve_entry(entry: PatchEntry, engine: Engine, patch_source: str | None) -> list[str] | None:
    """Full SHAs for a commit or PR-head catalog entry (None: a file patch, nothing to resolve).

    Raises NeedsMirror when only the engine's history could say, LlamaspecError otherwise."""
    if entry.source.pr_head and entry.upstream:
        return resolve_pr(engine, entry.upstream.pr, patch_source)
    if entry.source.commits:
        return [resolve_commitish(engine, c, patch_source) for c in entry.source.commits]
    return None


def export_diffs(engine_names: list[str], dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    n = 0
    for name in engine_names:
        for diff in diff_cache(name).glob("*.diff"):
            text = cached_diff(name, diff.stem)
            if text is None:  # damaged: removed, not exported
                continue
            (dest / name).mkdir(exist_ok=True)
            (dest / name / diff.name).write_text(text, encoding="utf-8", errors="surrogateescape")
            (dest / name / f"{diff.name}.sha256").write_text(_digest(text) + "\n")
            n += 1
    return n


def import_diffs(src: Path) -> int:
    if not src.is_dir():
        raise LlamaspecError(f"{src} is not a directory written by `llamaspec patches export`.")
    found = sorted(src.glob("*/*.diff"))
    checked = []
    for diff in found:  # every file is checked before any enters the cache
        if not FULL_SHA.match(diff.stem):
            raise LlamaspecError(f"{diff} is not named <full sha>.diff; refusing to import it.")
        try:
            text = diff.read_text(encoding="utf-8", errors="surrogateescape")
        except (OSError, UnicodeDecodeError) as exc:
            raise LlamaspecError(
                f"{diff} cannot be read as text ({exc}); nothing was imported."
            ) from None
        check_diff(text, str(diff))
        record = diff.with_name(f"{diff.name}.sha256")
        if record.is_file() and record.read_text().strip() != _digest(text):
            raise LlamaspecError(
                f"{diff} does not match the sha256 recorded beside it ({record.name}): it was "
                "changed or damaged after export. Export it again; nothing was imported."
            )
        checked.append((diff.parent.name, diff.stem, text))
    for engine, sha, text in checked:
        store_diff(engine, sha, text)
    return len(checked)
