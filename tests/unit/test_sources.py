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


# --- history pins from a PyPI sdist (engines.yaml `history`) ------------------------------


def make_sdist(
    tmp_path: Path,
    repo: Path,
    commit: str,
    record: str | None = None,
    tamper: bool = False,
    subdir: str = "vendor/eng",
) -> tuple[Path, str]:
    """A real sdist tarball vendoring `commit` of `repo` under `subdir`, with the submodule
    record git leaves (`.git/modules/<subdir>/HEAD` naming `record`, and its index) unless
    `record` is ""; `tamper` edits one vendored file after the index was taken. Returns the
    tarball and its sha256."""
    top = tmp_path / "sdist" / "pkg-1.0"
    vendored = top / subdir
    vendored.parent.mkdir(parents=True)
    run_git(tmp_path, "clone", "-q", repo, vendored)
    run_git(vendored, "checkout", "-q", "--detach", commit)
    if record != "":
        modules = top / ".git" / "modules" / subdir
        modules.mkdir(parents=True)
        (modules / "HEAD").write_text(f"{record or commit}\n")
        (modules / "index").write_bytes((vendored / ".git" / "index").read_bytes())
    import shutil

    shutil.rmtree(vendored / ".git")
    (vendored / ".git").write_text(f"gitdir: ../../.git/modules/{subdir}\n")
    if tamper:
        (vendored / "README.md").write_text("patched by the packager\n")
    (top / "setup.py").write_text("")
    sdist = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(top, arcname="pkg-1.0")
    return sdist, sources.sha256_file(sdist)


def history_engine(default: str, old: str, sha256: str, subdir: str = "vendor/eng") -> object:
    from llamaspec.config import HistoryPin, PypiMirror

    mirror = PypiMirror(package="pkg", version="1.0", sha256=sha256, subdir=subdir)
    entry = HistoryPin(pin=old, date="2026-03-01", note="an older build", pypi=mirror)
    return make_engine(default, history=(entry,))


def place_download(sdist: Path) -> None:
    """Put the sdist where download_sdist finds it (no pip, no network)."""
    dest = cache_dir() / "downloads"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / sdist.name).write_bytes(sdist.read_bytes())


def test_a_history_pin_comes_from_its_sdist_checked_against_its_record(tmp_path: Path) -> None:
    old, new = make_engine_repo(tmp_path / "up")
    sdist, digest = make_sdist(tmp_path, tmp_path / "up", old)
    place_download(sdist)
    engine = history_engine(new, old, digest)
    messages: list[str] = []
    tree = sources.fetch(engine, old, "pypi", None, messages.append)
    assert tree.commit == old and tree.origin == "pypi-sdist"
    assert tree.path.name == f"{old}-pypi" and "four" not in (tree.path / "README.md").read_text()
    assert "pkg==1.0 sha256:" + digest in tree.origin_detail
    assert any("is commit" in m and "3 files match its recorded index" in m for m in messages)
    messages.clear()
    entry, again = sources.fetch_pin(engine, old, messages.append)
    assert again == tree and entry.pin == old and "cached" in messages[0]


def test_a_history_sdist_that_vendors_another_commit_is_refused(tmp_path: Path) -> None:
    old, new = make_engine_repo(tmp_path / "up")
    sdist, digest = make_sdist(tmp_path, tmp_path / "up", old, record=new)
    place_download(sdist)
    engine = history_engine(new, old, digest)
    with pytest.raises(LlamaspecError, match=f"vendors vendor/eng at commit {new} .*, not {old}"):
        sources.fetch(engine, old, "pypi", None, quiet)
    assert not (cache_dir() / "sources" / "llama.cpp" / f"{old}-pypi").exists()


def test_a_history_sdist_whose_files_differ_from_its_index_is_refused(tmp_path: Path) -> None:
    old, new = make_engine_repo(tmp_path / "up")
    sdist, digest = make_sdist(tmp_path, tmp_path / "up", old, tamper=True)
    place_download(sdist)
    engine = history_engine(new, old, digest)
    with pytest.raises(LlamaspecError, match=r"differs from the index .* e\.g\. README\.md"):
        sources.fetch(engine, old, "pypi", None, quiet)


def test_a_history_sdist_without_a_git_record_is_taken_on_its_sha256(tmp_path: Path) -> None:
    old, new = make_engine_repo(tmp_path / "up")
    sdist, digest = make_sdist(tmp_path, tmp_path / "up", old, record="")
    place_download(sdist)
    messages: list[str] = []
    tree = sources.fetch(history_engine(new, old, digest), old, "pypi", None, messages.append)
    assert tree.commit == old
    assert any("keeps no git record" in m for m in messages), messages


