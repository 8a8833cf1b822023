"""Checks the bad-input sweep (tests/unit/data/bad_inputs.yaml) asked for, one by one: each
refuses its value up front, in one paragraph, before anything is fetched, started or written."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.cli import options, shared
from llamaspec.cli.main import _maint, main
from llamaspec.engine.artifact import Artifact, load_artifact, newest_artifact
from llamaspec.engine.patch_sources import check_patch_source
from llamaspec.errors import LlamaspecError

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """main(argv)'s one-paragraph refusal (argparse's or llamaspec's), whitespace joined."""
    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err
    said = err[err.index("error:") :]
    assert "Traceback" not in err and "\n\n" not in said.strip()
    return " ".join(said.split())


def test_jobs_have_an_upper_bound() -> None:
    assert options.positive_int(str(options.MAX_JOBS)) == options.MAX_JOBS
    with pytest.raises(argparse.ArgumentTypeError, match="at most 4096"):
        options.positive_int("99999999999999999999")


def test_a_backend_is_checked_when_parsed() -> None:
    assert options.backend_name("cuda") == "cuda"
    with pytest.raises(argparse.ArgumentTypeError, match="Did you mean 'vulkan'"):
        options.backend_name("vulcan")
    with pytest.raises(argparse.ArgumentTypeError, match="must not be empty"):
        options.backend_name(" ")


def test_folders_and_files_are_checked_when_parsed(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x\n")
    assert shared.out_dir(str(tmp_path / "new" / "reports")) == tmp_path / "new" / "reports"
    assert not (tmp_path / "new").exists(), "a folder to write into is not made by the check"
    for text, said in (
        (str(afile), "is a file, not a folder"),
        (str(afile / "reports"), f"is under the file {afile}"),
        ("", "must not be empty"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
            shared.out_dir(text)
    assert shared.out_file(str(tmp_path / "record.json")) == tmp_path / "record.json"
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder"):
        shared.out_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="is under the file"):
        shared.out_file(str(afile / "record.json"))
    assert shared.existing_file(str(afile)) == afile
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder, not a file"):
        shared.existing_file(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="does not exist"):
        shared.existing_file(str(tmp_path / "missing.gguf"))
    assert shared.existing_dir(str(tmp_path)) == tmp_path
    with pytest.raises(argparse.ArgumentTypeError, match="is a file"):
        shared.existing_dir(str(afile))


def _unwritable() -> list[str]:
    """Folders here that cannot be made even by root: under /sys and /proc."""
    found = []
    for base in ("/sys", "/proc"):
        try:
            Path(base, "llamaspec-probe-check").mkdir()
        except OSError:
            found.append(f"{base}/llamaspec-x")
        else:
            Path(base, "llamaspec-probe-check").rmdir()
    return found


@pytest.mark.parametrize("text", _unwritable())
def test_a_folder_that_cannot_be_made_is_refused_when_parsed(text: str) -> None:
    said = f"{text} is under a kernel filesystem"
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
        shared.out_dir(text)
    with pytest.raises(argparse.ArgumentTypeError, match="kernel filesystem"):
        shared.out_dir(f"{text}/deeper")


def test_a_read_only_folder_is_refused_and_the_probe_leaves_nothing(tmp_path: Path) -> None:
    rw = tmp_path / "rw"
    rw.mkdir()
    (rw / "kept").write_text("x")
    assert shared.out_dir(str(rw)) == rw and shared.out_dir(str(rw / "new")) == rw / "new"
    assert sorted(p.name for p in rw.iterdir()) == ["kept"]
    # a folder no user can write, root included (chmod 555 does not stop root): /proc's,
    # refused by where it is before the probe
    for text in ("/proc/self", "/proc/llamaspec-x"):
        with pytest.raises(argparse.ArgumentTypeError, match="kernel filesystem"):
            shared.out_dir(text)


@pytest.mark.parametrize("command", ["load gemma3-270m-q4-draft", "limit", "verify"])
def test_reports_under_sys_is_one_line_not_a_traceback(
    command: str, capsys: pytest.CaptureFixture
) -> None:
    if "/sys/llamaspec-x" not in _unwritable():
        pytest.skip("/sys can be written here")
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--reports", "/sys/llamaspec-x"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert "argument --reports: /sys/llamaspec-x is under a kernel filesystem" in err


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon"])
def test_minutes_are_finite_and_above_zero(text: str) -> None:
    assert shared.minutes("2.5") == 2.5
    with pytest.raises(argparse.ArgumentTypeError, match="finite number of minutes above 0"):
        shared.minutes(text)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["build", "--pin", ""], "argument --pin: must not be empty"),
        (["smoke", "--artifact", ""], "argument --artifact: must not be empty"),
        (["verify", "--recipe", ""], "argument --recipe: must not be empty"),
        (["verify", "--reports", "AFILE"], "AFILE is a file, not a folder"),
        (["tune", "--out", "AFILE/tuned"], "is under the file AFILE"),
        (["gpu-acceptance", "--tune-budget", "nan"], "'nan' is not a finite number of minutes"),
        (["bench-portable", "--native", "x", "--model", "MISSING"], "does not exist"),
        (["recipe", "show", "qwen2.5-coder-7b", "--backend", "vulcan"], "Did you mean 'vulkan'"),
        (["docker", "matrix", "--backend", "nope"], "Unknown backend 'nope'"),
        (["docker", "build-stage", "--jobs", "many", "--out", "OUT"], "'many' is not a whole"),
        (["docker", "smoke", "Local/Image:x"], "image 'Local/Image:x' is not an image reference"),
        (["docker", "size", "img", "--base", ""], "--base '' is not an image reference"),
        (["docker", "base", "--tag", "a b"], "--tag 'a b' is not an image reference"),
        (["docker", "build", "--build-image", "x:"], "--build-image 'x:' is not an image"),
        (["docker", "base", "--suite", "../x"], "'../x' is not a Debian suite"),
        (["patches", "export", "AFILE"], "AFILE is a file, not a folder"),
        (["patches", "import", ""], "argument dir: must not be empty"),
        (["lock", "--patch-source", ""], "argument --patch-source: '': write it as DIR|URL"),
    ],
)
def test_parsing_refuses_the_value(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "afile").write_text("x\n")
    names = {"AFILE": tmp_path / "afile", "MISSING": tmp_path / "m.gguf", "OUT": tmp_path / "o"}
    fill = lambda t: re.sub("|".join(names), lambda m: str(names[m[0]]), t)  # noqa: E731
    assert fill(said) in refused([fill(a) for a in argv], capsys)


