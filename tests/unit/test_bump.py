"""`llamaspec bump` against a fake engine history made here: resolve, re-judge the patch
queue at both pins, refuse what must be refused, and edit engines.yaml and the lock as text."""

from __future__ import annotations

import difflib
import json
import shlex
import subprocess
import sys
import threading
from datetime import date
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from llamaspec import config
from llamaspec.cli.main import main, make_parser
from llamaspec.errors import LlamaspecError
from llamaspec.maint import bump, pin_edit

from gitrepos import make_engine, run_git

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]

FIX = """diff --git a/src/a.txt b/src/a.txt
--- a/src/a.txt
+++ b/src/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
"""


def commit(repo: Path, message: str, files: dict[str, str]) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-q", "-m", message)
    return run_git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """base → pin → later (takes the project fix, merges the feature PR) → breaking (rewrites
    the fixed line); a PR branch `feat` off the pin, and an unmerged side branch."""
    repo = tmp_path_factory.mktemp("engine") / "llama.cpp"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    run_git(repo, "config", "uploadpack.allowAnySHA1InWant", "true")
    base = commit(
        repo,
        "base",
        {
            "CMakeLists.txt": "cmake_minimum_required(VERSION 3.14)\nproject(t)\n",
            "tools/server/server.cpp": "int main() { return 0; }\n",
            "src/a.txt": "one\ntwo\nthree\n",
        },
    )
    pin = commit(repo, "pin", {"src/b.txt": "b\n"})
    run_git(repo, "checkout", "-q", "-b", "feat")
    feat = commit(repo, "feature (#7)", {"src/c.txt": "feature\n"})
    run_git(repo, "checkout", "-q", "-b", "side", pin)
    side = commit(repo, "side", {"src/d.txt": "side\n"})
    run_git(repo, "checkout", "-q", "main")
    run_git(repo, "merge", "-q", "--no-ff", "-m", "merge #7", "feat")
    later = commit(repo, "take the fix", {"src/a.txt": "one\nTWO\nthree\n"})
    breaking = commit(repo, "rewrite", {"src/a.txt": "one\nzwei\nthree\n"})
    other = tmp_path_factory.mktemp("other") / "repo"
    other.mkdir()
    run_git(other, "init", "-q", "-b", "main")
    foreign = commit(other, "elsewhere", {"CMakeLists.txt": "project(x)\n"})
    return {
        "repo": repo,
        "other": other,
        "base": base,
        "pin": pin,
        "feat": feat,
        "side": side,
        "later": later,
        "breaking": breaking,
        "foreign": foreign,
        "date": run_git(repo, "show", "-s", "--format=%cs", pin),
    }


SERIES = """# the fake engine's catalog
patches:
  - id: proj-fix
    engine: llama.cpp
    title: a project fix
    state: project
    source: {{file: 0001-fix.patch}}
    default: true
  - id: feat
    engine: llama.cpp
    title: the feature
    upstream: {{pr: 7, url: "https://example.invalid/pull/7"}}
    state: merged
    source: {{commits: [{feat}]}}
    default: false
"""

ENGINES = """# Engines (a comment bump keeps)
engines:
  llama.cpp:
    git_url: {url}
    pin: {pin}  # the pin
    tag: main@{date}
    pin_date: {date}
    server_dir: tools/server
    dialect: upstream
"""


@pytest.fixture
def project(tmp_path: Path, history: dict, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    (root / "patches" / "llama.cpp").mkdir(parents=True)
    (root / "engines.yaml").write_text(
        ENGINES.format(url=f"file://{history['repo']}", pin=history["pin"], date=history["date"])
    )
    (root / "patches" / "series.yaml").write_text(SERIES.format(feat=history["feat"]))
    (root / "patches" / "llama.cpp" / "0001-fix.patch").write_text(FIX)
    (root / "llamaspec.lock").write_text(
        f"# the lock\nengines:\n  llama.cpp: {history['pin']}\npatches: {{}}\n"
    )
    monkeypatch.setenv("LLAMASPEC_ROOT", str(root))
    monkeypatch.setenv("LLAMASPEC_PYPI_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("COLUMNS", "250")
    return root


def cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["bump", "--engine", "llama.cpp", *args])
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), " ".join(err.split())


def snapshot(root: Path) -> dict[str, str]:
    return {n: (root / n).read_text() for n in ("engines.yaml", "llamaspec.lock")}


def report(root: Path, sha: str) -> tuple[str, dict]:
    md = root / "reports" / f"bump-llama.cpp-{sha[:7]}.md"
    return md.read_text(), json.loads(md.with_name(md.stem + ".json").read_text())