def test_a_history_sdist_lacking_the_subdir_is_refused(tmp_path: Path) -> None:
    old, new = make_engine_repo(tmp_path / "up")
    sdist, digest = make_sdist(tmp_path, tmp_path / "up", old)
    place_download(sdist)
    engine = history_engine(new, old, digest, subdir="vendor/other")
    with pytest.raises(LlamaspecError, match="has no directory 'vendor/other'"):
        sources.fetch(engine, old, "pypi", None, quiet)


def test_a_history_sdist_with_a_bad_sha256_is_deleted_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    old, new = make_engine_repo(tmp_path / "up")
    sdist, _digest = make_sdist(tmp_path, tmp_path / "up", old)

    def fake_pip(cmd: list[str], **_kw: object) -> subprocess.CompletedProcess[str]:
        dest = Path(cmd[cmd.index("--dest") + 1])
        (dest / sdist.name).write_bytes(sdist.read_bytes())  # what the index served
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(sources.procs, "run", fake_pip)
    engine = history_engine(new, old, "0" * 64)
    with pytest.raises(LlamaspecError, match="has sha256 .* but engines.yaml expects 0000"):
        sources.fetch(engine, old, "pypi", None, quiet)
    assert not list((cache_dir() / "downloads").glob("pkg*"))


def test_pypi_refusal_lists_the_mirrored_pins(tmp_path: Path) -> None:
    engine = history_engine("a" * 40, "b" * 40, "c" * 64)
    with pytest.raises(
        LlamaspecError, match=r"no PyPI mirror of llama.cpp@dddd.*bbbbbbbbbbbb \(pkg==1.0\)"
    ):
        sources.fetch(engine, "d" * 40, "pypi", None, quiet)
    sources.check_request(engine, "b" * 40, "pypi", None)  # a history pin passes the check


def test_fetch_pin_refuses_a_pin_outside_the_list(tmp_path: Path) -> None:
    engine = history_engine("a" * 40, "b" * 40, "c" * 64)
    with pytest.raises(LlamaspecError, match="neither the default pin nor in engines.yaml's"):
        sources.fetch_pin(engine, "d" * 40, quiet)


def test_a_git_history_pin_comes_from_a_bare_mirror(tmp_path: Path) -> None:
    from llamaspec.config import HistoryPin

    old, new = make_engine_repo(tmp_path / "up")
    run_git(tmp_path, "clone", "-q", "--mirror", tmp_path / "up", tmp_path / "mirror.git")
    later = HistoryPin(pin=new, date="2026-08-06", note="a later fix")
    engine = make_engine(old, git_url="https://invalid.invalid/ik", history=(later,))
    entry, tree = sources.fetch_pin(engine, new, quiet, source_dir=tmp_path / "mirror.git")
    assert entry is later and tree.commit == new and tree.origin == "local" and tree.has_history
    assert "four" in (tree.path / "README.md").read_text()


def test_an_unreachable_remote_falls_back_to_a_history_pins_sdist(tmp_path: Path) -> None:
    old, new = make_engine_repo(tmp_path / "up")
    sdist, digest = make_sdist(tmp_path, tmp_path / "up", old)
    place_download(sdist)
    engine = history_engine(new, old, digest).model_copy(
        update={"git_url": "https://invalid.invalid/llama.cpp"}
    )
    messages: list[str] = []
    tree = sources.fetch(engine, old, "auto", None, messages.append)
    assert tree.origin == "pypi-sdist" and any("using the PyPI mirror" in m for m in messages)


def test_a_mirror_lacking_a_blob_gives_a_tree_that_stays_cached(tmp_path: Path) -> None:
    """git checks out what it has and warns about the rest (exit 0): the files it could not
    write are left out on purpose, so the cached tree is not 'damaged' on the next fetch."""
    first, second = make_engine_repo(tmp_path / "up")
    (tmp_path / "up" / "big.bin").write_text("large\n")
    run_git(tmp_path / "up", "add", "big.bin")
    run_git(tmp_path / "up", "commit", "-q", "-m", "big")
    third = run_git(tmp_path / "up", "rev-parse", "HEAD")
    run_git(tmp_path, "init", "-q", "--bare", "mirror.git")
    run_git(tmp_path / "up", "push", "-q", tmp_path / "mirror.git", "main")
    blob = run_git(tmp_path / "up", "rev-parse", "HEAD:big.bin")
    (tmp_path / "mirror.git" / "objects" / blob[:2] / blob[2:]).unlink()  # pushed loose
    engine = make_engine(first)
    messages: list[str] = []
    tree = sources.fetch(engine, third, "local", tmp_path / "mirror.git", messages.append)
    assert not (tree.path / "big.bin").exists() and (tree.path / "README.md").is_file()
    assert any("lacks the contents of 1 file(s)" in m and "big.bin" in m for m in messages)
    messages.clear()
    assert sources.fetch(engine, third, "local", tmp_path / "mirror.git", messages.append) == tree
    assert "cached" in messages[0] and not any("damaged" in m for m in messages)
    assert second != third
