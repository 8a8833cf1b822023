"""Commit patches from a throwaway 'upstream' repository: status, lock, export/import."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llamaspec import lock
from llamaspec.config import Landed, PatchEntry, PatchSource, Upstream
from llamaspec.engine import patch_queue as patches
from llamaspec.engine import patch_sources as patchsrc
from llamaspec.engine import sources
from llamaspec.errors import LlamaspecError

from gitrepos import make_engine, make_engine_repo, run_git

pytestmark = pytest.mark.unit
quiet = lambda _m: None  # noqa: E731


@pytest.fixture
def upstream(tmp_path: Path):
    """base → feature (the 'PR', merged) → later; plus a conflicting change and a PR ref."""
    repo = tmp_path / "up"
    base, second = make_engine_repo(repo)
    (repo / "tools/server/server.cpp").write_text("int main() { return 1; }\n// feature\n")
    run_git(repo, "commit", "-qam", "feature (#7)")
    feature = run_git(repo, "rev-parse", "HEAD")
    (repo / "NOTES.md").write_text("later\n")
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-qm", "later")
    later = run_git(repo, "rev-parse", "HEAD")
    run_git(repo, "checkout", "-q", "-b", "pr", base)
    (repo / "tools/server/server.cpp").write_text("int main() { return 2; }\n")
    run_git(repo, "commit", "-qam", "pr change")
    pr_head = run_git(repo, "rev-parse", "HEAD")
    run_git(repo, "update-ref", "refs/pull/9/head", pr_head)
    run_git(repo, "checkout", "-q", "main")
    return repo, {"base": base, "second": second, "feature": feature, "later": later, "pr": pr_head}


def entry(commits=(), **kw) -> PatchEntry:
    return PatchEntry(
        id=kw.pop("id", "feat"),
        engine="llama.cpp",
        title="feature",
        source=PatchSource(commits=tuple(commits), pr_head=kw.pop("pr_head", False)),
        upstream=Upstream(pr=7, url="https://example.invalid/pr/7"),
        state=kw.pop("state", "merged"),
        **kw,
    )


def tree_at(repo: Path, commit: str, engine):
    return sources.fetch(engine, commit, "local", repo, quiet)


def test_commit_patch_applies_on_an_older_base(upstream, tmp_path: Path) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    old = tree_at(repo, c["second"], engine)
    e = entry([c["feature"]])
    patched = patches.apply(old, [e], tmp_path, quiet, engine=engine, patch_source=str(repo))
    assert [p.status for p in patched.patches] == ["applied"]
    assert "// feature" in (patched.path / "tools/server/server.cpp").read_text()
    assert patched.patches[0].source == f"commits:{c['feature'][:12]}"
    assert len(patched.patches[0].sha256) == 64


def test_in_base_by_ancestry_with_history_and_by_content_without(upstream, tmp_path) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    e = entry([c["feature"]])
    with_history = tree_at(repo, c["later"], engine)
    assert "ancestors" in patches.in_base_by_record(e, with_history, engine)
    shallow = sources.fetch(engine, c["later"], "git", None, quiet)  # no history
    assert shallow.has_history is False
    assert patches.in_base_by_record(e, shallow, engine) is None
    texts, _ = patches.texts_for(e, engine, {"patches": {}}, tmp_path, str(repo), quiet)
    assert patches.check(shallow.path, texts) == "in-base"
    patched = patches.apply(shallow, [e], tmp_path, quiet, engine=engine, patch_source=str(repo))
    assert [p.status for p in patched.patches] == ["in-base"]


def test_in_base_by_release_record_needs_no_diff(tmp_path: Path) -> None:
    engine = make_engine("a" * 40, build_number=11312)
    tree = sources.SourceTree(tmp_path, "llama.cpp", "a" * 40, "pypi-sdist", "", False, "k")
    e = entry(["455d8e4be"], landed=Landed(release=8842))
    assert "b8842" in patches.in_base_by_record(e, tree, engine)
    patched = patches.apply(tree, [e], tmp_path, quiet, engine=engine)
    assert [p.status for p in patched.patches] == ["in-base"] and patched.path == tmp_path


def test_conflict_names_the_commit_it_was_written_for(upstream, tmp_path) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    pr_tree = tree_at(repo, c["pr"], engine)
    e = entry([c["feature"]], state="open")
    assert (
        patches.check(
            pr_tree.path,
            patches.texts_for(e, engine, {"patches": {}}, tmp_path, str(repo), quiet)[0],
        )
        == "conflict"
    )
    with pytest.raises(LlamaspecError, match=f"written against {c['feature'][:12]}"):
        patches.apply(pr_tree, [e], tmp_path, quiet, engine=engine, patch_source=str(repo))


def test_short_sha_outside_lock_is_an_error(upstream, tmp_path) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    e = entry([c["feature"][:9]], state="open")
    with pytest.raises(LlamaspecError, match="not resolved in llamaspec.lock"):
        patches.texts_for(e, engine, {"patches": {}}, tmp_path, None, quiet)
    with pytest.raises(LlamaspecError, match="is not a full SHA"):
        patchsrc.commit_diff(engine, c["feature"][:9], None, quiet)


def test_missing_commit_and_offline_without_cache(upstream) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    with pytest.raises(LlamaspecError, match="has no commit"):
        patchsrc.commit_diff(engine, "1" * 40, str(repo), quiet)
    offline = make_engine(c["later"], git_url="https://invalid.invalid/x.git")
    with pytest.raises(LlamaspecError, match="patches export DIR"):
        patchsrc.commit_diff(offline, c["feature"], None, quiet)


def test_lock_resolves_short_shas_and_pr_heads_from_a_mirror(upstream, tmp_path) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    assert patchsrc.resolve_commitish(engine, c["feature"][:9], str(repo)) == c["feature"]
    with pytest.raises(LlamaspecError, match="abbreviated"):
        patchsrc.resolve_commitish(engine, c["feature"][:9], None)
    assert patchsrc.resolve_pr(engine, 9, str(repo)) == [c["pr"]]
    locked = {"engines": {}, "patches": {"feat": [c["feature"]]}}
    lock.save(tmp_path, locked)
    assert lock.load(tmp_path) == {**locked, "models": {}, "cuda_toolkit": {}}
    assert lock.patch_commits(entry([c["feature"][:9]]), locked) == (c["feature"],)
    with pytest.raises(LlamaspecError, match="Run `llamaspec lock`"):
        lock.patch_commits(entry([c["second"]]), locked)


def test_export_and_import_make_diffs_available_offline(upstream, tmp_path, monkeypatch) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    text = patchsrc.commit_diff(engine, c["feature"], str(repo), quiet)
    assert patchsrc.export_diffs(["llama.cpp"], tmp_path / "out") == 1
    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path / "fresh-cache"))
    offline = make_engine(c["later"], git_url="https://invalid.invalid/x.git")
    assert patchsrc.import_diffs(tmp_path / "out") == 1
    assert patchsrc.commit_diff(offline, c["feature"], None, quiet) == text


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-record", "garbage-no-record"])
def test_a_damaged_cached_diff_is_removed_and_fetched_again(upstream, damage: str) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    text = patchsrc.commit_diff(engine, c["feature"], None, quiet)
    cached = patchsrc.diff_cache("llama.cpp") / f"{c['feature']}.diff"
    record = cached.with_name(cached.name + ".sha256")
    assert record.read_text().strip() == hashlib.sha256(text.encode()).hexdigest()
    assert not list(cached.parent.glob(".tmp-*"))  # written via a temp file + rename
    if damage == "truncate":
        cached.write_text(text[: len(text) // 2])
    elif damage == "flip":
        cached.write_text(text.replace("return 1", "return 9"))
    elif damage == "no-record":  # an entry from before digests: adopted when it parses
        record.unlink()
    else:
        record.unlink()
        cached.write_text("not a diff at all\n")
    said: list[str] = []
    assert patchsrc.commit_diff(engine, c["feature"], None, said.append) == text
    fetched = any("fetching commit" in s for s in said)
    assert fetched == (damage != "no-record"), said
    assert cached.read_text() == text and record.is_file()


def test_import_refuses_files_that_are_not_git_diffs(upstream, tmp_path, monkeypatch) -> None:
    repo, c = upstream
    engine = make_engine(c["later"], git_url=repo.as_uri())
    text = patchsrc.commit_diff(engine, c["feature"], None, quiet)
    out = tmp_path / "out"
    assert patchsrc.export_diffs(["llama.cpp"], out) == 1
    exported = out / "llama.cpp" / f"{c['feature']}.diff"
    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path / "fresh-cache"))
    exported.write_text("hello, I am not a diff\n")
    with pytest.raises(LlamaspecError, match="is not a git diff"):
        patchsrc.import_diffs(out)
    exported.write_text(text.replace("return 1", "return 9"))  # a valid diff, but changed
    with pytest.raises(LlamaspecError, match="does not match the sha256 recorded"):
        patchsrc.import_diffs(out)
    exported.with_name(exported.name + ".sha256").unlink()
    exported.write_text(text[: text.rindex("@@")] + "@@ -1,2 +1,3 @@\n+x\n")  # a broken hunk
    with pytest.raises(LlamaspecError, match="not a valid git diff"):
        patchsrc.import_diffs(out)
    assert not list(patchsrc.diff_cache("llama.cpp").iterdir())  # nothing was imported


def test_a_commit_touching_a_non_utf8_file_keeps_its_exact_bytes(upstream, tmp_path) -> None:
    repo, c = upstream
    latin1 = "caf\xe9 na\xefve\n".encode("latin-1")
    (repo / "tools/server/legacy.txt").write_bytes(latin1)
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-qm", "latin-1 file")
    sha = run_git(repo, "rev-parse", "HEAD")
    engine = make_engine(c["later"], git_url=repo.as_uri())
    text = patchsrc.commit_diff(engine, sha, None, quiet)
    assert patchsrc.commit_diff(engine, sha, None, quiet) == text  # the cached copy verifies
    tree = tree_at(repo, c["later"], engine)
    patched = patches.apply(tree, [entry([sha], state="open")], tmp_path, quiet, engine=engine,
                            lock={"engines": {}, "patches": {}})  # fmt: skip
    assert (patched.path / "tools/server/legacy.txt").read_bytes() == latin1


def test_a_history_pin_is_judged_by_its_own_record() -> None:
    """A history pin's record (config.record_for) carries its date, so a fix that landed
    before it is in base there, and one that landed later is not; the default record,
    whose pin is another commit, judges nothing by date for that tree."""
    from llamaspec import config

    root = Path(__file__).resolve().parents[2]
    ik = config.load_engines(root)["ik_llama.cpp"]
    entry = next(e for e in config.load_series(root) if e.id == "ik-cpu-load-on-cuda-build")
    assert entry.landed and entry.landed.date.isoformat() == "2026-06-26"
    for h in ik.history:
        tree = sources.SourceTree(Path("/nonexistent"), ik.name, h.pin, "git", "", False, h.pin)
        record = config.record_for(ik, h.pin)
        assert record is not None
        why = patches.in_base_by_record(entry, tree, record)
        assert (why is not None) == (h.date >= entry.landed.date), (h, why)
        assert patches.in_base_by_record(entry, tree, ik) is None