def test_maint_names_what_is_not_a_maintainer_command(capsys: pytest.CaptureFixture) -> None:
    for argv, said in (
        (["maint", "serve"], "'serve' is not a maintainer command; give one of lock, bump"),
        (["maint"], "a command is required"),
    ):
        with pytest.raises(SystemExit) as stop:
            _maint(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert f"llamaspec maint: error: {said}" in err and "\n\n" not in err


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]\n", b"\xff\xfe\x00"])
def test_a_damaged_manifest_is_one_paragraph(content: bytes, tmp_path: Path) -> None:
    art = tmp_path / "llamacpp-cpu-aaaaaaaaaaaa"
    art.mkdir()
    (art / "manifest.json").write_bytes(content)
    with pytest.raises(LlamaspecError, match=r"manifest\.json .*the artifact is damaged") as err:
        load_artifact(tmp_path, art.name)
    assert "\n" not in str(err.value)
    with pytest.raises(LlamaspecError, match="damaged"):
        newest_artifact(tmp_path, "llama.cpp")


def test_smoke_refuses_an_artifact_without_its_server_before_the_models(tmp_path: Path) -> None:
    from llamaspec.proof.smoke import smoke_artifact

    art = Artifact("llamacpp-cpu-aaaaaaaaaaaa", tmp_path, {"engine": "llama.cpp"}, True)
    with pytest.raises(LlamaspecError, match="has no bin/llama-server"):
        smoke_artifact(art, Console(quiet=True))


def test_verify_reads_the_whole_target_header_before_any_server(tmp_path: Path) -> None:
    from llamaspec.proof import suite

    target = tmp_path / "t.gguf"
    target.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
    art = Artifact("a", tmp_path, {"engine": "llama.cpp"}, True)
    with pytest.raises(LlamaspecError, match="truncated or corrupt GGUF"):
        suite.for_files(art, "upstream", target, None, [], None, [], tmp_path, Console())


def test_a_local_patch_source_must_be_a_folder(tmp_path: Path) -> None:
    for remote in ("https://github.com/ggml-org/llama.cpp", "git@github.com:o/r.git", "h:r.git"):
        assert check_patch_source(remote) == remote
    assert check_patch_source(str(tmp_path)) == str(tmp_path)
    with pytest.raises(LlamaspecError, match="no such folder"):
        check_patch_source(str(tmp_path / "missing"))


