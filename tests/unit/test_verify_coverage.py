"""verify's coverage table: every type the build offers, covered or why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamaspec.errors import LlamaspecError
from llamaspec.proof import coverage
from llamaspec.proof.refmodels import registry
from llamaspec.proof.verify_report import Case, MethodResult, VerifyReport

UPSTREAM = (
    "--spec-type none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,draft-dspark,"
    "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache\n"
    "-md, --spec-draft-model FNAME\n"
)
IK = (
    "--spec-type Name [none | ngram - cache | ngram - simple | ngram - map - k | "
    "ngram - map - k4v | ngram - mod]\n  -md, --model-draft FNAME\n"
    "  -mtp, --multi-token-prediction  whether to use multi-token-prediction\n"
)


def _result(method: str, kinds: list[tuple[str, str]], drafted=10, accepted=5) -> MethodResult:
    cases = tuple(Case("p", mode, kind) for mode, kind in kinds)
    per_mode = {m: (drafted, accepted) for m, _ in kinds}
    return MethodResult(method, (), cases=cases, drafted=drafted, accepted=accepted,
                        per_mode=per_mode)  # fmt: skip


def _report(tag: str, *methods: MethodResult) -> VerifyReport:
    return VerifyReport("a-1", tag, "strict", f"{tag}.gguf", methods)


def test_every_upstream_type_is_a_row_and_ik_adds_its_switches() -> None:
    names = [n for n, _ in coverage.offered_types("upstream", UPSTREAM)]
    assert len(names) == 10 and "none" not in names
    assert dict(coverage.offered_types("upstream", UPSTREAM))["draft-mtp"] == ("assistant", "mtp")
    ik = dict(coverage.offered_types("ik-legacy", IK))
    assert ik["draft (-md)"] == ("draft",) and ik["mtp (-mtp)"] == ("mtp",)
    assert {"ngram-cache", "ngram-mod", "ngram-map-k4v"} <= set(ik)


def test_rows_say_covered_or_why_not() -> None:
    both = [("sequential", "identical"), ("parallel", "identical")]
    reports = [
        _report("hybrid", _result("ngram-mod", both), _result("ngram-cache", both, 8, 0)),
        _report("mtp", _result("mtp", [("sequential", "identical"), ("parallel", "different")])),
        _report("emb", MethodResult("draft", (), skipped="draft-simple is not listed")),
    ]
    cov = coverage.coverage("a-1", "llama.cpp", "upstream", UPSTREAM, reports,
                            {"eagle3": "not run: add --model eagle3"})  # fmt: skip
    rows = {r.engine_type: r for r in cov.rows}
    assert len(rows) == 10
    assert rows["ngram-mod"].covered and rows["ngram-mod"].identical == {
        "sequential": "1/1", "parallel": "1/1"
    }  # fmt: skip
    assert rows["ngram-mod"].model == "hybrid (hybrid.gguf)"
    assert not rows["ngram-cache"].covered and "nothing accepted" in rows["ngram-cache"].why
    assert not rows["draft-mtp"].covered and "differ" in rows["draft-mtp"].why
    assert rows["draft-simple"].why == "draft-simple is not listed"
    assert rows["draft-eagle3"].why == "not run: add --model eagle3"
    assert rows["draft-dflash"].why == "no model in this run exercises it"
    assert {r.engine_type for r in cov.uncovered} == set(rows) - {"ngram-mod"}


def test_an_output_a_catalogued_defect_cut_short_is_not_coverage() -> None:
    m = MethodResult(
        "ngram-mod", (),
        cases=(Case("p", "sequential", "identical"), Case("p", "parallel", "known-defect",
               defect="known defect ik-spec-short-output: cut short (fix: …)")),
        drafted=9, accepted=9,
    )  # fmt: skip
    cov = coverage.coverage("a-1", "ik_llama.cpp", "ik-legacy", IK, [_report("emb", m)], {})
    row = next(r for r in cov.rows if r.engine_type == "ngram-mod")
    assert not row.covered
    assert row.why == "1 output(s) cut short by the catalogued defect ik-spec-short-output"


def test_a_covered_type_needs_both_modes(tmp_path: Path) -> None:
    seq_only = _report("hybrid", _result("ngram-simple", [("sequential", "identical")]))
    cov = coverage.coverage("a-1", "llama.cpp", "upstream", UPSTREAM, [seq_only], {})
    row = next(r for r in cov.rows if r.engine_type == "ngram-simple")
    assert not row.covered and row.why == "ran in sequential mode only"
    md = coverage.write(cov, tmp_path)
    assert "| `ngram-simple` | **no** |" in md.read_text()
    data = json.loads(md.with_suffix(".json").read_text())
    assert data["complete"] is False and len(data["rows"]) == 10


def test_a_family_the_build_cannot_load_is_refused_before_anything_is_written() -> None:
    why = registry.runnable(registry.BY_NAME["eagle3"], "ik_llama.cpp", "ik-legacy", IK)
    assert why and "llama.cpp's loader" in why
    with pytest.raises(LlamaspecError, match="cannot run on this build") as exc:
        registry.pair_for("eagle3", "ik_llama.cpp", "ik-legacy", IK)
    assert "\n" not in exc.value.message
    no_mtp = UPSTREAM.replace("draft-mtp,", "")
    assert "draft-mtp is not in this binary" in str(
        registry.runnable(registry.BY_NAME["mtp"], "llama.cpp", "upstream", no_mtp)
    )


def test_each_row_and_each_served_model_names_its_architecture(tmp_path: Path) -> None:
    both = [("sequential", "identical"), ("parallel", "identical")]
    reports = [
        _report("hybrid", _result("ngram-mod", both)),
        _report("qwen35moe-mtp", _result("mtp", both, 20, 7)),
        _report("eagle3", _result("eagle3", [("sequential", "identical")])),
    ]
    cov = coverage.coverage("a-1", "llama.cpp", "upstream", UPSTREAM, reports, {})
    rows = {r.engine_type: r for r in cov.rows}
    assert rows["draft-mtp"].arch == "qwen35moe" and rows["draft-mtp"].covered
    assert rows["ngram-mod"].arch == "qwen35, draft qwen35"
    assert rows["draft-eagle3"].arch == "llama, draft eagle3" and not rows["draft-eagle3"].covered
    assert rows["draft-dflash"].arch == ""  # nothing ran it
    served = {s.model: s for s in cov.served}
    assert list(served) == ["hybrid (hybrid.gguf)", "qwen35moe-mtp (qwen35moe-mtp.gguf)",
                            "eagle3 (eagle3.gguf)"]  # fmt: skip
    moe = served["qwen35moe-mtp (qwen35moe-mtp.gguf)"]
    assert (moe.arch, moe.methods, moe.accepted, moe.drafted) == ("qwen35moe", ("mtp",), 7, 20)
    assert moe.identical == {"sequential": "1/1", "parallel": "1/1"} and moe.passed
    md = coverage.write(cov, tmp_path).read_text()
    assert "| `draft-mtp` | yes | qwen35moe-mtp (qwen35moe-mtp.gguf) | qwen35moe | mtp |" in md
    assert "| qwen35moe-mtp (qwen35moe-mtp.gguf) | qwen35moe | mtp | 1/1, 1/1 | 7/20 | yes |" in md
    data = json.loads((tmp_path / "verify-a-1-coverage.json").read_text())
    assert data["served"][1]["arch"] == "qwen35moe"
    assert coverage.architecture("embedded-defaults") == "gemma3, draft gemma3"
    assert coverage.architecture("recipe-x-oracle") == ""


def test_every_family_declares_the_architectures_its_files_have() -> None:
    """The table's architecture is the registry's word: it must be what the writer writes."""
    import importlib

    from gguf import GGUFReader

    def arch(path) -> str:
        return GGUFReader(str(path)).fields["general.architecture"].contents()

    for f in registry.FAMILIES:
        module = importlib.import_module(f"llamaspec.proof.refmodels.{f.module}")
        ref = getattr(module, f.func)()
        assert arch(ref.target) == f.arch, f.name
        assert (arch(ref.draft) if ref.draft else "") == f.draft_arch, f.name