# --- through the CLI, on the fake history -----------------------------------------------------


def test_a_later_commit_with_a_patch_in_it_is_judged_in_base_and_the_pin_moves(
    project: Path, history: dict, capsys
) -> None:
    before = snapshot(project)
    code, out, err = cli(capsys, "--source-dir", str(history["repo"]), "--to", history["later"])
    assert code == 0, out + err
    assert "went in-base: proj-fix, feat" in out and "3 commits" in out
    md, data = report(project, history["later"])
    rows = {r["id"]: r for r in data["patches"]}
    assert rows["proj-fix"]["before"]["status"] == "applies"
    assert rows["proj-fix"]["after"] == {
        "id": "proj-fix",
        "status": "in-base",
        "note": "its diff reverse-applies",
        "basis": "content",
    }
    assert rows["feat"]["after"]["note"] == "its commits are ancestors of the pin"
    assert data["went_in_base"] == ["proj-fix", "feat"] and data["outcome"] == "updated"
    assert data["commits_between"] == 3 and "Not built (pass --build)." in md
    engines = (project / "engines.yaml").read_text()
    # only the pin line changed (its comment kept); tag and date name the same day here
    changed = [
        (a, b)
        for a, b in zip(before["engines.yaml"].splitlines(), engines.splitlines(), strict=True)
        if a != b
    ]
    assert changed == [
        (f"    pin: {history['pin']}  # the pin", f"    pin: {history['later']}  # the pin")
    ]
    assert config.load_engines(project)["llama.cpp"].pin == history["later"]
    lock = (project / "llamaspec.lock").read_text()
    assert lock == before["llamaspec.lock"].replace(history["pin"], history["later"])


def test_a_commit_where_a_default_patch_starts_to_conflict_is_refused_and_nothing_changes(
    project: Path, history: dict, capsys
) -> None:
    before = snapshot(project)
    code, out, err = cli(capsys, "--source-dir", str(history["repo"]), "--to", "latest")
    assert code == 2
    assert "now conflict: proj-fix" in out
    assert "refused: the patch queue does not hold at" in err
    assert "proj-fix: a default patch conflicts" in err and "unchanged" in err
    assert snapshot(project) == before
    md, data = report(project, history["breaking"])
    assert data["outcome"] == "refused" and data["now_conflict"] == ["proj-fix"]
    assert "**blocks the bump**" in md and "No file but this report was changed." in md


def test_without_a_mirror_the_remote_is_asked_and_a_dry_run_changes_nothing(
    project: Path, history: dict, capsys
) -> None:
    before = snapshot(project)
    code, out, err = cli(capsys, "--to", history["later"], "--dry-run")
    assert code == 0, out + err
    assert "dry run" in out and snapshot(project) == before
    md, data = report(project, history["later"])
    assert data["outcome"] == "dry-run" and data["commits_between"] is None
    # the shallow trees have no history: the feature is judged by its diff instead
    assert {r["id"]: r["after"]["basis"] for r in data["patches"]} == {
        "proj-fix": "content",
        "feat": "content",
    }
    assert "could not check PyPI" not in md  # the fake engine has no PyPI mirror to check
    code, out, err = cli(capsys, "--to", "latest")  # HEAD of the remote: the breaking commit
    assert code == 2 and "now conflict: proj-fix" in out and snapshot(project) == before


def test_abbreviated_shas_resolve_to_full_ones(project: Path, history: dict, capsys) -> None:
    code, out, err = cli(
        capsys, "--source-dir", str(history["repo"]), "--to", history["later"][:8], "--dry-run"
    )
    assert code == 0, err
    assert report(project, history["later"])[1]["new"]["commit"] == history["later"]
    # without a mirror only a ref tip can be found from an abbreviation
    code, _, err = cli(capsys, "--to", history["later"][:8])
    assert code == 2 and "abbreviated SHA that names no branch or tag tip" in err
    code, out, err = cli(capsys, "--to", history["breaking"][:10], "--dry-run")
    assert code == 2 and "now conflict: proj-fix" in out  # HEAD's tip, found


@pytest.mark.parametrize(
    ("to", "expect"),
    [
        ("deadbeefdeadbeef", "no such commit in the llama.cpp history of the mirror"),
        ("foreign", "no such commit in the llama.cpp history of the mirror"),
        ("side", "is in the mirror but not on its HEAD branch"),
        ("base", "is older than the current pin"),
        ("v1.0", "is neither `latest` nor a commit SHA"),
    ],
)
def test_bad_candidates_are_refused_with_the_reason(
    project: Path, history: dict, capsys, to: str, expect: str
) -> None:
    before = snapshot(project)
    code, _, err = cli(capsys, "--source-dir", str(history["repo"]), "--to", history.get(to, to))
    assert code == 2 and expect in err and "Traceback" not in err
    assert snapshot(project) == before and not (project / "reports").exists()


