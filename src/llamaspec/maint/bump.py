"""Bump stage: move an engine's default pin to a newer commit, re-judging the patch queue.

`plan` resolves the candidate commit (`latest` or a SHA, from a local mirror or the remote),
fetches the trees at the current pin and at the candidate, and judges every catalog patch of
the engine at both with the queue's own judge (patch_queue.judge). `pypi_news`, `files_naming`
and `defects_at` gather what else the report should tell. The report is bump_report's; the
edit of engines.yaml and llamaspec.lock is pin_edit's. Building, smoking and verifying the
candidate belong to the proof stage; the CLI runs them between `plan` and `apply` when asked.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import config, env
from llamaspec import lock as lockfile
from llamaspec.config import Engine, PatchEntry
from llamaspec.engine import gitutil, sources
from llamaspec.engine import patch_queue as patches
from llamaspec.engine import patch_sources as patchsrc
from llamaspec.engine.sources import UNREACHABLE_HINTS, SourceTree
from llamaspec.errors import LlamaspecError

Say = Callable[[str], None]
SHA_ISH = re.compile(r"^[0-9a-f]{4,40}$")
RELEASE_TAG = re.compile(r"^b(\d+)$")
PYPI_URL = "https://pypi.org/pypi"
FULL = re.compile(r"^[0-9a-f]{40}$")
USABLE = ("in-base", "applies", "skipped")


# --- where commits come from --------------------------------------------------------------


def clone_hint(engine: Engine) -> str:
    """How to make a mirror on a machine that reaches the engine's remote, and keep it fresh."""
    name = f"{engine.name}.git"
    return (
        f"On a machine that reaches it: `git clone --bare {engine.git_url} {name}` (copy it "
        f"here; refresh it later with `git -C {name} fetch origin '+refs/heads/*:refs/heads/*' "
        f"'+refs/tags/*:refs/tags/*'`), then pass `--source-dir {name}`."
    )


def check_to(to: str) -> str:
    """`latest` or a commit SHA (4 to 40 hex digits, lowercased)."""
    if to == "latest":
        return to
    if not SHA_ISH.match(to.lower()):
        raise LlamaspecError(
            f"--to {to!r} is neither `latest` nor a commit SHA (4 to 40 hex digits). Tags and "
            "branch names move, so a pin is a commit: give the commit they point to (`git "
            "rev-parse TAG` in a clone), or `latest`."
        )
    return to.lower()


def open_mirror(path: Path, engine: Engine) -> Path:
    """A local git repository (bare or not) that holds the engine's history, checked."""
    src = path.expanduser().resolve()
    if not src.is_dir():
        raise LlamaspecError(
            f"--source-dir {path} does not exist or is not a directory. Give a clone or mirror "
            f"of {engine.git_url} (bare or not). {clone_hint(engine)}"
        )
    if gitutil.git("rev-parse", "--git-dir", cwd=src, check=False).returncode != 0:
        raise LlamaspecError(
            f"--source-dir {path} is not a git repository. bump needs the engine's history: "
            f"{clone_hint(engine)}"
        )
    if not _has_commit(src, engine.pin):
        raise LlamaspecError(
            f"The mirror {path} has no commit {engine.pin} (the current {engine.name} pin): "
            f"either it is a clone of another repository, not of {engine.git_url}, or it is "
            f"older than the pin. Point --source-dir at a {engine.name} clone, or update it "
            f"(`git -C {path} fetch`)."
        )
    if _shallow(src):
        raise LlamaspecError(
            f"The mirror {path} is a shallow clone: it cannot say which commits lie between "
            f"the pins or which patches are ancestors. Deepen it (`git -C {path} fetch "
            f"--unshallow`) or make a full clone. {clone_hint(engine)}"
        )
    return src


def _has_commit(repo: Path, sha: str) -> bool:
    return gitutil.git("cat-file", "-e", f"{sha}^{{commit}}", cwd=repo, check=False).returncode == 0


def _shallow(repo: Path) -> bool:
    proc = gitutil.git("rev-parse", "--is-shallow-repository", cwd=repo, check=False)
    return proc.stdout.strip() == "true"


def _ancestor(repo: Path, older: str, newer: str) -> bool:
    return gitutil.is_ancestor(repo, older, newer) is True


