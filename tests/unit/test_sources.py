"""Fetch stage against throwaway repositories: shallow fetch by SHA, local trees, bad input."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from llamaspec.engine import sources
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

from gitrepos import make_engine, make_engine_repo, run_git

pytestmark = pytest.mark.unit


def quiet(_msg: str) -> None:
    return None


def test_git_fetch_is_shallow_exact_and_cached(tmp_path: Path) -> None:
    first, _second = make_engine_repo(tmp_path / "up")
    engine = make_engine(first, git_url=(tmp_path / "up").as_uri())
    tree = sources.fetch(engine, None, "git", None, quiet)
    assert tree.commit == first and tree.origin == "git"
    assert run_git(tree.path, "rev-parse", "HEAD") == first
    assert run_git(tree.path, "rev-parse", "--is-shallow-repository") == "true"
    assert "four" not in (tree.path / "README.md").read_text()
    messages: list[str] = []
    again = sources.fetch(engine, None, "git", None, messages.append)
    assert again == tree and "cached" in messages[0]


def test_git_fetch_of_missing_commit_is_clear(tmp_path: Path) -> None:
    first, _ = make_engine_repo(tmp_path / "up")
    engine = make_engine(first, git_url=(tmp_path / "up").as_uri())
    with pytest.raises(LlamaspecError, match="has no commit " + "1" * 40):
        sources.fetch(engine, "1" * 40, "git", None, quiet)
    assert not list((cache_dir() / "sources" / "llama.cpp").glob("1111*"))


def test_short_pin_is_rejected_before_any_work(tmp_path: Path) -> None:
    engine = make_engine("a" * 40)
    with pytest.raises(LlamaspecError, match="not a full 40-character commit SHA"):
        sources.fetch(engine, "0c1e570", "git", None, quiet)


def test_unreachable_remote_without_mirror_says_so(tmp_path: Path) -> None:
    engine = make_engine("a" * 40, git_url="https://invalid.invalid/llama.cpp")
    with pytest.raises(LlamaspecError, match="Cannot fetch llama.cpp@aaaaaaaaaaaa: cannot reach"):
        sources.fetch(engine, None, "auto", None, quiet)


def test_local_checkout_any_commit(tmp_path: Path) -> None:
    first, second = make_engine_repo(tmp_path / "co")
    engine = make_engine(second)
    tree = sources.fetch(engine, first, "local", tmp_path / "co", quiet)
    assert tree.commit == first and tree.has_history
    head = sources.fetch(engine, None, "local", tmp_path / "co", quiet)
    assert head.commit == second and "four" in (head.path / "README.md").read_text()


def test_local_plain_directory_is_snapshotted_by_content(tmp_path: Path) -> None:
    first, _ = make_engine_repo(tmp_path / "co")
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("CMakeLists.txt", "README.md"):
        (plain / name).write_text((tmp_path / "co" / name).read_text())
    (plain / "tools" / "server").mkdir(parents=True)
    engine = make_engine(first)
    a = sources.fetch(engine, None, "local", plain, quiet)
    b = sources.fetch(engine, None, "local", plain, quiet)
    assert a.content_key == b.content_key and a.commit is None
    (plain / "README.md").write_text("changed\n")
    assert sources.fetch(engine, None, "local", plain, quiet).content_key != a.content_key


@pytest.mark.parametrize("kind", ["missing", "not-engine"])
def test_bad_source_dir(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "x"
    if kind == "not-engine":
        path.mkdir()
        (path / "hello.txt").write_text("hi")
    engine = make_engine("a" * 40)
    match = "does not exist" if kind == "missing" else "is not a llama.cpp source tree"
    with pytest.raises(LlamaspecError, match=match):
        sources.fetch(engine, None, "local", path, quiet)


def test_pypi_only_mirrors_the_default_pin() -> None:
    engine = make_engine("a" * 40)
    with pytest.raises(LlamaspecError, match="no PyPI mirror"):
        sources.fetch(engine, "b" * 40, "pypi", None, quiet)


def test_interrupted_fetch_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    final = cache_dir() / "sources" / "x" / "tree"
    with pytest.raises(KeyboardInterrupt), sources.staging(final) as tmp:
        (tmp / "half").write_text("partial")
        raise KeyboardInterrupt
    assert not final.exists()
    assert not list(final.parent.glob(".tmp-*"))


def test_stale_staging_dirs_from_dead_processes_are_removed() -> None:
    parent = cache_dir() / "sources" / "x"
    stale = parent / ".tmp-tree-999999999-abc"
    stale.mkdir(parents=True)
    with sources.staging(parent / "other") as tmp:
        (tmp / "f").write_text("x")
    assert not stale.exists() and (parent / "other" / "f").is_file()


def test_sdist_extraction_drops_gitlinks_and_keeps_subdir(tmp_path: Path) -> None:
    root = tmp_path / "pkg-1.0" / "vendor" / "eng"
    (root / "tools" / "server").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("x")
    (root / ".git").write_text("gitdir: ../../.git/modules/vendor/eng\n")
    (tmp_path / "pkg-1.0" / "setup.py").write_text("")
    sdist = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(tmp_path / "pkg-1.0", arcname="pkg-1.0")
    dest = tmp_path / "out"
    dest.mkdir()
    sources._extract_subdir(sdist, "vendor/eng", dest)
    assert (dest / "CMakeLists.txt").is_file() and not (dest / ".git").exists()
    assert not (dest / "setup.py").exists()


@pytest.mark.parametrize("damage", ["edit", "delete", "head", "meta", "no-git"])
def test_a_damaged_cached_tree_is_removed_and_fetched_again(tmp_path: Path, damage: str) -> None:
    first, _second = make_engine_repo(tmp_path / "up")
    engine = make_engine(first, git_url=(tmp_path / "up").as_uri())
    tree = sources.fetch(engine, None, "git", None, quiet)
    build = tree.path / ".llamaspec-build" / "x"  # untracked build output does not count
    build.mkdir(parents=True)
    (build / "obj.o").write_text("o")
    messages: list[str] = []
    assert sources.fetch(engine, None, "git", None, messages.append) == tree
    assert "cached" in messages[0]
    readme = tree.path / "README.md"
    if damage == "edit":
        readme.write_text("one\ntwo\nthree\nGARBAGE\n")
    elif damage == "delete":
        readme.unlink()
    elif damage == "head":
        run_git(tree.path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                "--allow-empty", "-m", "moved")  # fmt: skip
    elif damage == "meta":
        (tree.path.parent / f"{tree.path.name}.json").write_text("{not json")
    else:
        import shutil

        shutil.rmtree(tree.path / ".git")
    messages.clear()
    again = sources.fetch(engine, None, "git", None, messages.append)
    assert "damaged" in messages[0] and "fetching" in messages[1], messages
    assert again == tree and readme.read_text() == "one\ntwo\nthree\n"
    assert run_git(again.path, "rev-parse", "HEAD") == first


def test_a_damaged_snapshot_of_a_plain_tree_is_made_again(tmp_path: Path) -> None:
    first, _ = make_engine_repo(tmp_path / "co")
    plain = tmp_path / "plain"
    (plain / "tools" / "server").mkdir(parents=True)
    (plain / "CMakeLists.txt").write_text("x\n")
    engine = make_engine(first)
    tree = sources.fetch(engine, None, "local", plain, quiet)
    (tree.path / "CMakeLists.txt").write_text("damaged\n")
    messages: list[str] = []
    again = sources.fetch(engine, None, "local", plain, messages.append)
    assert any("damaged" in m for m in messages), messages
    assert again.path == tree.path and (again.path / "CMakeLists.txt").read_text() == "x\n"