def test_lock_with_a_missing_mirror_leaves_the_lock_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    root = tmp_path / "root"
    for name in ("engines.yaml", "models.yaml", "llamaspec.lock", "patches/series.yaml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    monkeypatch.setenv("LLAMASPEC_ROOT", str(root))
    before = (root / "llamaspec.lock").stat().st_mtime_ns
    said = refused(["lock", "--patch-source", str(tmp_path / "missing")], capsys)
    assert f"{tmp_path / 'missing'}: no such folder" in said
    assert (root / "llamaspec.lock").stat().st_mtime_ns == before


def test_docker_build_checks_what_the_image_build_would_refuse() -> None:
    from llamaspec.images.build import check_build_inputs
    from llamaspec.images.specs import ImageSpec

    spec = ImageSpec()
    check_build_inputs(spec, "")
    with pytest.raises(LlamaspecError, match="Unknown patch id 'nope'"):
        check_build_inputs(spec, "nope")
    with pytest.raises(LlamaspecError, match="nope"):
        check_build_inputs(ImageSpec(variants=("nope",)), "")
    with pytest.raises(LlamaspecError, match="=ON"):
        check_build_inputs(ImageSpec(defines=("=ON",)), "")


def test_a_build_record_with_an_empty_tag_is_refused(tmp_path: Path) -> None:
    record = tmp_path / "r.json"
    record.write_text('{"tags": [""]}')
    from llamaspec.images.build import load_record

    with pytest.raises(LlamaspecError, match="not a build record"):
        load_record(record)


def test_gpu_acceptance_names_a_typo_before_looking_for_a_gpu(
    capsys: pytest.CaptureFixture,
) -> None:
    assert "Did you mean 'llama.cpp'" in refused(
        ["gpu-acceptance", "--engine", "llama.ccp"], capsys
    )
    said = refused(["gpu-acceptance", "--variant", "nope", "--engine", "llama.cpp"], capsys)
    assert "'nope'" in said and "NVIDIA" not in said


def test_verify_names_an_unknown_method_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    said = refused(["verify", "--method", "ngram-mdo", "--dist", str(tmp_path)], capsys)
    assert "Unknown method 'ngram-mdo'. Did you mean 'ngram-mod'" in said


def test_serve_names_an_unknown_engine_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["serve", "qwen2.5-coder-7b", "--engine", "llama.ccp", "--dist", str(tmp_path)]
    assert "Did you mean 'llama.cpp'" in refused(argv, capsys)


def test_verify_points_a_model_file_to_target(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    mine = tmp_path / "mymodel"
    mine.write_bytes(b"GGUF")
    for value in ("my-model-Q4_K_M.gguf", "models/my-model", str(mine)):
        said = refused(["verify", "--model", value, "--dist", str(tmp_path)], capsys)
        assert "--model takes the name of a built-in model" in said, said
        assert f"give it as --target {value}" in said
    # a name, even a misspelt one, is not taken for a file (it is looked up later, among
    # the built-in models the build can serve; here the empty --dist stops it first)
    said = refused(["verify", "--model", "embeded", "--dist", str(tmp_path)], capsys)
    assert "--model takes" not in said and "No artifact" in said


def test_verify_refuses_strict_beside_another_tier(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["verify", "--target", "t.gguf", "--strict", "--tier", "oracle", "--dist", str(tmp_path)]
    said = refused(argv, capsys)
    assert "--strict is --tier both" in said and "Give one of them" in said


def test_every_models_pull_the_docs_show_names_a_catalog_pair() -> None:
    """`models pull NAME` in README or a guide exits 2 when NAME is no pair (the bench guide
    once said `models pull gemma3-270m-f32`, a model of the pair gemma3-270m-f32-q4draft)."""
    from llamaspec import config

    pairs = set(config.load_models(ROOT).pairs)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (p.relative_to(ROOT).as_posix(), m)
        for p in pages
        for m in re.findall(r"models pull ([a-z0-9][a-z0-9._-]*)", p.read_text())
    }
    assert ("docs/guides/bench-and-tune.md", "gemma3-270m-f32-q4draft") in named
    assert not {(page, m) for page, m in named if m not in pairs}