def _release_tags(pairs: Sequence[tuple[str, str]]) -> dict[str, int]:
    """{commit: highest release number} from (commit, tag name) pairs (`bNNNN` tags only)."""
    out: dict[str, int] = {}
    for sha, tag in pairs:
        m = RELEASE_TAG.match(tag)
        if m:
            out[sha] = max(out.get(sha, 0), int(m.group(1)))
    return out


def mirror_tags(repo: Path) -> dict[str, int]:
    proc = gitutil.git(
        "for-each-ref", "--format=%(*objectname) %(objectname) %(refname:strip=2)", "refs/tags",
        cwd=repo, check=False,
    )  # fmt: skip
    pairs = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:  # an annotated tag: the commit it peels to, then the tag object
            pairs.append((parts[0], parts[2]))
        elif len(parts) == 2:
            pairs.append((parts[0], parts[1]))
    return _release_tags(pairs)


def parse_ls_remote(text: str) -> tuple[str | None, dict[str, int], list[str]]:
    """`git ls-remote URL` → (HEAD, {commit: release number}, every SHA it lists)."""
    head, shas = None, []
    plain: dict[str, str] = {}
    peeled: dict[str, str] = {}  # `tag^{}` lines name the commit an annotated tag points to
    for line in text.splitlines():
        sha, _, ref = line.partition("\t")
        if not FULL.match(sha):
            continue
        shas.append(sha)
        if ref == "HEAD":
            head = sha
        elif ref.startswith("refs/tags/") and ref.endswith("^{}"):
            peeled[ref[len("refs/tags/") : -3]] = sha
        elif ref.startswith("refs/tags/"):
            plain[ref[len("refs/tags/") :]] = sha
    tags = {**plain, **peeled}
    return head, _release_tags([(sha, tag) for tag, sha in tags.items()]), shas


def ls_remote(engine: Engine) -> str:
    proc = gitutil.git("ls-remote", engine.git_url, check=False, timeout=300)
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
        if any(h in proc.stderr.lower() for h in UNREACHABLE_HINTS) or "unable to access" in err:
            raise LlamaspecError(
                f"Cannot reach {engine.git_url} ({err}), and no mirror was given. Pass "
                f"--source-dir with a clone of {engine.name}. {clone_hint(engine)}"
            )
        raise LlamaspecError(f"`git ls-remote {engine.git_url}` failed: {err}.")
    return proc.stdout


@dataclass(frozen=True)
class Resolved:
    commit: str
    how: str  # one line for the report: how `--to` became this commit
    release: int | None  # the `bNNNN` release tag on it, if any


def resolve(
    engine: Engine, to: str, mirror: Path | None, remote_refs: str | None = None
) -> Resolved:
    """The candidate commit for `--to` (checked), from the mirror or the remote's refs."""
    to = check_to(to)
    if mirror is not None:
        tags = mirror_tags(mirror)
        head = gitutil.git("rev-parse", "--verify", "-q", "HEAD^{commit}", cwd=mirror, check=False)
        head_sha = head.stdout.strip()
        if to == "latest":
            if head.returncode != 0:
                raise LlamaspecError(f"The mirror {mirror} has no HEAD commit; is it empty?")
            return _latest(engine, head_sha, tags, "HEAD of the mirror (--source-dir)")
        proc = gitutil.git(
            "rev-parse", "--verify", "-q", f"{to}^{{commit}}", cwd=mirror, check=False
        )
        if proc.returncode != 0:
            many = gitutil.git("rev-parse", "--disambiguate=" + to, cwd=mirror, check=False)
            if len(to) < 40 and len(many.stdout.split()) > 1:
                raise LlamaspecError(
                    f"--to {to} is ambiguous in the mirror: {len(many.stdout.split())} objects "
                    "start with it. Give more digits (or the full 40)."
                )
            raise LlamaspecError(
                f"--to {to}: no such commit in the {engine.name} history of the mirror. It does "
                f"not exist there, or it belongs to another repository (a commit of another "
                f"engine or fork). Check the SHA against {engine.git_url}; if it is new, update "
                f"the mirror (`git -C {mirror} fetch`)."
            )
        sha = proc.stdout.strip()
        if head.returncode == 0 and not _ancestor(mirror, sha, head_sha):
            raise LlamaspecError(
                f"--to {to} ({sha[:12]}) is in the mirror but not on its HEAD branch: pins "
                f"follow {engine.name}'s default branch, and this commit may belong to a pull "
                f"request (refs/pull/…) or another fork. Give a commit of the default branch, "
                f"or update the mirror if its HEAD is behind."
            )
        return Resolved(sha, f"--to {to} (in the mirror's history)", tags.get(sha))
    refs = remote_refs if remote_refs is not None else ls_remote(engine)
    head_sha, tags, shas = parse_ls_remote(refs)
    if to == "latest":
        if head_sha is None:
            raise LlamaspecError(f"{engine.git_url} lists no HEAD; cannot tell its latest commit.")
        return _latest(engine, head_sha, tags, f"HEAD of {engine.git_url} (git ls-remote)")
    if len(to) == 40:
        return Resolved(to, f"--to {to[:12]} (fetched from {engine.git_url})", tags.get(to))
    found = sorted({s for s in shas if s.startswith(to)})
    if len(found) == 1:
        return Resolved(found[0], f"--to {to} (a ref of {engine.git_url})", tags.get(found[0]))
    raise LlamaspecError(
        f"--to {to} is an abbreviated SHA that "
        + ("matches several refs" if found else "names no branch or tag tip")
        + f" of {engine.git_url}; a remote cannot resolve abbreviated SHAs. Give the full 40-"
        f"digit SHA, or pass --source-dir with a clone. {clone_hint(engine)}"
    )


