"""Pure parts of the equivalence suite and the benchmark."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.methods import Method, choose_methods, methods_for
from llamaspec.perf import bench, bench_report
from llamaspec.proof.prompts import VERIFY_PROMPTS

pytestmark = pytest.mark.unit


def test_summary_reports_speedup_acceptance_and_ratio() -> None:
    plain = (
        bench_report.Sample(64, 10.0, 7.0),
        bench_report.Sample(64, 12.0, 6.0),
        bench_report.Sample(64, 11.0, 6.5),
    )
    spec = (bench_report.Sample(64, 16.5, 4.0, 40, 30, 10, (9, 8, 7, 6)),) * 3
    cell = bench_report.Cell("code", 1, plain, spec)
    s = bench.summarize(cell, {1: 10.0, 2: 11.0, 4: 12.0, 5: 12.5}, 0.0, True)
    assert s["speedup"] == pytest.approx(1.5) and s["acceptance"] == 0.75
    assert s["mean_accepted_length"] == 3.0 and s["plain_tps_spread"] == [10.0, 12.0]
    assert s["acceptance_by_position"] == [0.9, 0.8, 0.7, 0.6]
    assert s["accepted_length_histogram"] == [3, 3, 3, 3, 18]
    assert s["measured_over_expected"] == pytest.approx(1.5 / s["expected_speedup"], rel=1e-2)
    four = bench_report.Cell("code", 4, cell.plain, cell.spec)
    assert bench.summarize(four, {1: 10.0}, 0.0, True)["expected_speedup"] is None


def test_warm_figures_are_a_second_labelled_column_beside_first_exposure() -> None:
    """The headline is first exposure; a method that keeps state gets its warm figure (the
    same workload again) in columns of its own, with its own acceptance and prediction."""
    cell = bench_report.Cell(
        "copy",
        1,
        plain=(bench_report.Sample(64, 10.0, 7.0),) * 3,
        spec=(bench_report.Sample(64, 9.0, 7.0, 10, 2, 5, (0.2,)),) * 3,
        warm=(bench_report.Sample(64, 20.0, 3.0, 40, 36, 6, (0.9,)),) * 3,
    )
    s = bench.summarize(cell, {1: 10.0, 2: 11.0, 9: 14.0}, 0.0, True)
    assert s["speedup"] == pytest.approx(0.9) and s["warm_speedup"] == pytest.approx(2.0)
    assert s["acceptance"] == 0.2 and s["warm_acceptance"] == 0.9
    assert s["expected_speedup"] < s["warm_expected_speedup"]
    report = {"keeps_state": ["ngram-mod"], "workloads": [{"workload": "copy", "concurrency": 1,
                                                             "summary": s}]}  # fmt: skip
    (row,) = bench_report.rows(report)
    assert (
        bench_report.head(report)[-3:] == bench_report.WARM_HEAD
        and row[4] == "0.90×"
        and row[-3] == "2.00×"
    )
    # a stateless method has no warm columns, and its summary no warm keys
    cell = replace(cell, warm=())
    assert not any(k.startswith("warm") for k in bench.summarize(cell, None, 0.0, True))
    assert bench_report.head({"keeps_state": []}) == bench_report.HEAD
    assert {"ngram-mod", "ngram-cache"} <= bench.KEEPS_STATE and "draft" not in bench.KEEPS_STATE


def test_bench_splits_a_rendered_command_into_plain_and_speculative_args() -> None:
    argv = [
        "/x/llama-server",
        "-m",
        "/m/t.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "-c",
        "4096",
        "-np",
        "1",
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-match",
        "8",
        "-md",
        "/m/d.gguf",
        "--draft-max",
        "8",
        "-mtp",
        "-fa",
        "on",
    ]
    plain, spec = bench.split_spec(bench.server_args(argv))
    assert plain == ["-m", "/m/t.gguf", "-c", "4096", "-np", "1", "-fa", "on"]
    assert spec == [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-match",
        "8",
        "-md",
        "/m/d.gguf",
        "--draft-max",
        "8",
        "-mtp",
    ]
    assert bench.with_slots(plain, 4)[-4:] == ["-c", "16384", "-np", "4"]
    assert bench.shown(["-m", "/nowhere/t.gguf", "-c", "1"]) == "llama-server -m t.gguf -c 1"


@pytest.mark.parametrize("name", sorted(dialects.DIALECTS))
def test_split_takes_every_dialects_speculative_arguments(name: str) -> None:
    """A full command split into plain and speculative parts: the speculative part is what
    the dialect renders for the spec settings alone, for every type the dialect offers."""
    rendered = 0
    for spec_type in sorted(dialects.DIALECTS[name].types):
        spec = config.SpecSettings(
            types=(spec_type,), draft_n_max=8, draft_n_min=1, draft_p_min=0.5,
            draft_gpu_layers=99, draft_cache_type_k="q8_0", draft_cache_type_v="q8_0",
            draft_device="CUDA0", ngram_mod_n_min=4, ngram_mod_n_max=16, ngram_mod_n_match=8,
        )  # fmt: skip
        server = config.ServerSettings(ctx=4096, parallel=2, flash_attn="on")
        try:
            full = dialects.render(name, spec, server, draft="d.gguf", target="t.gguf").argv
        except LlamaspecError:
            continue  # a type this dialect refuses in this form (its message is tested elsewhere)
        plain, spec_args = bench.split_spec(bench.server_args(full))
        assert spec_args == list(dialects.render(name, spec, draft="d.gguf").argv), spec_type
        assert plain[:2] == ["-m", "t.gguf"] and "d.gguf" not in plain, spec_type
        rendered += 1
    assert rendered


@pytest.mark.parametrize(
    ("argv", "spec"),
    [
        # an unknown --spec-* switch leaves the next option alone
        (["--spec-foo", "-ngl", "99", "-c", "4096"], ["--spec-foo"]),
        (["-c", "4096", "--spec-foo"], ["--spec-foo"]),  # last, with nothing after it
        (["--spec-foo", "--spec-bar", "3", "-c", "4096"], ["--spec-foo", "--spec-bar", "3"]),
        # an unknown --spec-* option with a value takes it, a negative number too
        (["--spec-foo", "-1", "-c", "4096"], ["--spec-foo", "-1"]),
        (["--spec-foo", "-0.5", "-c", "4096"], ["--spec-foo", "-0.5"]),
        (["--spec-foo", "ngram-mod", "-c", "4096"], ["--spec-foo", "ngram-mod"]),
        # `--flag=value` is one argument, known or not
        (["--spec-foo=3", "-c", "4096"], ["--spec-foo=3"]),
        (["--draft-max=8", "-c", "4096"], ["--draft-max=8"]),
        # known flags: a value always, a switch never
        (["--draft-p-min", "-1", "-c", "4096"], ["--draft-p-min", "-1"]),
        (["-mtp", "-c", "4096"], ["-mtp"]),
    ],
)
def test_split_knows_switches_from_options_with_values(argv: list[str], spec: list[str]) -> None:
    plain, got = bench.split_spec(argv)
    assert got == spec
    assert plain == [a for a in argv if a not in spec]
    assert "-c" in plain and "4096" in plain


def test_dialect_probe_from_help() -> None:
    assert dialects.probe_dialect("llama.cpp", "--spec-draft-n-max N  x") == "upstream"
    assert dialects.probe_dialect("llama.cpp", "--draft-max N  x") == "upstream-legacy"
    assert dialects.probe_dialect("ik_llama.cpp", "--draft-max, --draft N") == "ik-legacy"
    assert dialects.probe_dialect("ik_llama.cpp", "--spec-type TYPE:k=v") == "ik-spec-type"


def test_methods_follow_the_binary() -> None:
    upstream_help = "--spec-type none,draft-simple,ngram-simple,ngram-map-k,ngram-mod\n"
    upstream_help += "--spec-ngram-mod-n-min N\n"
    methods = methods_for("upstream", upstream_help, Path("d.gguf"))
    names = [m.name if isinstance(m, Method) else m for m in methods]
    assert [n for n in names if ":" not in n][:3] == ["draft", "ngram-map-k", "ngram-mod"]
    assert "ngram-cache: ngram-cache is not in this binary's --spec-type list" in names
    assert "ngram-mod" in names and not any(n.startswith("mtp") for n in names)
    mtp = methods_for("upstream", upstream_help, Path("d.gguf"), ("mtp",))
    assert mtp == ["mtp: draft-mtp is not in this binary's --spec-type list"]
    old = methods_for("ik-legacy", "--spec-type ngram-simple", Path("d.gguf"))
    assert "ngram-mod: ngram-mod is not in this binary's --spec-type list" in old
    ik = methods_for("ik-legacy", "--spec-type ngram-simple", Path("d.gguf"), ("eagle3",))
    assert ik == [
        "eagle3: ik_llama.cpp at ik_llama.cpp before its PR #1908, e.g. the default "
        "pin 55d3c05 (dialect 'ik-legacy') has no eagle3"
    ]
    draft = next(m for m in methods if isinstance(m, Method) and m.name == "draft")
    assert "d.gguf" in draft.argv


def test_plain_control_runs_only_when_named() -> None:
    help_text = "--spec-type none,draft-simple,ngram-simple,ngram-map-k,ngram-mod\n"
    available = methods_for("upstream", help_text, Path("d.gguf"))
    everything = choose_methods(available, None, Path("llama-server"))
    assert "plain" not in [m.name for m in everything if isinstance(m, Method)]
    chosen = choose_methods(available, ["plain", "draft"], Path("llama-server"))
    assert [m.name for m in chosen if isinstance(m, Method)] == ["plain", "draft"]
    assert chosen[0].argv == ()  # type: ignore[union-attr]
    with pytest.raises(LlamaspecError, match="plain: no speculation"):
        choose_methods(available, ["eagle"], Path("llama-server"))


def test_verify_prompts_cover_short_code_prose_and_chat() -> None:
    names = [p.name for p in VERIFY_PROMPTS]
    assert {"short", "code", "prose", "chat", "rewrite"} <= set(names)
    short = next(p for p in VERIFY_PROMPTS if p.name == "short")
    assert len(short.text.split()) < 32
    chat = next(p for p in VERIFY_PROMPTS if p.name == "chat")
    assert chat.text.count("User:") == 4


def test_one_line_patch_applies_and_changes_one_line(tmp_path: Path) -> None:

    from llamaspec.maint import build_bench as benchbuild

    src = tmp_path / "tools" / "server"
    src.mkdir(parents=True)
    (src / "server.cpp").write_text("int main() {\n    return 0;\n}")  # no final newline
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    rel, v1 = benchbuild.one_line_patch(tmp_path, "llama.cpp", "v1")
    _, v2 = benchbuild.one_line_patch(tmp_path, "llama.cpp", "v2")
    assert rel == "tools/server/server.cpp"
    changed = [(a, b) for a, b in zip(v1.splitlines(), v2.splitlines(), strict=True) if a != b]
    assert len(changed) == 1 and '"v1"' in changed[0][0] and '"v2"' in changed[0][1]
    subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=v2, text=True, check=True)
    text = (src / "server.cpp").read_text()
    assert text.endswith('llamaspec_bench_mark = "v2";\n') and text.startswith("int main()")


def test_one_line_patch_needs_a_server_source(tmp_path: Path) -> None:
    from llamaspec.errors import LlamaspecError
    from llamaspec.maint import build_bench as benchbuild

    with pytest.raises(LlamaspecError, match="does not know where ik_llama.cpp's server"):
        benchbuild.one_line_patch(tmp_path, "ik_llama.cpp", "v1")


def test_bench_build_adds_its_patch_to_the_patch_list_not_the_defects(tmp_path: Path) -> None:
    import shutil

    from llamaspec import config
    from llamaspec.maint import build_bench
    from llamaspec.paths import project_root

    root = build_bench._patch_root(project_root(), "llama.cpp")
    try:
        assert config.load_series(root)[-1].id == build_bench.BENCH_PATCH
        assert config.load_defects(root) == config.load_defects(project_root())
    finally:
        shutil.rmtree(root)


def test_verify_target_must_be_a_gguf_file_before_any_server(tmp_path: Path) -> None:
    from llamaspec.proof.suite import check_gguf

    models = tmp_path / "models"
    models.mkdir()
    (models / "a.gguf").write_bytes(b"GGUF" + bytes(60))
    check_gguf(models / "a.gguf", "--target")
    with pytest.raises(LlamaspecError, match=r"is a directory, not a GGUF file\. It holds a\.gguf"):
        check_gguf(models, "--target")
    with pytest.raises(LlamaspecError, match="does not exist"):
        check_gguf(models / "b.gguf", "--draft")
    (models / "model.safetensors").write_bytes(b'{"__metadata__": {}}')
    with pytest.raises(LlamaspecError, match=r"not a GGUF file \(it starts with b'\{\"__', not"):
        check_gguf(models / "model.safetensors", "--target")
    (models / "empty.gguf").write_bytes(b"")
    with pytest.raises(LlamaspecError, match=r"not a GGUF file \(it is empty\)"):
        check_gguf(models / "empty.gguf", "--target")
