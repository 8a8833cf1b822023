"""The git record a PyPI sdist keeps of the engine commit it vendors: `vendored_record`
reads the submodule's HEAD and index from the sdist, `check_vendored` holds an extracted
tree to them (sources.fetch_pypi calls it for every pin it takes from an sdist)."""

from __future__ import annotations

import tarfile
import tempfile
from pathlib import Path

from llamaspec.config import FULL_SHA
from llamaspec.engine import gitutil
from llamaspec.errors import LlamaspecError


def vendored_record(sdist: Path, subdir: str) -> tuple[str | None, bytes | None]:
    """The commit and git index the sdist keeps for its submodule `subdir`
    (`.git/modules/<subdir>/HEAD` and `index`, as `git submodule` leaves them); None where
    the sdist has no such record."""
    with tarfile.open(sdist) as tar:
        top = tar.next()
        if top is None:
            return None, None
        base = f"{top.name.split('/')[0]}/.git/modules/{subdir.strip('/')}"

        def read(name: str) -> bytes | None:
            try:
                fh = tar.extractfile(f"{base}/{name}")
            except KeyError:
                return None
            return fh.read() if fh else None

        head = read("HEAD")
        commit = head.decode("ascii", "replace").strip() if head else None
        return (commit if commit and FULL_SHA.match(commit) else None), read("index")


def check_vendored(sdist: Path, subdir: str, pin: str, tree: Path) -> str:
    """Check an extracted, snapshotted sdist tree against the sdist's own git record of its
    submodule: the recorded commit must be `pin` and the tree must hold exactly the files
    (mode, blob) of the recorded index. Returns what was checked; raises on a mismatch."""
    commit, index = vendored_record(sdist, subdir)
    if commit is None:
        return (
            f"source: {sdist.name} keeps no git record of the commit in {subdir}; "
            "its sha256 in engines.yaml vouches for it"
        )
    if commit != pin:
        raise LlamaspecError(
            f"{sdist.name} vendors {subdir} at commit {commit} (its .git/modules/{subdir}/HEAD), "
            f"not {pin}. engines.yaml pairs the wrong sdist with that pin; fix the entry (the "
            "sdist's CHANGELOG names the commit each release vendors)."
        )
    if index is None:
        return f"source: {sdist.name} records commit {pin[:12]} for {subdir} (no index to compare)"
    with tempfile.TemporaryDirectory(prefix="llamaspec-index-") as scratch:
        # an empty repository holding the recorded index: ls-files reads the index alone
        gitutil.git("init", "-q", scratch)
        (Path(scratch) / ".git" / "index").write_bytes(index)
        recorded = gitutil.git("ls-files", "-s", cwd=Path(scratch), check=False)
    have = gitutil.git("ls-files", "-s", cwd=tree)
    if recorded.returncode != 0:
        return f"source: {sdist.name} records commit {pin[:12]} (its index is unreadable)"
    want = _entries(recorded.stdout)
    got = _entries(have.stdout)
    differ = sorted(p for p in want.keys() | got.keys() if want.get(p) != got.get(p))
    if differ:
        raise LlamaspecError(
            f"{sdist.name}'s {subdir} differs from the index its submodule recorded for commit "
            f"{pin[:12]}: {len(differ)} file(s), e.g. {differ[0]}. The sdist was built from a "
            "modified checkout; do not build it as that commit."
        )
    return (
        f"source: {sdist.name}'s {subdir} is commit {pin[:12]} "
        f"({len(want)} files match its recorded index)"
    )


def _entries(ls_files: str) -> dict[str, tuple[str, str]]:
    """`git ls-files -s` output → {path: (mode, blob)}; nested submodules are left out."""
    out = {}
    for line in ls_files.splitlines():
        meta, _, path = line.partition("\t")
        mode, blob, _stage = meta.split()
        if mode != "160000":
            out[path] = (mode, blob)
    return out