def _latest(engine: Engine, head: str, tags: dict[str, int], where: str) -> Resolved:
    """HEAD; for engines pinned at releases (`bNNNN`), the newest release when HEAD has none."""
    if engine.build_number is None or head in tags or not tags:
        return Resolved(head, f"latest = {where}", tags.get(head))
    sha, number = max(tags.items(), key=lambda kv: kv[1])
    return Resolved(
        sha,
        f"latest = release b{number}, the newest release tag ({where} is {head[:12]}, which is "
        f"not a release yet; {engine.name} pins are releases)",
        number,
    )


# --- judging the queue ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One catalog patch judged at the current pin and at the candidate."""

    id: str
    title: str
    pr: str
    state: str
    default: bool
    before: patches.Judgement
    after: patches.Judgement
    change: str
    blocking: str  # why this row stops the bump ("" when it does not)


def change_of(before: str, after: str) -> str:
    if before == after:
        return ""
    if after == "in-base":
        return "went in-base"
    if after == "conflict":
        return "now conflicts"
    if after == "applies" and before in ("conflict", "unknown", "error"):
        return "newly applies"
    return f"{before} → {after}"


def blocking_of(entry: PatchEntry, before: str, after: str) -> str:
    """Why the candidate cannot take this patch as the current pin can ("" if it can).

    A default patch must apply (or be in base) for the default build; a patch that applied
    at the current pin must still apply. Optional patches that already conflicted, or that
    cannot be judged anywhere, are reported without stopping the bump."""
    if after == "error":
        return "the patch cannot be used as written"
    if after == "conflict" and entry.default:
        return "a default patch conflicts: the default build would stop"
    if after == "conflict" and before == "applies":
        return "it applied at the current pin and conflicts at the candidate"
    if after == "unknown" and entry.default and before != "unknown":
        return "a default patch cannot be judged at the candidate"
    return ""


def effective_lock(
    entries: Sequence[PatchEntry], engine: Engine, lock: dict, patch_source: str | None, say: Say
) -> dict:
    """The lock, plus entries it lacks resolved from a local mirror (in memory, not saved)."""
    out = {**lock, "patches": dict(lock.get("patches") or {})}
    for entry in entries:
        try:
            if lockfile.patch_commits(entry, lock) is not None:
                continue
            commits = patchsrc.resolve_entry(entry, engine, patch_source)
        except LlamaspecError:  # needs a mirror, or the lock disagrees: judged as unknown
            continue
        if commits:
            out["patches"][entry.id] = commits
            say(f"bump: {entry.id}: resolved from the mirror ({len(commits)} commit(s))")
    return out


# --- the plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    commit: str
    date: dt.date
    tag: str
    build_number: int | None

    @property
    def short(self) -> str:
        return self.commit[:7]


@dataclass(frozen=True)
class Plan:
    engine: Engine  # as engines.yaml has it now
    candidate: Engine  # the record the candidate would get (no PyPI mirror: none is known)
    old: Pin
    new: Pin
    how: str
    has_history: bool
    commits_between: int | None
    counted_by: str
    direction: str  # forward | downgrade | diverged | same
    rows: tuple[Row, ...]
    patch_source: str | None
    mirror: Path | None

    @property
    def blocking(self) -> list[str]:
        return [f"{r.id}: {r.blocking} ({r.after.note})" for r in self.rows if r.blocking]

    def ids(self, change: str) -> list[str]:
        return [r.id for r in self.rows if r.change == change]


