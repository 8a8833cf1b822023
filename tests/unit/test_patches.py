"""Patch stage: apply on a scratch copy, detect already-applied, roll back on conflict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.config import PatchEntry, PatchSource
from llamaspec.engine import patch_queue as patches
from llamaspec.engine import sources
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

from gitrepos import make_engine, make_engine_repo, run_git

pytestmark = pytest.mark.unit


def diff_of(repo: Path, edit: str, new_text: str) -> str:
    """A git diff that changes `edit` to `new_text` in `repo` (left unchanged afterwards)."""
    old = (repo / edit).read_text()
    (repo / edit).write_text(new_text)
    text = run_git(repo, "diff") + "\n"
    (repo / edit).write_text(old)
    return text


@pytest.fixture
def setup(tmp_path: Path):
    first, _second = make_engine_repo(tmp_path / "up")
    tree = sources.fetch(make_engine(first), first, "local", tmp_path / "up", lambda _m: None)
    root = tmp_path / "root"
    (root / "patches" / "llama.cpp").mkdir(parents=True)
    return tmp_path / "up", tree, root


def entry(root: Path, pid: str, text: str, **kw) -> PatchEntry:
    (root / "patches" / "llama.cpp" / f"{pid}.patch").write_text(text)
    return PatchEntry(
        id=pid,
        engine="llama.cpp",
        title=f"title {pid}",
        source=PatchSource(file=f"{pid}.patch"),
        **kw,
    )


def test_applies_on_a_copy_and_leaves_the_source_untouched(setup) -> None:
    repo, tree, root = setup
    run_git(repo, "checkout", "-q", "HEAD~1")  # make the patch's base match the tree
    e = entry(root, "add-x", diff_of(repo, "README.md", "one\ntwo\nthree\nx\n"))
    patched = patches.apply(tree, [e], root, lambda _m: None)
    assert [p.status for p in patched.patches] == ["applied"]
    assert patched.path != tree.path
    assert (patched.path / "README.md").read_text().endswith("x\n")
    assert (tree.path / "README.md").read_text() == "one\ntwo\nthree\n"
    # staged, not committed: HEAD still names the engine commit (git-based build info)
    assert run_git(patched.path, "diff", "--cached", "--name-only") == "README.md"
    assert run_git(patched.path, "rev-parse", "HEAD") == run_git(tree.path, "rev-parse", "HEAD")
    again = patches.apply(tree, [e], root, lambda _m: None)
    assert again == patched


def test_reverse_applying_patch_is_already_in_base(setup, tmp_path: Path) -> None:
    repo, _tree, root = setup
    later = sources.fetch(make_engine("a" * 40), None, "local", repo, lambda _m: None)
    base_to_second = run_git(repo, "diff", "HEAD~1", "HEAD") + "\n"
    e = entry(root, "second", base_to_second)
    patched = patches.apply(later, [e], root, lambda _m: None)
    assert patched.patches[0].status == "in-base"
    assert not patched.applied


def test_conflict_names_files_and_rolls_back(setup) -> None:
    repo, tree, root = setup
    bad = diff_of(repo, "README.md", "totally\ndifferent\n")  # written against the later commit
    good = entry(root, "good", diff_of(repo, "tools/server/server.cpp", "int main() {}\n"))
    with pytest.raises(LlamaspecError) as err:
        patches.apply(tree, [good, entry(root, "bad", bad)], root, lambda _m: None)
    assert f"llama.cpp@{tree.short}" in str(err.value)
    assert "'bad'" in str(err.value) and "README.md" in str(err.value)
    assert "--no-patch bad" in str(err.value)
    work = cache_dir() / "work" / "llama.cpp"
    assert not work.exists() or not [p for p in work.iterdir() if p.is_dir()]
    assert (tree.path / "tools/server/server.cpp").read_text() == "int main() { return 0; }\n"


def test_patch_touching_paths_outside_the_tree_is_refused(setup) -> None:
    _repo, tree, root = setup
    text = "--- a/../evil\n+++ b/../evil\n@@ -0,0 +1 @@\n+x\n"
    with pytest.raises(LlamaspecError, match="outside the source tree"):
        patches.apply(tree, [entry(root, "evil", text)], root, lambda _m: None)


def test_select_defaults_includes_excludes_and_unknown_ids(tmp_path: Path) -> None:
    series = [
        PatchEntry(id="a", engine="llama.cpp", title="a", source=PatchSource(file="a.patch")),
        PatchEntry(
            id="b",
            engine="llama.cpp",
            title="b",
            source=PatchSource(file="b.patch"),
            default=False,
            requires=("a",),
        ),
        PatchEntry(id="c", engine="ik_llama.cpp", title="c", source=PatchSource(file="c.patch")),
    ]
    ids = lambda chosen: [p.id for p in chosen]  # noqa: E731
    assert ids(patches.select(series, "llama.cpp")) == ["a"]
    assert ids(patches.select(series, "llama.cpp", include=["b"])) == ["a", "b"]
    assert ids(patches.select(series, "llama.cpp", exclude=["a"])) == []
    # --patch b brings what b requires, even without defaults; excluding it is an error
    assert ids(patches.select(series, "llama.cpp", ["b"], no_defaults=True)) == ["a", "b"]
    with pytest.raises(LlamaspecError, match="requires 'a', which --no-patch a excludes"):
        patches.select(series, "llama.cpp", ["b"], exclude=["a"])
    with pytest.raises(LlamaspecError, match="Did you mean 'a'"):
        patches.select(series, "llama.cpp", include=["aa"])
    with pytest.raises(LlamaspecError, match="is for ik_llama.cpp"):
        patches.select(series, "llama.cpp", include=["c"])


def test_only_if_missing_skips_when_the_tree_already_has_the_file(setup) -> None:
    _repo, tree, root = setup
    text = "--- /dev/null\n+++ b/README.md\n@@ -0,0 +1 @@\n+x\n"
    e = entry(root, "add-readme", text, only_if_missing="README.md")
    patched = patches.apply(tree, [e], root, lambda _m: None)
    assert [p.status for p in patched.patches] == ["skipped"] and not patched.applied
    new = "--- /dev/null\n+++ b/NEW.md\n@@ -0,0 +1 @@\n+x\n"
    e2 = entry(root, "add-new", new, only_if_missing="NEW.md")
    patched = patches.apply(tree, [e2], root, lambda _m: None)
    assert [p.status for p in patched.patches] == ["applied"]
    assert (patched.path / "NEW.md").read_text() == "x\n"


def test_project_patch_for_ik_is_a_new_file_in_the_tree() -> None:
    from llamaspec import config

    root = Path(__file__).resolve().parents[2]
    (ik,) = [p for p in config.load_series(root) if p.id == "ik-build-info"]
    text = patches.patch_file(ik, root).read_text()
    assert "+++ b/common/cmake/build-info-gen-cpp.cmake" in text and ik.only_if_missing


def _project(tmp_path: Path, series: str) -> Path:
    """A project root: the real engines.yaml, the given series.yaml, an empty lock."""
    root = tmp_path / "project"
    (root / "patches" / "llama.cpp").mkdir(parents=True)
    real = Path(__file__).resolve().parents[2]
    (root / "engines.yaml").write_text((real / "engines.yaml").read_text())
    (root / "patches" / "series.yaml").write_text(series)
    return root


def _cli(root: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", *args],
        cwd=root,
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "LLAMASPEC_ROOT": str(root),
            "LLAMASPEC_CACHE": str(cache),
            "HOME": str(cache),
            "COLUMNS": "300",
        },
        timeout=120,
        check=False,
    )


def test_status_reports_a_path_escaping_patch_as_an_error(tmp_path: Path) -> None:
    _first, second = make_engine_repo(tmp_path / "up")
    root = _project(
        tmp_path,
        "patches:\n  - id: evil\n    engine: llama.cpp\n    title: evil\n    state: project\n"
        "    source: {file: evil.patch}\n",
    )
    (root / "patches" / "llama.cpp" / "evil.patch").write_text(
        "--- a/../evil\n+++ b/../evil\n@@ -0,0 +1 @@\n+x\n"
    )
    proc = _cli(
        root,
        tmp_path / "cache",
        "patches",
        "status",
        "--source",
        "local",
        "--source-dir",
        str(tmp_path / "up"),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "error" in out and "outside the source tree" in out and "conflict" not in out
    assert "evil: Patch 'evil' touches '../evil'" in " ".join(proc.stderr.split())
    assert second  # the tree is the checkout's head


def test_lock_fails_for_a_missing_commit_but_not_for_a_missing_mirror(tmp_path: Path) -> None:
    first, second = make_engine_repo(tmp_path / "up")
    series = (
        "patches:\n"
        "  - {id: short, engine: llama.cpp, title: t, state: merged, "
        f"source: {{commits: ['{second[:9]}']}}}}\n"
    )
    root = _project(tmp_path, series)
    no_mirror = _cli(root, tmp_path / "cache", "lock")
    assert no_mirror.returncode == 0, no_mirror.stdout + no_mirror.stderr
    assert "unresolved" in no_mirror.stdout
    with_mirror = _cli(root, tmp_path / "cache", "lock", "--patch-source", str(tmp_path / "up"))
    assert with_mirror.returncode == 0, with_mirror.stdout + with_mirror.stderr
    assert second in (root / "llamaspec.lock").read_text()
    (root / "patches" / "series.yaml").write_text(series.replace(second[:9], "deadbeef0"))
    bad = _cli(root, tmp_path / "cache", "lock", "--patch-source", str(tmp_path / "up"))
    assert bad.returncode == 2, bad.stdout + bad.stderr
    msg = " ".join(bad.stderr.split())
    assert "1 lock entry could not be resolved" in msg and "has no commit 'deadbeef0'" in msg
    assert "Traceback" not in bad.stderr
    assert first


@pytest.mark.parametrize("damage", ["edit-patched", "edit-other", "unstage", "none"])
def test_a_damaged_cached_patched_tree_is_made_again(setup, damage: str) -> None:
    repo, tree, root = setup
    run_git(repo, "checkout", "-q", "HEAD~1")
    e = entry(root, "add-x", diff_of(repo, "README.md", "one\ntwo\nthree\nx\n"))
    patched = patches.apply(tree, [e], root, lambda _m: None)
    (patched.path / ".llamaspec-build").mkdir()  # build output is untracked: fine
    (patched.path / ".llamaspec-build" / "obj.o").write_text("o")
    if damage == "edit-patched":
        (patched.path / "README.md").write_text("one\n")
    elif damage == "edit-other":
        (patched.path / "CMakeLists.txt").write_text("garbage\n")
    elif damage == "unstage":
        run_git(patched.path, "reset", "-q")
        (patched.path / "README.md").write_text("one\ntwo\nthree\n")
    said: list[str] = []
    again = patches.apply(tree, [e], root, said.append)
    assert again == patched
    assert any("damaged" in s for s in said) == (damage != "none"), said
    assert (again.path / "README.md").read_text() == "one\ntwo\nthree\nx\n"
    assert run_git(again.path, "diff", "--cached", "--name-only") == "README.md"
    assert run_git(again.path, "status", "--porcelain", "--untracked-files=no") == "M  README.md"
