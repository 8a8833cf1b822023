"""Patch series: commits chained by `requires`, files left out (`exclude`) and carried by a
project patch (`adapts`); and the ik_llama.cpp speculative-checkpoint series in the catalog."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

import pytest

from llamaspec import config
from llamaspec.config import Landed, PatchEntry, PatchSource
from llamaspec.engine import patch_queue as patches
from llamaspec.engine import sources
from llamaspec.errors import LlamaspecError
from llamaspec.proof.defects import defects_for

from gitrepos import make_engine, run_git

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
IK_PIN = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
SERIES = ["ik-hybrid-spec-guard", "ik-delta-net-sync", "ik-spec-checkpoints"]
SERIES += ["ik-spec-checkpoints-adapt", "ik-spec-checkpoints-fixes"]
quiet = lambda _m: None  # noqa: E731


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-qm", message)
    return run_git(repo, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path: Path):
    """pin → guard → feature → checkpoints: `checkpoints` edits the guard's lines (so it
    needs `guard` first) and a line next to `feature` (so that file is left out and
    rewritten by a project patch)."""
    repo = tmp_path / "up"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    pin = commit(
        repo,
        {
            "CMakeLists.txt": "project(t)\n",
            "tools/server/server.cpp": "load();\nserve();\n",
            "core.cpp": "one\ntwo\nthree\n",
            "side.cpp": "s1\ns2\ns3\n",
        },
        "pin",
    )
    guard = commit(repo, {"tools/server/server.cpp": "load();\nrefuse();\nserve();\n"}, "guard")
    feature = commit(repo, {"side.cpp": "s1\nfeature\ns2\ns3\n"}, "feature")
    ckpt = commit(
        repo,
        {
            "tools/server/server.cpp": "load();\nserve();\nrestore();\n",
            "core.cpp": "one\ntwo\nthree\nsave();\n",
            "side.cpp": "s1\nfeature\ns2\nckpt\ns3\n",
        },
        "checkpoints",
    )
    root = tmp_path / "root"
    (root / "patches" / "llama.cpp").mkdir(parents=True)
    # the project's rewrite of side.cpp for trees without `feature`
    (root / "patches" / "llama.cpp" / "adapt.patch").write_text(
        "--- a/side.cpp\n+++ b/side.cpp\n@@ -1,3 +1,4 @@\n s1\n s2\n+ckpt\n s3\n"
    )
    series = [
        PatchEntry(
            id="guard", engine="llama.cpp", title="guard", state="merged",
            source=PatchSource(commits=(guard,)), default=False,
        ),
        PatchEntry(
            id="ckpt", engine="llama.cpp", title="checkpoints", state="merged",
            source=PatchSource(commits=(ckpt,), exclude=("side.cpp",)), default=False,
            requires=("guard", "ckpt-adapt"), landed=Landed(date="2026-04-24"),
        ),
        PatchEntry(
            id="ckpt-adapt", engine="llama.cpp", title="adapt", state="project",
            source=PatchSource(file="adapt.patch"), default=False, adapts="ckpt",
        ),
    ]  # fmt: skip
    shas = {"pin": pin, "guard": guard, "feature": feature, "ckpt": ckpt}
    return repo, root, series, shas


def test_selecting_the_last_member_pulls_the_series_in_catalog_order(history) -> None:
    _repo, _root, series, _ = history
    ids = lambda chosen: [p.id for p in chosen]  # noqa: E731
    assert ids(patches.select(series, "llama.cpp", ["ckpt"])) == ["guard", "ckpt", "ckpt-adapt"]
    # an adapting patch brings the entry it adapts (and so the rest)
    assert ids(patches.select(series, "llama.cpp", ["ckpt-adapt"], no_defaults=True)) == [
        "guard",
        "ckpt",
        "ckpt-adapt",
    ]
    assert ids(patches.select(series, "llama.cpp", ["guard"])) == ["guard"]
    with pytest.raises(LlamaspecError) as err:
        patches.select(series, "llama.cpp", ["ckpt"], exclude=["guard"])
    assert "'ckpt' requires 'guard', which --no-patch guard excludes" in err.value.message
    assert "--no-patch ckpt" in err.value.message


def test_series_applies_at_the_old_pin_with_the_excluded_file_rewritten(history) -> None:
    repo, root, series, shas = history
    engine = make_engine(shas["pin"])
    tree = sources.fetch(engine, shas["pin"], "local", repo, quiet)
    chosen = patches.select(series, "llama.cpp", ["ckpt"])
    out = patches.apply(tree, chosen, root, quiet, engine=engine, patch_source=str(repo))
    assert [(p.id, p.status) for p in out.patches] == [
        ("guard", "applied"),
        ("ckpt", "applied"),
        ("ckpt-adapt", "applied"),
    ]
    assert "without side.cpp" in out.patches[1].source
    assert (out.path / "tools/server/server.cpp").read_text() == "load();\nserve();\nrestore();\n"
    assert (out.path / "core.cpp").read_text().endswith("save();\n")
    # the project patch's version of side.cpp, not the commit's (which needs `feature`)
    assert (out.path / "side.cpp").read_text() == "s1\ns2\nckpt\ns3\n"


def test_status_judges_a_member_on_top_of_the_members_before_it(history) -> None:
    repo, root, series, shas = history
    engine = make_engine(shas["pin"])
    tree = sources.fetch(engine, shas["pin"], "local", repo, quiet)
    lock = {"engines": {}, "patches": {}}
    judged = patches.judge_series(series, tree, engine, lock, root, str(repo), quiet)
    assert [(j.id, j.status) for j in judged] == [
        ("guard", "applies"),
        ("ckpt", "applies"),
        ("ckpt-adapt", "applies"),
    ]
    assert judged[1].note == "applies after guard"
    # alone, the member's diff meets the pin without the guard's lines
    alone = patches.judge(series[1], tree, engine, lock, root, str(repo), quiet)
    assert alone.status == "conflict"


def test_series_at_a_pin_that_has_it_is_skipped_and_says_so(history) -> None:
    repo, root, series, shas = history
    engine = make_engine(shas["pin"])
    later = sources.fetch(engine, shas["ckpt"], "local", repo, quiet)
    said: list[str] = []
    chosen = patches.select(series, "llama.cpp", ["ckpt"])
    out = patches.apply(later, chosen, root, said.append, engine=engine, patch_source=str(repo))
    assert [p.status for p in out.patches] == ["in-base"] * 3
    assert out.path == later.path and not out.applied  # nothing copied, nothing applied
    assert "patches: ckpt: in-base (its commits are ancestors of the pin)" in said
    assert any(s.startswith("patches: ckpt-adapt: in-base (it adapts ckpt") for s in said)
    judged = patches.judge_series(series, later, engine, {"patches": {}}, root, None, quiet)
    assert [j.status for j in judged] == ["in-base"] * 3


def test_a_member_missing_from_the_diff_cache_names_its_sha_and_the_way_to_get_it(
    history,
) -> None:
    repo, root, series, shas = history
    engine = make_engine(shas["pin"], git_url="https://invalid.invalid/engine.git")
    tree = sources.fetch(engine, shas["pin"], "local", repo, quiet)
    chosen = patches.select(series, "llama.cpp", ["ckpt"])
    with pytest.raises(LlamaspecError) as err:
        patches.apply(tree, chosen, root, quiet, engine=engine)
    msg = err.value.message
    assert f"Patch 'guard' (guard) needs the diff of its commit, {shas['guard']}" in msg
    assert f"has no {shas['guard']}.diff" in msg
    assert "llamaspec patches import DIR" in msg and "--patch-source DIR" in msg


def test_excluding_a_file_the_commits_do_not_touch_is_an_error(history) -> None:
    repo, root, series, shas = history
    engine = make_engine(shas["pin"])
    bad = series[1].model_copy(
        update={"source": PatchSource(commits=(shas["ckpt"],), exclude=("sidee.cpp",))}
    )
    with pytest.raises(LlamaspecError, match="excludes sidee.cpp, which its commits do not"):
        patches.texts_for(bad, engine, {"patches": {}}, root, str(repo), quiet)


SCHEMA_BASE = """\
patches:
  - id: guard
    engine: ik_llama.cpp
    title: g
    state: merged
    source: {commits: [%(sha)s]}
  - id: ckpt
    engine: ik_llama.cpp
    title: c
    state: merged
    source: {commits: [%(sha)s], exclude: [common/x.cpp]}
    requires: [guard, adapt]
  - id: adapt
    engine: ik_llama.cpp
    title: a
    state: project
    source: {file: a.patch}
    adapts: ckpt
