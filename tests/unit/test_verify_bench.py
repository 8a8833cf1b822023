"""Pure parts of the equivalence suite and the benchmark."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llamaspec.models import dialects
from llamaspec.proof import bench, verify

pytestmark = pytest.mark.unit


def test_expected_speedup_formula() -> None:
    # a=0.8, g=4, c=0.1: (1 - 0.8^5) / (0.2 * 1.4)
    assert bench.expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert bench.expected_speedup(1.0, 8, 1.0) == pytest.approx(1.0)
    assert bench.expected_speedup(0.0, 8, 0.05) < 1.0


def test_summary_reports_speedup_acceptance_and_ratio() -> None:
    w = bench.WorkloadResult("code")
    w.plain = [bench.Sample(10.0, 64), bench.Sample(12.0, 64), bench.Sample(11.0, 64)]
    w.spec = [bench.Sample(16.5, 64, 40, 30, 10)] * 3
    s = bench.summarize(w, g=4, cost_ratio=0.1)
    assert s["speedup"] == pytest.approx(1.5) and s["acceptance"] == 0.75
    assert s["mean_accepted_length"] == 3.0 and s["plain_tps_spread"] == [10.0, 12.0]
    assert s["measured_over_expected"] == pytest.approx(1.5 / s["expected_speedup"], rel=1e-2)


def test_dialect_probe_from_help() -> None:
    assert dialects.probe_dialect("llama.cpp", "--spec-draft-n-max N  x") == "upstream"
    assert dialects.probe_dialect("llama.cpp", "--draft-max N  x") == "upstream-legacy"
    assert dialects.probe_dialect("ik_llama.cpp", "--draft-max, --draft N") == "ik-legacy"
    assert dialects.probe_dialect("ik_llama.cpp", "--spec-type TYPE:k=v") == "ik-spec-type"


def test_methods_follow_the_binary() -> None:
    upstream_help = "--spec-type none,draft-simple,ngram-simple,ngram-map-k,ngram-mod\n"
    upstream_help += "--spec-ngram-mod-n-min N\n"
    methods = verify.methods_for("upstream", upstream_help, None, has_mtp=False)  # type: ignore[arg-type]
    names = [m.name if isinstance(m, verify.Method) else m for m in methods]
    assert names[:4] == ["draft", "ngram-simple", "ngram-map-k", "ngram-mod"]
    assert names[-1] == "mtp: the model has no MTP heads"
    old = verify.methods_for("ik-legacy", "--spec-type ngram-simple", None, False)  # type: ignore[arg-type]
    assert "ngram-mod: not in this binary's --spec-type list" in old


def test_verify_prompts_cover_short_code_prose_and_chat() -> None:
    names = [p.name for p in verify.VERIFY_PROMPTS]
    assert {"short", "code", "prose", "chat", "rewrite"} <= set(names)
    short = next(p for p in verify.VERIFY_PROMPTS if p.name == "short")
    assert len(short.text.split()) < 32
    chat = next(p for p in verify.VERIFY_PROMPTS if p.name == "chat")
    assert chat.text.count("User:") == 4


def test_one_line_patch_applies_and_changes_one_line(tmp_path: Path) -> None:

    from llamaspec.engine import build_bench as benchbuild

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
    from llamaspec.engine import build_bench as benchbuild
    from llamaspec.errors import LlamaspecError

    with pytest.raises(LlamaspecError, match="does not know where ik_llama.cpp's server"):
        benchbuild.one_line_patch(tmp_path, "ik_llama.cpp", "v1")