def test_a_downgrade_goes_through_only_when_allowed(project: Path, history: dict, capsys) -> None:
    args = ("--source-dir", str(history["repo"]), "--to", history["base"], "--dry-run")
    code, _, err = cli(capsys, *args)
    assert code == 2 and "pass --allow-downgrade" in err
    code, _, err = cli(capsys, *args, "--allow-downgrade")
    assert code == 0, err
    data = report(project, history["base"])[1]
    assert data["direction"] == "downgrade" and data["commits_between"] == -1


def test_mirror_of_another_repository_and_no_network_say_what_to_give(
    project: Path, history: dict, capsys
) -> None:
    code, _, err = cli(capsys, "--source-dir", str(history["other"]))
    assert code == 2 and f"has no commit {history['pin']}" in err
    assert "a clone of another repository" in err
    engines = project / "engines.yaml"
    engines.write_text(engines.read_text().replace(f"file://{history['repo']}", "file:///gone"))
    code, _, err = cli(capsys)
    assert code == 2 and "Cannot reach file:///gone" in err
    assert "--source-dir" in err and "git clone --bare file:///gone llama.cpp.git" in err


def test_already_at_the_candidate_is_a_no_op(project: Path, history: dict, capsys) -> None:
    code, out, _ = cli(capsys, "--source-dir", str(history["repo"]), "--to", history["pin"])
    assert code == 0 and "already at" in out and not (project / "reports").exists()


# --- the pure parts ------------------------------------------------------------------------------


def test_ls_remote_gives_head_release_tags_and_peeled_commits() -> None:
    a, b, c, t = "a" * 40, "b" * 40, "c" * 40, "d" * 40
    text = (
        f"{a}\tHEAD\n{a}\trefs/heads/master\n{b}\trefs/tags/b100\n{t}\trefs/tags/b101\n"
        f"{c}\trefs/tags/b101^{{}}\n{c}\trefs/tags/v1\n"
    )
    head, tags, shas = bump.parse_ls_remote(text)
    assert head == a and tags == {b: 100, c: 101} and a in shas
    upstream = make_engine("0" * 40, build_number=99)
    latest = bump.resolve(upstream, "latest", None, text)
    assert (latest.commit, latest.release) == (c, 101) and "not a release yet" in latest.how
    ik = make_engine("0" * 40, name="ik_llama.cpp")
    assert bump.resolve(ik, "latest", None, text).commit == a  # no release pins: HEAD


@pytest.mark.parametrize(
    ("before", "after", "default", "change", "blocks"),
    [
        ("applies", "in-base", True, "went in-base", ""),
        ("applies", "conflict", False, "now conflicts", "it applied at the current pin"),
        ("in-base", "conflict", True, "now conflicts", "a default patch conflicts"),
        ("conflict", "conflict", False, "", ""),
        ("conflict", "applies", False, "newly applies", ""),
        ("in-base", "unknown", True, "in-base → unknown", "cannot be judged"),
        ("unknown", "unknown", True, "", ""),
        ("applies", "error", False, "applies → error", "cannot be used as written"),
    ],
)
def test_changes_and_what_blocks_a_bump(before, after, default, change, blocks) -> None:
    entry = config.PatchEntry(
        id="p", engine="llama.cpp", title="t", source={"file": "x.patch"}, default=default
    )
    assert bump.change_of(before, after) == change
    assert (blocks in bump.blocking_of(entry, before, after)) and (
        bool(blocks) == bool(bump.blocking_of(entry, before, after))
    )