"""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("exclude: [common/x.cpp]}", "exclude: [../x.cpp]}"), "x.cpp"),
        (("    adapts: ckpt\n", "    adapts: guardd\n"), "Did you mean 'guard'"),
        (("requires: [guard, adapt]", "requires: [guard]"), "in 'ckpt''s requires"),
        (("    state: project\n", "    state: merged\n"), "`adapts` is for project patches"),
        (("source: {file: a.patch}", "source: {file: a.patch, exclude: [y]}"), "needs `commits`"),
    ],
)
def test_series_schema_errors(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    text = SCHEMA_BASE % {"sha": "a" * 40}
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series.yaml").write_text(text)
    assert [p.id for p in config.load_series(tmp_path)] == ["guard", "ckpt", "adapt"]
    assert edit[0] in text
    (tmp_path / "patches" / "series.yaml").write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(LlamaspecError, match=message):
        config.load_series(tmp_path)


def test_a_defect_fixed_by_an_unknown_patch_id_is_refused(tmp_path: Path) -> None:
    text = SCHEMA_BASE % {"sha": "a" * 40} + (
        "defects:\n  - id: d\n    engine: ik_llama.cpp\n    pins: [%s]\n"
        "    symptom: corrupt-output\n    summary: s\n    fixed_by: ckpr\n" % ("b" * 40)
    )
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series.yaml").write_text(text)
    with pytest.raises(LlamaspecError, match="not a catalog patch for ik_llama.cpp.*'ckpt'"):
        config.load_defects(tmp_path)
    (tmp_path / "patches" / "series.yaml").write_text(text.replace("ckpr", "ckpt"))
    assert config.load_defects(tmp_path)[0].fixed_by == "ckpt"


# --- the catalog's own series -------------------------------------------------------------


def catalog() -> dict[str, PatchEntry]:
    return {p.id: p for p in config.load_series(ROOT)}


def test_ik_checkpoint_series_is_full_shas_landed_dates_and_requires() -> None:
    cat = catalog()
    chosen = patches.select(list(cat.values()), "ik_llama.cpp", ["ik-spec-checkpoints"])
    ids = [p.id for p in chosen]
    # the defaults (port, build info) plus the whole series, in catalog order
    assert ids == ["ik-spec-port", "ik-build-info", "ik-cpu-load-on-cuda-build", *SERIES]
    head = cat["ik-spec-checkpoints"]
    assert head.source.commits == ("ea94afe777e8dbfbd7ffddd3b33966db68eca20b",)
    assert head.landed and str(head.landed.date) == "2026-04-24"
    for pid in SERIES[:3]:
        (sha,) = cat[pid].source.commits
        assert config.FULL_SHA.match(sha) and cat[pid].state == "merged" and cat[pid].landed
    assert cat["ik-checkpoint-restore"].requires == ("ik-spec-checkpoints",)


def test_ik_adapting_patch_rewrites_exactly_the_files_left_out() -> None:
    cat = catalog()
    adapt = cat["ik-spec-checkpoints-adapt"]
    assert adapt.adapts == "ik-spec-checkpoints" and adapt.title.startswith("ik #1669")
    text = patches.patch_file(adapt, ROOT).read_text()
    touched = sorted(set(patches._OUTSIDE.findall(text)) - {"/dev/null"})
    assert touched == sorted(cat["ik-spec-checkpoints"].source.exclude)


def test_ik_series_is_in_base_by_date_at_a_pin_after_it() -> None:
    cat = catalog()
    engine = config.load_engines(ROOT)["ik_llama.cpp"]
    later = engine.model_copy(update={"pin": "c" * 40, "pin_date": dt.date(2026, 5, 1)})
    tree = sources.SourceTree(
        engine="ik_llama.cpp", commit="c" * 40, path=ROOT, origin="pypi-sdist",
        origin_detail="", has_history=False, content_key="x",
    )  # fmt: skip
    for pid in SERIES[:3]:
        assert patches.in_base_by_record(cat[pid], tree, later)
    at_pin = dataclasses.replace(tree, commit=IK_PIN)
    assert patches.in_base_by_record(cat["ik-spec-checkpoints"], at_pin, engine) is None


def test_ik_cpu_load_fix_is_default_and_in_base_once_ik_fixed_it() -> None:
    """The project patch for a CUDA build without a GPU carries ik #2037's fix: in base by
    date from 2026-06-26 (its text differs from #2037's, so only the record can tell), never
    before; a project patch without `landed` is never in base by record."""
    cat = catalog()
    fix = cat["ik-cpu-load-on-cuda-build"]
    assert fix.default and fix.state == "project" and fix.upstream and fix.upstream.pr == 2037
    engine = config.load_engines(ROOT)["ik_llama.cpp"]
    tree = sources.SourceTree(
        engine="ik_llama.cpp", commit="c" * 40, path=ROOT, origin="pypi-sdist",
        origin_detail="", has_history=False, content_key="x",
    )  # fmt: skip
    after = engine.model_copy(update={"pin": "c" * 40, "pin_date": dt.date(2026, 6, 26)})
    before = engine.model_copy(update={"pin": "c" * 40, "pin_date": dt.date(2026, 6, 25)})
    assert "merged 2026-06-26" in str(patches.in_base_by_record(fix, tree, after))
    assert patches.in_base_by_record(fix, tree, before) is None
    assert patches.in_base_by_record(cat["ik-spec-full-output"], tree, after) is None
    text = patches.patch_file(fix, ROOT).read_text()
    assert "+++ b/src/llama.cpp" in text and "device_mem.size()" in text


def test_ik_hybrid_defect_names_the_series_and_stops_with_it_applied() -> None:
    manifest = {"engine": "ik_llama.cpp", "commit": IK_PIN, "patches": []}
    (d,) = [d for d in defects_for(manifest) if d.id == "ik-hybrid-speculation-corrupts"]
    assert d.fixed_by == "ik-spec-checkpoints" and "issues/1639" in d.issue
    assert "--patch ik-spec-checkpoints" in d.describe()
    manifest["patches"] = [{"id": i, "status": "applied"} for i in SERIES]
    assert "ik-hybrid-speculation-corrupts" not in [d.id for d in defects_for(manifest)]
    (short,) = [d for d in defects_for(manifest) if d.id == "ik-spec-short-output"]
    assert "build with --patch ik-spec-full-output" in short.describe()
    manifest["patches"].append({"id": "ik-spec-full-output", "status": "applied"})
    assert [d.id for d in defects_for(manifest)] == [
        "ik-hybrid-parallel-slots",
        "ik-mtp-parallel-slots",
        "ik-parallel-slots",
    ]


def test_verify_runs_the_hybrid_model_by_default_only_without_the_hybrid_defect() -> None:
    from types import SimpleNamespace

    from llamaspec.proof.suite import default_models

    def art(patched: list[str], engine: str = "ik_llama.cpp") -> SimpleNamespace:
        applied = [{"id": i, "status": "applied"} for i in patched]
        return SimpleNamespace(manifest={"engine": engine, "commit": IK_PIN, "patches": applied})

    assert default_models(art([])) == ["embedded"]  # known to corrupt: --model hybrid shows it
    # the series fixes the corruption; parallel slots still diverge at this pin, without it too
    assert default_models(art(SERIES)) == ["embedded"]
    later = art(SERIES)
    later.manifest["commit"] = "d" * 40
    assert default_models(later) == ["embedded", "hybrid"]
    assert default_models(art([], engine="llama.cpp")) == ["embedded", "hybrid"]
