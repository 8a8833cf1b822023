"""`llamaspec maint health`: the regression rule, the runner with fake steps (a failed build
recorded and the run going on, resume), the Markdown matrix, and the CLI's bad input."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from llamaspec.cli.main import main
from llamaspec.errors import LlamaspecError
from llamaspec.maint import health
from llamaspec.maint import health_report as hr
from llamaspec.maint.health_report import HealthPin, HealthReport, Row

pytestmark = pytest.mark.unit


def pin(n: int, engine: str = "llama.cpp", label: str = "") -> HealthPin:
    return HealthPin(engine, f"{n:x}" * 40, f"2026-0{n}-01", label or f"b{n}")


def row(n: int, engine: str = "llama.cpp", **kw) -> Row:
    return Row(pin=pin(n, engine), artifact=f"a{n}", **kw)


def metrics(rows: list[Row]) -> list[tuple[str, str, str]]:
    return [
        (f.pin[len(f.engine) + 1 :][:1], f.since[len(f.engine) + 1 :][:1], f.metric)
        for f in hr.regressions(rows)
    ]


# --- the regression rule -------------------------------------------------------------------


def test_a_speedup_drop_beyond_the_threshold_is_flagged_and_one_within_it_is_not() -> None:
    drop = 1 - hr.SPEEDUP_DROP
    rows = [
        row(1, speedups={"copy": 2.0, "qa": 1.2}),
        row(2, speedups={"copy": 2.0 * drop * 0.99, "qa": 1.2 * drop * 1.01}),
    ]
    assert metrics(rows) == [("2", "1", "speedup copy")]
    (flag,) = hr.regressions(rows)
    assert flag.before == 2.0 and "since 1111111" in flag.describe()


def test_an_overhead_rise_beyond_the_threshold_is_flagged() -> None:
    rise = 1 + hr.OVERHEAD_RISE
    assert metrics([row(1, overhead_ms=4.0), row(2, overhead_ms=4.0 * rise * 1.01)]) == [
        ("2", "1", "overhead")
    ]
    assert metrics([row(1, overhead_ms=4.0), row(2, overhead_ms=4.0 * rise * 0.99)]) == []
    assert metrics([row(1, overhead_ms=4.0), row(2, overhead_ms=1.0)]) == []  # faster: fine


def test_exactness_lost_is_flagged_and_exactness_gained_is_not() -> None:
    rows = [
        row(1, exact={"draft": True, "ngram-mod": False}),
        row(2, exact={"draft": False, "ngram-mod": True}),
    ]
    assert metrics(rows) == [("2", "1", "exact draft")]
    assert "draft no longer exact" in hr.regressions(rows)[0].describe()


def test_a_method_whose_server_crashed_is_shown_apart_and_counts_as_not_exact(
    tmp_path: Path,
) -> None:
    crashed = {"ngram-map-k": "llama-server died (exit -6)."}
    later = row(
        2,
        types=("draft", "ngram-map-k"),
        exact={"draft": True, "ngram-map-k": False},
        crashed=crashed,
    )
    rows = [row(1, exact={"draft": True, "ngram-map-k": True}), later]
    assert metrics(rows) == [("2", "1", "exact ngram-map-k")]
    assert hr._exact_cell(later) == "exact: draft; crashed: ngram-map-k"
    md = hr.markdown(HealthReport(rows=tuple(rows), complete=True))
    assert "strict ngram-map-k: llama-server died (exit -6)." in md
    hr.write(HealthReport(rows=(later,), complete=True), tmp_path)
    assert hr.read(tmp_path / "health.json").rows == (later,)


def test_types_run_on_one_slot_only_are_said_so(tmp_path: Path) -> None:
    r = row(1, types=("draft", "ngram-mod"), exact={"draft": True, "ngram-mod": True})
    one = Row(**{**r.__dict__, "one_slot": ("draft", "ngram-mod")})
    assert hr._exact_cell(one) == "all exact (one slot only)"
    md = hr.markdown(HealthReport(rows=(one,), complete=True))
    assert "draft, ngram-mod ran one request at a time on one slot" in md
    hr.write(HealthReport(rows=(one,), complete=True), tmp_path)
    assert hr.read(tmp_path / "health.json").rows == (one,)


def test_only_consecutive_builds_of_the_same_engine_are_compared() -> None:
    rows = [
        row(1, speedups={"copy": 2.0}),
        row(2, "ik_llama.cpp", speedups={"copy": 1.0}),  # another engine: not compared
        row(3, speedups={"copy": 1.8}),  # -10 % since 1
        row(4, speedups={"copy": 1.6}),  # -11 % since 3 (-20 % since 1: not consecutive)
        row(5, "ik_llama.cpp", speedups={"copy": 0.5}),  # -50 % since 2
    ]
    assert metrics(rows) == [("5", "2", "speedup copy")]


def test_a_failed_build_in_between_is_passed_over() -> None:
    rows = [
        row(1, speedups={"copy": 2.0}, exact={"draft": True}),
        Row(pin=pin(2), failures={"build": "conflict"}),
        row(3, speedups={"copy": 1.0}, exact={"draft": False}),
    ]
    assert metrics(rows) == [("3", "1", "speedup copy"), ("3", "1", "exact draft")]


# --- the runner ----------------------------------------------------------------------------


class Fake:
    """Steps that record what they were given; `broken` pins fail to build."""

    def __init__(self, broken: set[str] = frozenset()) -> None:
        self.built: list[str] = []
        self.broken = broken

    def build(self, p: HealthPin):
        if p.label in self.broken:
            raise LlamaspecError(f"the pin {p.short} does not build:\nno such commit")
        self.built.append(p.label)
        return SimpleNamespace(id=f"art-{p.label}", manifest={"engine": p.engine})

    def steps(self, **kw) -> health.Steps:
        return health.Steps(
            build=self.build,
            strict=lambda a: health.Strict(("draft", "ngram-mod"), {"draft": True}),
            bench=lambda a: health.Bench({"copy": 2.0, "qa": 1.1}),
            sweep=lambda a: (0.9, 3.5),
            defects=lambda p: {"ik-x": "unknown (not built)"},
            **kw,
        )


def test_a_failed_build_is_recorded_in_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    fake, said = Fake(broken={"b2"}), []
    pins = [pin(1), pin(2), pin(3)]
    report = health.run(pins, fake.steps(), tmp_path, said.append)
    assert fake.built == ["b1", "b3"]
    failed = report.rows[1]
    assert not failed.built and failed.artifact is None
    assert failed.failures == {"build": f"the pin {pins[1].short} does not build: no such commit"}
    assert failed.defects == {"ik-x": "unknown (not built)"}
    assert report.rows[2].speedups == {"copy": 2.0, "qa": 1.1}
    assert report.complete and any("build failed" in s for s in said)
    saved = json.loads((tmp_path / "health.json").read_text())
    assert saved["complete"] and len(saved["rows"]) == 3
    assert "(build failed)" in (tmp_path / "health.md").read_text()


def test_a_failing_later_step_is_recorded_and_the_next_steps_still_run(tmp_path: Path) -> None:
    def strict(_a):
        raise LlamaspecError("the server\ncrashed")

    steps = Fake().steps()
    steps = health.Steps(build=steps.build, strict=strict, bench=steps.bench, sweep=lambda a: None)
    (r,) = health.run([pin(1)], steps, tmp_path, lambda _s: None).rows
    assert r.failures == {"strict": "the server crashed"}
    assert r.speedups["copy"] == 2.0 and r.synth_na == hr.NO_SYNTH and r.synth_c is None


def test_resume_keeps_the_pins_an_interrupted_run_finished(tmp_path: Path) -> None:
    pins = [pin(1), pin(2), pin(3)]

    class Interrupted(Fake):
        def build(self, p):
            if p.label == "b3":
                raise KeyboardInterrupt
            return super().build(p)

    first = Interrupted(broken={"b2"})
    with pytest.raises(KeyboardInterrupt):
        health.run(pins, first.steps(), tmp_path, lambda _s: None)
    partial = hr.read(tmp_path / "health.json")
    assert not partial.complete and [r.pin.label for r in partial.rows] == ["b1", "b2"]
    assert "partial" in (tmp_path / "health.md").read_text().splitlines()[0]
    again, said = Fake(), []
    report = health.run(pins, again.steps(), tmp_path, said.append, resume=True)
    assert again.built == ["b3"]  # neither the finished pin nor the failed one rebuilt
    assert [r.pin.label for r in report.rows] == ["b1", "b2", "b3"] and report.complete
    assert report.rows[1].failures["build"].startswith("the pin")
    assert sum("done in an earlier run" in s for s in said) == 2
    fresh = Fake()
    health.run(pins, fresh.steps(), tmp_path, lambda _s: None)  # without --resume: all again
    assert fresh.built == ["b1", "b2", "b3"]


def test_the_json_reads_back_as_the_same_report(tmp_path: Path) -> None:
    rep = HealthReport(
        rows=(row(1, types=("draft",), exact={"draft": True}, speedups={"copy": 1.5}),),
        complete=True,
        settings={"recipe": "r"},
    )
    hr.write(rep, tmp_path)
    back = hr.read(tmp_path / "health.json")
    assert back.rows == rep.rows and back.complete and back.settings == {"recipe": "r"}


# --- the Markdown matrix -------------------------------------------------------------------


def test_the_markdown_matrix_shows_every_column_and_the_rule() -> None:
    rows = (
        row(
            1,
            types=("draft", "ngram-mod"),
            exact={"draft": True, "ngram-mod": True},
            speedups={"copy": 2.5, "qa": 1.25},
            synth_c=0.91,
            overhead_ms=3.2,
        ),
        Row(pin=pin(2), failures={"build": "patch conflict in common/speculative.cpp"}),
        row(
            3,
            types=("draft",),
            exact={"draft": False},
            speedups={"copy": 1.0},
            bench_na="",
            synth_na=hr.NO_SYNTH,
        ),
        row(
            4,
            "ik_llama.cpp",
            types=("draft",),
            exact={"draft": False},
            bench_na="recipe gemma3-270m-ngram needs ngram-mod, which this build lacks",
            defects={"ik-spec-short-output": "present (2 short output(s))"},
        ),
    )
    md = hr.markdown(HealthReport(rows=rows, complete=True, date="2026-11-25"))
    lines = md.splitlines()
    assert lines[0] == "# Build health across upstream pins"
    table = [ln for ln in lines if ln.startswith("| ")]
    assert table[0].startswith("| pin | date | engine | types offered | exact | copy | qa |")
    assert table[1] == (
        "| 1111111 b1 | 2026-01-01 | llama.cpp | draft, ngram-mod | all exact | 2.50× | 1.25× "
        "| 0.91 | 3.20 | - | - |"
    )
    assert table[2].startswith("| 2222222 b2 (build failed) | 2026-02-01 | llama.cpp | - | - |")
    assert "| NOT exact: draft | 1.00× | - | no synth | - |" in table[3]
    assert "speedup copy 2.5× → 1× (-60 % since 1111111)" in table[3]
    assert "draft no longer exact (was at 1111111)" in table[3]
    assert "| n/a | n/a |" in table[4] and "ik-spec-short-output: present" in table[4]
    assert f"more than {hr.SPEEDUP_DROP:.0%}" in md and f"more than {hr.OVERHEAD_RISE:.0%}" in md
    assert "2 regression(s) flagged." in md
    assert "- 2222222 b2 (llama.cpp): build: patch conflict in common/speculative.cpp" in md
    assert "sweep: no synth (added upstream #27711)" in md
    assert "bench: n/a: recipe gemma3-270m-ngram needs ngram-mod" in md


# --- the list and the CLI ------------------------------------------------------------------


def test_the_default_list_holds_each_engines_default_pin() -> None:
    pins = health.health_list()
    assert {p.engine for p in pins} == {"llama.cpp", "ik_llama.cpp"}
    assert all(len(p.pin) == 40 for p in pins)


def test_select_picks_by_engine_sha_prefix_and_label() -> None:
    pins = [pin(1), pin(2, label="latest"), pin(3, "ik_llama.cpp")]
    known = ["llama.cpp", "ik_llama.cpp"]
    assert health.select(pins, ["ik_llama.cpp"], [], known) == [pins[2]]
    assert health.select(pins, [], ["latest", "1111"], known) == pins[:2]
    assert health.select(pins, [], ["3333,latest"], known) == pins[1:]
    with pytest.raises(LlamaspecError, match="'3333' is not in the health list of llama.cpp"):
        health.select(pins, ["llama.cpp"], ["3333"], known)


@pytest.mark.parametrize("text", [",", "1111,", ",1111", "1111,,latest", "1111, ,latest", " "])
def test_select_refuses_an_empty_pin_item(text: str) -> None:
    """A stray comma is not "every pin" (it once started the whole matrix)."""
    pins = [pin(1), pin(2, label="latest")]
    with pytest.raises(LlamaspecError, match="has an empty item") as err:
        health.select(pins, [], ["latest", text], ["llama.cpp"])
    assert repr(text) in str(err.value)


def test_an_unknown_recipe_is_refused_before_dist_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """No probe folder is made in dist/ (its mtime stays) for a request that is refused."""
    dist = tmp_path / "dist"
    dist.mkdir()
    os.utime(dist, ns=(1_000_000_000, 1_000_000_000))
    rc = main(["maint", "health", "--recipe", "nosuch", "--dist", str(dist)])
    assert rc == 2 and "Unknown recipe 'nosuch'" in capsys.readouterr().err
    assert dist.stat().st_mtime_ns == 1_000_000_000


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--engine", "nosuch"], "Unknown engine 'nosuch'"),
        (["--pins", "deadbeef"], "--pins 'deadbeef' is not in the health list"),
        (["--recipe", "nosuch"], "Unknown recipe 'nosuch'"),
        (["--mirror", "nosuch=."], "Unknown engine 'nosuch'"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_paragraph(
    argv: list[str], expect: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    dist, reports = tmp_path / "dist", tmp_path / "reports"
    rc = main(["maint", "health", *argv, "--dist", str(dist), "--reports", str(reports)])
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and "Traceback" not in err
    assert len([ln for ln in err.strip().splitlines() if ln]) == 1
    assert not dist.exists() and not reports.exists()


def test_the_docs_page_renders_the_committed_matrix(tmp_path: Path) -> None:
    """docs/maintainers/health.md holds the include marker; the site's hook puts the
    committed report there (its title left out), or a note while none is committed."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "maintainers" / "health.md").read_text()
    assert "<!-- include-report: health.md -->" in page
    spec = importlib.util.spec_from_file_location("docs_hooks", root / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    config = {"docs_dir": str(tmp_path)}
    (tmp_path / "reports").mkdir()
    assert "No `health.md` is committed yet" in hooks.on_page_markdown(page, None, config, None)
    report = HealthReport(rows=(row(1, speedups={"copy": 2.0}),), complete=True)
    hr.write(report, tmp_path / "reports")
    shown = hooks.on_page_markdown(page, None, config, None)
    assert "| 1111111 b1 | 2026-01-01 | llama.cpp |" in shown
    assert shown.count("# Build health across upstream pins") == 1  # the page's own title
    assert "\n### Regression rule\n" in shown and "include-report" not in shown


def test_bump_compares_the_current_pin_with_the_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bump --build runs `compare`: both rows, and the candidate's regression flagged."""
    speed = {"b1": 2.0, "b2": 1.0}
    fake = Fake()
    steps = fake.steps()

    def bench(a):
        return health.Bench({"copy": speed[a.id.removeprefix("art-")]})

    monkeypatch.setattr(
        health, "steps_for", lambda *a, **k: health.Steps(build=steps.build, bench=bench)
    )
    rep = health.compare([pin(1), pin(2)], tmp_path / "dist", tmp_path, Console(file=io.StringIO()))
    assert fake.built == ["b1", "b2"] and not (tmp_path / "health.json").exists()
    assert [f.metric for f in rep.flags] == ["speedup copy"]
    assert hr.summary(rep.rows[1]).startswith("llama.cpp 2222222 b2 (2026-02-01): types -; -;")
    assert "copy 1.00×" in hr.summary(rep.rows[1])
    failed = Row(pin=pin(3), failures={"build": "no such commit"})
    assert hr.summary(failed) == "llama.cpp 3333333 b3 (2026-03-01): build failed: no such commit"


def test_an_unreliable_bench_is_marked_and_compared_with_nothing() -> None:
    """A bench that bench's own check marks unreliable shows its speedups, marked, and
    raises no regression flag in either direction."""
    from llamaspec.maint import health_report as hr

    a = hr.HealthPin("llama.cpp", "a" * 40, "2026-04-03", "old")
    b = hr.HealthPin("llama.cpp", "b" * 40, "2026-10-01", "new")
    rows = [
        hr.Row(pin=a, speedups={"copy": 1.93}),
        hr.Row(pin=b, speedups={"copy": 0.89}, bench_unreliable="machine loaded"),
    ]
    assert hr.regressions(rows) == []
    assert hr.regressions([rows[0], hr.Row(pin=b, speedups={"copy": 0.89})])  # reliable: flagged
    assert hr._speed_cell(rows[1], "copy") == "0.89× (unreliable)"


def _git(cwd: Path, *args: str) -> str:
    import subprocess

    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(cwd), "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_defect_whose_fix_is_an_ancestor_is_fixed_in_base_and_before_it_is_not(
    tmp_path: Path,
) -> None:
    """A real git history: before, the fixing commit, after; the defect is catalogued at
    `before` (present), and `fix_commit` decides at the two later pins."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    shas = []
    for name in ("before", "fix", "after"):
        (repo / name).write_text(name)
        _git(repo, "add", name)
        _git(repo, "commit", "-q", "-m", name)
        shas.append(_git(repo, "rev-parse", "HEAD"))
    before, fix, after = shas
    root = tmp_path / "root"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "series.yaml").write_text(
        "defects:\n"
        "  - id: par\n    engine: ik_llama.cpp\n"
        f"    pins: [{before}]\n    symptom: parallel-divergence\n    summary: s\n"
        f'    fixed_by: "ik #1 in words"\n    fix_commit: {fix}\n'
    )
    at = {sha: health.defect_status("ik_llama.cpp", sha, [], root, mirror=repo) for sha in shas}
    assert at[before] == {"par": "present (catalogued at this pin)"}
    assert at[fix]["par"].startswith("fixed in base (ik #1 in words (")
    assert at[after]["par"].startswith("fixed in base")
    # a side branch from `before` that lacks the fix
    _git(repo, "checkout", "-q", "-b", "side", before)
    (repo / "side").write_text("side")
    _git(repo, "add", "side")
    _git(repo, "commit", "-q", "-m", "side")
    side = _git(repo, "rev-parse", "HEAD")
    got = health.defect_status("ik_llama.cpp", side, [], root, mirror=repo)["par"]
    assert got.startswith("not fixed (ik #1 in words") and "is not an ancestor" in got
    # without history nothing is claimed
    got = health.defect_status("ik_llama.cpp", after, [], root)["par"]
    assert got.startswith("not tested")


def test_a_run_of_some_pins_merges_into_the_matrix_instead_of_replacing_it(
    tmp_path: Path,
) -> None:
    """`maint health --pins X` (issue 54): the rows of the other pins stay, in the list's
    order; a pin that fails to build where it built before keeps its earlier row; rows
    made with other settings are not mixed in."""
    pins = [pin(1), pin(2), pin(3)]
    health.run(pins, Fake().steps(), tmp_path, lambda _s: None, listed=pins)
    before = hr.read(tmp_path / "health.json")
    again, said = Fake(), []
    report = health.run([pins[1]], again.steps(), tmp_path, said.append, listed=pins)
    assert again.built == ["b2"]
    assert [r.pin.label for r in report.rows] == ["b1", "b2", "b3"] and report.complete
    assert report.rows[0] == before.rows[0] and report.rows[2] == before.rows[2]
    # no compiler this time: every build fails, and the matrix keeps what it had
    broken = Fake(broken={"b1", "b2", "b3"})
    report = health.run(pins, broken.steps(), tmp_path, said.append, listed=pins)
    assert all(r.built for r in report.rows) and len(report.rows) == 3
    assert sum("its earlier row is kept" in s for s in said) == 3
    saved = hr.read(tmp_path / "health.json")
    assert all(r.built for r in saved.rows)
    # other settings: refused before anything is built
    other = Fake()
    with pytest.raises(LlamaspecError, match="other settings"):
        health.run([pins[0]], other.steps(), tmp_path, said.append, listed=pins,
                   settings={"recipe": "another"})  # fmt: skip
    assert other.built == []
    # every pin of the list judged again replaces them all, whatever the settings
    report = health.run(pins, Fake().steps(), tmp_path, said.append, listed=pins,
                        settings={"recipe": "another"})  # fmt: skip
    assert report.settings == {"recipe": "another"} and len(report.rows) == 3