def commit_date(tree: Path) -> dt.date:
    text = gitutil.git("show", "-s", "--format=%cs", "HEAD", cwd=tree).stdout.strip()
    return dt.date.fromisoformat(text)


def _check_shape(tree: SourceTree, engine: Engine, commit: str) -> None:
    if not (tree.path / "CMakeLists.txt").is_file() or not (tree.path / engine.server_dir).is_dir():
        raise LlamaspecError(
            f"Commit {commit[:12]} is not a {engine.name} tree: it has no CMakeLists.txt or "
            f"{engine.server_dir}/. It probably belongs to another repository (another engine "
            f"or fork); give a commit of {engine.git_url}."
        )


def plan(
    engine: Engine,
    to: str,
    mirror: Path | None,
    patch_source: str | None,
    allow_downgrade: bool,
    root: Path,
    say: Say,
) -> Plan:
    """Resolve, fetch both trees, check the direction, and judge the queue at both pins."""
    to = check_to(to)
    refs = None
    if mirror is not None:
        mirror = open_mirror(mirror, engine)
    else:
        refs = ls_remote(engine)  # also the release tags; fails early when offline
    res = resolve(engine, to, mirror, refs)
    if res.commit == engine.pin:
        return _same(engine, res)
    patch_source = patch_source or (str(mirror) if mirror else None)
    if mirror is not None:
        new_tree = sources.fetch(engine, res.commit, "local", mirror, say)
        old_tree = sources.fetch(engine, engine.pin, "local", mirror, say)
    else:
        new_tree = _fetch_remote(engine, res.commit, say)
        old_tree = sources.fetch(engine, None, "auto", None, say)
    _check_shape(new_tree, engine, res.commit)
    new_date = commit_date(new_tree.path)
    direction, between, counted = _direction(engine, res, new_date, mirror)
    if direction != "forward" and not allow_downgrade:
        raise LlamaspecError(
            f"--to {to} resolves to {res.commit[:12]} ({new_date}), which "
            + (
                f"is older than the current pin {engine.pin[:12]} ({engine.pin_date})"
                if direction == "downgrade"
                else f"does not descend from the current pin {engine.pin[:12]} (another branch)"
            )
            + ". A bump moves forward; pass --allow-downgrade to move the pin there anyway."
        )
    number = res.release or _counted_build_number(engine, res.commit, mirror)
    new = Pin(
        res.commit,
        new_date,
        f"b{res.release}" if res.release else f"main@{new_date.isoformat()}",
        number if engine.build_number is not None or res.release else None,
    )
    candidate = engine.model_copy(
        update={
            "pin": new.commit,
            "tag": new.tag,
            "pin_date": new.date,
            "build_number": new.build_number,
            "pypi": None,
        }
    )
    series = config.load_series(root)
    entries = [e for e in series if e.engine == engine.name]
    lock = effective_lock(entries, engine, lockfile.load(root), patch_source, say)
    before = patches.judge_series(series, old_tree, engine, lock, root, patch_source, say)
    after = patches.judge_series(series, new_tree, candidate, lock, root, patch_source, say)
    rows = tuple(
        Row(
            e.id,
            e.title,
            f"#{e.upstream.pr}" if e.upstream else "-",
            e.state,
            e.default,
            b,
            a,
            change_of(b.status, a.status),
            blocking_of(e, b.status, a.status),
        )
        for e, b, a in zip(entries, before, after, strict=True)
    )
    old = Pin(engine.pin, engine.pin_date, engine.tag, engine.build_number)
    return Plan(
        engine, candidate, old, new, res.how, mirror is not None, between, counted, direction,
        rows, patch_source, mirror,
    )  # fmt: skip


def _same(engine: Engine, res: Resolved) -> Plan:
    old = Pin(engine.pin, engine.pin_date, engine.tag, engine.build_number)
    return Plan(engine, engine, old, old, res.how, False, 0, "", "same", (), None, None)


def _fetch_remote(engine: Engine, commit: str, say: Say) -> SourceTree:
    try:
        return sources.fetch_git(engine, commit, say)
    except sources.GitUnreachable as exc:
        raise LlamaspecError(
            f"Cannot fetch {engine.name}@{commit[:12]}: {exc.message}. Pass --source-dir with a "
            f"clone of {engine.name}. {clone_hint(engine)}"
        ) from None