def test_engines_yaml_edit_touches_only_the_bumped_entry() -> None:
    text = (ROOT / "engines.yaml").read_text()
    engines = config.load_engines(ROOT)
    ik = engines["ik_llama.cpp"]
    new = ik.model_copy(
        update={"pin": "1" * 39 + "a", "tag": "main@2026-08-15", "pin_date": date(2026, 8, 15)}
    )
    new = new.model_copy(update={"pypi": None})
    edited = pin_edit.edit_engines_text(text, "ik_llama.cpp", new)
    pin_edit.check_edit(text, edited, "ik_llama.cpp", new)
    diff = list(difflib.ndiff(text.splitlines(), edited.splitlines()))
    gone = [ln[2:] for ln in diff if ln.startswith("- ")]
    assert [ln[2:] for ln in diff if ln.startswith("+ ")] == [
        "    pin: " + "1" * 39 + "a",
        "    tag: main@2026-08-15",
        "    pin_date: 2026-08-15",
    ]
    assert gone == [
        f"    pin: {ik.pin}",
        "    tag: main@2026-04-13",
        "    pin_date: 2026-04-13",
        "    pypi:",
        "      package: ik-llama-cpp-python",
        "      version: 0.1.5",
        f"      sha256: {ik.pypi.sha256}",
        "      subdir: vendor/ik_llama.cpp",
    ]
    assert edited.startswith(text.split("engines:")[0])  # the header comment stays
    up = engines["llama.cpp"]
    moved = up.model_copy(
        update={
            "pin": "2" * 40,
            "tag": "b11400",
            "build_number": 11400,
            "pypi": None,
            "dialect": "upstream-legacy",
        }
    )
    edited = pin_edit.edit_engines_text(text, "llama.cpp", moved)
    pin_edit.check_edit(text, edited, "llama.cpp", moved)
    assert "    build_number: 11400\n" in edited and "    tag: b11400\n" in edited
    assert "    dialect: upstream-legacy\n" in edited
    numbered = new.model_copy(update={"build_number": 42})  # a line is added where none was
    edited = pin_edit.edit_engines_text(text, "ik_llama.cpp", numbered)
    pin_edit.check_edit(text, edited, "ik_llama.cpp", numbered)
    assert "    pin_date: 2026-08-15\n    build_number: 42\n" in edited
    unnumbered = moved.model_copy(update={"build_number": None, "tag": "main@2026-10-02"})
    edited = pin_edit.edit_engines_text(text, "llama.cpp", unnumbered)
    pin_edit.check_edit(text, edited, "llama.cpp", unnumbered)
    assert "build_number" not in edited


def test_lock_edit_changes_one_line() -> None:
    text = (ROOT / "llamaspec.lock").read_text()
    engines = config.load_engines(ROOT)
    edited = pin_edit.edit_lock_text(text, "ik_llama.cpp", "3" * 40)
    assert edited == text.replace(engines["ik_llama.cpp"].pin, "3" * 40)
    assert pin_edit.edit_lock_text("engines: {}\n", "ik_llama.cpp", "3" * 40) is None


class _Index(BaseHTTPRequestHandler):
    releases: ClassVar[dict] = {}

    def do_GET(self) -> None:
        if self.path != "/ik-llama-cpp-python/json":
            self.send_error(404)
            return
        body = json.dumps({"releases": self.releases}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _sdist(day: str, **kw: object) -> list[dict]:
    return [{"packagetype": "sdist", "upload_time": f"{day}T00:00:00", **kw}]


def test_pypi_news_names_a_newer_sdist_and_says_when_it_could_not_check() -> None:
    ik = config.load_engines(ROOT)["ik_llama.cpp"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _Index.releases = {
            "0.1.5": _sdist("2026-09-16"),
            "0.1.10": _sdist("2026-10-20"),
            "0.1.6": _sdist("2026-10-01"),
            "0.2.0rc1": _sdist("2026-10-21"),
            "0.3.0": _sdist("2026-10-22", yanked=True),
        }
        news = bump.pypi_news(ik, base)
        assert news.checked and news.newest == "0.1.10" and news.newer == ("0.1.6", "0.1.10")
        assert (
            "ik-llama-cpp-python 0.1.10 (uploaded 2026-10-20) is on PyPI, newer than 0.1.5"
            in news.line
        )
        _Index.releases = {"0.1.5": _sdist("2026-09-16")}
        news = bump.pypi_news(ik, base)
        assert (
            news.checked
            and news.newest is None
            and "no ik-llama-cpp-python newer than 0.1.5" in news.line
        )
    finally:
        server.shutdown()
    news = bump.pypi_news(ik, "http://127.0.0.1:9", timeout=2)
    assert not news.checked and news.line.startswith("could not check PyPI")


def test_to_must_be_latest_or_a_sha() -> None:
    assert bump.check_to("latest") == "latest" and bump.check_to("ABCDEF1") == "abcdef1"
    with pytest.raises(LlamaspecError, match="neither `latest` nor a commit SHA"):
        bump.check_to("main")


# --- the scheduled workflow and the script it calls ------------------------------------------

WORKFLOW = ROOT / ".github" / "workflows" / "bump.yml"
SCRIPT = ROOT / ".ci" / "bump"


def test_workflow_matches_githubs_schema_and_runs_the_script_per_engine() -> None:
    schema = ("--builtin-schema", "vendor.github-workflows")
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", *schema, str(WORKFLOW)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flow = yaml.safe_load(WORKFLOW.read_text())
    triggers = flow[True]  # YAML 1.1 reads the key `on` as True
    assert "workflow_dispatch" in triggers and triggers["schedule"][0]["cron"].count(" ") == 4
    job = flow["jobs"]["bump"]
    assert job["strategy"]["matrix"]["engine"] == list(config.load_engines(ROOT))
    assert job["permissions"] == {"contents": "write", "pull-requests": "write", "issues": "write"}
    (step,) = [s for s in job["steps"] if ".ci/bump" in s.get("run", "")]
    assert step["env"]["GH_TOKEN"] == "${{ secrets.GITHUB_TOKEN }}"
    words = shlex.split(step["run"].replace("${{ matrix.engine }}", "llama.cpp"))
    assert words[:2] == [".ci/bump", "llama.cpp"] and (ROOT / words[0]).stat().st_mode & 0o111
    args = make_parser().parse_args(["bump", "--engine", words[1], *words[2:]])
    assert (args.engine, args.to, args.build) == ("llama.cpp", "latest", True)
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


FAKE_GH = """#!/bin/sh
# records each call; a --body-file's text goes into the record too
echo "gh $*" >>"$GH_LOG"
prev=""
for arg in "$@"; do
    [ "$prev" = "--body-file" ] && cat "$arg" >>"$GH_LOG"
    prev=$arg
done
exit 0
"""


@pytest.fixture
def ci(project: Path, tmp_path: Path):
    """The fake project as a checkout with an `origin`, a recording `gh`, and `.ci/bump`."""
    run_git(project, "init", "-q", "-b", "main")
    run_git(project, "add", "-A")
    run_git(project, "commit", "-q", "-m", "project")
    origin = tmp_path / "origin.git"
    run_git(tmp_path, "init", "-q", "--bare", str(origin))
    run_git(project, "remote", "add", "origin", str(origin))
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "gh").write_text(FAKE_GH)
    (fake / "gh").chmod(0o755)
    log = tmp_path / "gh.log"
    env = {
        "PATH": f"{fake}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LLAMASPEC_ROOT": str(project),
        "LLAMASPEC_CACHE": str(tmp_path / "cache"),
        "LLAMASPEC_PYPI_URL": "http://127.0.0.1:9",
        "GH_LOG": str(log),
    }

    def run(*args: str) -> tuple[subprocess.CompletedProcess, str]:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "llama.cpp", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        return proc, log.read_text() if log.exists() else ""

    return run, origin


def test_script_opens_a_pull_request_when_the_pin_moved(ci, history: dict) -> None:
    run, origin = ci
    proc, gh = run("--source-dir", str(history["repo"]), "--to", history["later"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    short = history["later"][:7]
    branch = f"bump/llama.cpp-{short}"
    assert (
        f"gh pr create --base main --head {branch} --title Bump llama.cpp to {short} "
        f"--body-file reports/bump-llama.cpp-{short}.md"
    ) in gh
    assert f"# Bump llama.cpp: {history['pin'][:7]} → {short} (updated)" in gh
    files = run_git(origin, "show", "--name-only", "--format=%s", branch).split("\n")
    assert files[0] == f"Bump llama.cpp to {short}"
    assert sorted(f for f in files[1:] if f) == [
        "engines.yaml",
        "llamaspec.lock",
        f"reports/bump-llama.cpp-{short}.json",
        f"reports/bump-llama.cpp-{short}.md",
    ]
    assert "issue" not in gh


def test_script_opens_an_issue_with_the_report_when_bump_refuses(ci, history: dict) -> None:
    run, origin = ci
    proc, gh = run("--source-dir", str(history["repo"]), "--to", "latest")
    assert proc.returncode == 2
    short = history["breaking"][:7]
    assert f"gh issue create --title bump llama.cpp: refused at {short} --body-file" in gh
    assert "**blocks the bump**" in gh and "pr create" not in gh
    assert run_git(origin, "branch", "--list") == ""  # nothing pushed


def test_script_reports_bad_input_from_the_output_and_is_quiet_when_current(
    ci, history: dict
) -> None:
    run, _ = ci
    proc, gh = run("--to", "v1.0")
    assert proc.returncode == 2
    assert "gh issue create --title bump llama.cpp: refused --body-file" in gh
    assert "is neither `latest` nor a commit SHA" in gh
    proc, after = run("--source-dir", str(history["repo"]), "--to", history["pin"])
    assert proc.returncode == 0 and after == gh and "already at" in proc.stdout