def _direction(
    engine: Engine, res: Resolved, new_date: dt.date, mirror: Path | None
) -> tuple[str, int | None, str]:
    """forward | downgrade | diverged, and the commits between (with how they were counted)."""
    if mirror is not None:
        if _ancestor(mirror, engine.pin, res.commit):
            count = gitutil.git("rev-list", "--count", f"{engine.pin}..{res.commit}", cwd=mirror)
            return "forward", int(count.stdout.strip()), "history"
        if _ancestor(mirror, res.commit, engine.pin):
            count = gitutil.git("rev-list", "--count", f"{res.commit}..{engine.pin}", cwd=mirror)
            return "downgrade", -int(count.stdout.strip()), "history"
        return "diverged", None, ""
    between, counted = None, ""
    if res.release and engine.build_number:
        between, counted = res.release - engine.build_number, "release numbers"
        if between < 0:
            return "downgrade", between, counted
    if new_date < engine.pin_date:
        return "downgrade", between, counted
    return "forward", between, counted


def _counted_build_number(engine: Engine, commit: str, mirror: Path | None) -> int | None:
    """An engine's build number is its commit count; trust that only where it holds for the pin."""
    if mirror is None or engine.build_number is None:
        return None
    count = gitutil.git("rev-list", "--count", engine.pin, cwd=mirror).stdout.strip()
    if count != str(engine.build_number):
        return None
    return int(gitutil.git("rev-list", "--count", commit, cwd=mirror).stdout.strip())


# --- what else to tell -----------------------------------------------------------------------


@dataclass(frozen=True)
class PypiNews:
    checked: bool
    line: str
    newest: str | None = None
    newer: tuple[str, ...] = ()


def _version_key(text: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        return None


def pypi_news(engine: Engine, base: str | None = None, timeout: float = 10.0) -> PypiNews:
    """Whether PyPI has a newer sdist of the engine's mirror package (best effort, no download)."""
    import httpx

    if engine.pypi is None:
        return PypiNews(False, f"{engine.name} has no PyPI mirror in engines.yaml")
    pkg, have = engine.pypi.package, engine.pypi.version
    url = f"{(base or env.get(env.PYPI_URL) or PYPI_URL).rstrip('/')}/{pkg}/json"
    try:
        resp = httpx.get(url, timeout=timeout, follow_redirects=True)
        resp.raise_for_status()
        releases = resp.json()["releases"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return PypiNews(False, f"could not check PyPI for {pkg} ({why}); check it by hand")
    have_key = _version_key(have)
    newer = []
    for version, files in releases.items():
        key = _version_key(version)
        live = [f for f in files or [] if not f.get("yanked")]
        sdist = [f for f in live if f.get("packagetype") == "sdist"] or live
        if key is None or key.is_prerelease or not sdist or have_key is None or key <= have_key:
            continue
        newer.append((key, version, str(sdist[0].get("upload_time", ""))[:10]))
    if not newer:
        return PypiNews(True, f"no {pkg} newer than {have} (the mirror of the old pin) on PyPI")
    newer.sort()
    _, newest, uploaded = newer[-1]
    return PypiNews(
        True,
        f"{pkg} {newest} (uploaded {uploaded}) is on PyPI, newer than {have}: it may vendor a "
        f"newer {engine.name} commit. If it vendors the new pin, record it as the pin's `pypi` "
        "mirror in engines.yaml (version, sha256, subdir): CI and machines without GitHub need "
        "it",
        newest,
        tuple(v for _, v, _ in newer),
    )


def files_naming(root: Path, sha: str) -> list[str]:
    """Tracked files (besides engines.yaml, the lock and reports) that name `sha`."""
    proc = gitutil.git("grep", "-l", "-F", sha, cwd=root, check=False)
    if proc.returncode not in (0, 1):
        return []
    skip = {"engines.yaml", lockfile.LOCK}
    return [f for f in proc.stdout.splitlines() if f not in skip and not f.startswith("reports/")]


def defects_at(root: Path, engine: str, pin: str) -> list[str]:
    return [d.id for d in config.load_defects(root) if d.engine == engine and pin in d.pins]


__all__ = [
    "Pin",
    "Plan",
    "PypiNews",
    "Row",
    "check_to",
    "clone_hint",
    "defects_at",
    "files_naming",
    "plan",
    "pypi_news",
    "resolve",
]
