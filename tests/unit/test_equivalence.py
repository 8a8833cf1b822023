"""Strict comparison, known defects and reference copies (no server needed)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.proof import defects, reference, smoke, verify, verify_report
from llamaspec.proof.prompts import VERIFY_PROMPTS, choose_prompts
from llamaspec.runtime.client import Completion, Prompt

pytestmark = pytest.mark.unit

IK_PIN = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
P = Prompt("p", "text", 8)
PLAIN = "abcdefgh"  # a plain output of P.n_predict = 8 tokens


def t(pieces: list[str], predicted: int | None = None) -> Completion:
    return Completion(tuple(pieces), "".join(pieces), 1.0, None, None, predicted)


def test_strict_comparison_has_no_threshold() -> None:
    ref = t(["a", "b", "c", "d"])
    assert verify.compare(P, "sequential", ref, t(["a", "b", "c", "d"]), None, None).kind == (
        "identical"
    )
    diff = verify.compare(P, "parallel", ref, t(["a", "b", "x", "d"]), None, None)  # type: ignore[arg-type]
    assert (diff.kind, diff.position, diff.mode) == ("different", 2, "parallel")
    assert "⟦cd⟧" in diff.reference and "⟦xd⟧" in diff.speculative
    short = verify.compare(P, "sequential", ref, t(["a", "b"]), None, None)  # type: ignore[arg-type]
    assert (short.kind, short.position) == ("short", 2)
    longer = verify.compare(P, "sequential", ref, t(["a", "b", "c", "d", "e"]), None, None)  # type: ignore[arg-type]
    assert longer.kind == "longer"


def test_a_short_output_on_a_pin_with_that_defect_on_record_is_named() -> None:
    manifest = {"engine": "ik_llama.cpp", "commit": IK_PIN, "patches": []}
    found = defects.known_defect(manifest, "short-output")
    assert found is not None and found.id == "ik-spec-short-output"
    # the catalogued symptom: all 8 tokens reported, 7 of the plain output's 8 returned (this
    # test used to pass 1 of 3 with no count reported, which the rule no longer excuses)
    case = verify.compare(P, "sequential", t(list(PLAIN)), t(list(PLAIN[:7]), 8), None, found)  # type: ignore[arg-type]
    assert case.kind == "known-defect" and "ik-spec-short-output" in (case.defect or "")
    # other pins, other engines and other symptoms do not match
    assert defects.known_defect({**manifest, "commit": "0" * 40}, "short-output") is None
    assert defects.known_defect({**manifest, "engine": "llama.cpp"}, "short-output") is None
    hybrid = defects.defects_for(manifest, "corrupt-output")
    assert hybrid and "1639" in hybrid[0].issue


def _ik_short_output() -> defects.Defect:
    manifest = {"engine": "ik_llama.cpp", "commit": IK_PIN, "patches": []}
    found = defects.known_defect(manifest, "short-output")
    assert found is not None and found.min_kept == 0.5
    return found


def _against_the_defect(output: str, predicted: int | None) -> verify_report.Case:
    """`output` (one letter a token) against PLAIN, on a build with ik-spec-short-output."""
    spec = t(list(output), predicted)
    return verify.compare(P, "sequential", t(list(PLAIN)), spec, None, _ik_short_output())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("output", "predicted"),
    [("abcdefg", 8), ("abcd", 8)],  # 7 of 8; exactly the catalogued least (half of 8)
)
def test_a_short_output_is_excused_when_it_matches_the_catalogued_symptom(
    output: str, predicted: int
) -> None:
    case = _against_the_defect(output, predicted)
    assert (case.kind, case.position, case.note) == ("known-defect", len(output), "")
    assert case.defect and case.defect.startswith("known defect ik-spec-short-output")


@pytest.mark.parametrize(
    ("output", "predicted", "kind", "why"),
    [
        ("", 8, "short", "the output is empty"),
        ("abc", 8, "short", "keeps 3 of the plain output's 8 tokens, fewer than the 4"),
        ("abcdefg", 7, "short", "reported 7 tokens predicted, not the 8 asked for"),
        ("abcdefg", None, "short", "reported no tokens_predicted"),
        ("abcdefx", 8, "different", "not a strict prefix of the plain output"),
        ("abcdefghi", 8, "longer", "not a strict prefix of the plain output"),
    ],
)
def test_anything_but_the_catalogued_symptom_fails_and_says_why(
    output: str, predicted: int | None, kind: str, why: str
) -> None:
    case = _against_the_defect(output, predicted)
    assert case.kind == kind and case.defect is None
    assert (
        case.note.startswith("not the catalogued defect ik-spec-short-output: ")
        and why in case.note
    )
    m = verify_report.MethodResult("draft", (), cases=(case,))
    report = verify_report.VerifyReport("id", "embedded", "strict", "m", (m,))
    assert not report.passed and f"- {case.note}" in verify_report.markdown(report)
    # the smoke fails on it too, and its one-paragraph error gives the reason
    strict = smoke.StrictResult("p", "draft", case, 8, 8)
    rep = smoke.SmokeReport("id", "draft", [], strict=[strict])
    assert not rep.passed and why in smoke._why(rep)


def test_the_defect_rule_counts_characters_where_only_text_is_compared() -> None:
    d = _ik_short_output()
    plain = "x" * 113
    assert d.not_short_output(plain, plain[:82], 48, 48, "characters") is None  # as measured
    why = d.not_short_output(plain, plain[:56], 48, 48, "characters")
    assert why and "keeps 56 of the plain output's 113 characters, fewer than the 57" in why


def test_a_short_output_defect_needs_a_fraction_kept(tmp_path: Path) -> None:
    entry = (
        "defects:\n  - id: d\n    engine: ik_llama.cpp\n    pins: [%s]\n"
        "    symptom: %s\n    summary: s\n"
    )
    series = tmp_path / "patches" / "series.yaml"
    series.parent.mkdir()
    short = entry % ("b" * 40, "short-output")
    for extra, message in [
        ("", "min_kept.*needed by short-output"),
        ("    min_kept: 1.0\n", "min_kept: Input should be less than 1"),
        ("    min_kept: 0\n", "min_kept: Input should be greater than 0"),
        ("    min_kept: half\n", "min_kept: Input should be a valid number"),
    ]:
        series.write_text(short + extra)
        with pytest.raises(LlamaspecError, match=message):
            config.load_defects(tmp_path)
    series.write_text(short + "    min_kept: 0.5\n")
    assert config.load_defects(tmp_path)[0].min_kept == 0.5
    series.write_text(entry % ("b" * 40, "corrupt-output") + "    min_kept: 0.5\n")
    with pytest.raises(LlamaspecError, match="by no other symptom"):
        config.load_defects(tmp_path)


def test_failures_and_report_pass_rule() -> None:
    m = verify_report.MethodResult(
        "draft",
        (),
        cases=(
            verify_report.Case("p", "sequential", "identical"),
            verify_report.Case("q", "parallel", "known-defect"),
        ),
    )
    r = verify_report.VerifyReport("id", "embedded", "strict", "m.gguf", (m,))
    assert r.passed and r.to_json()["methods"][0]["summary"]["parallel"]["failed"] == 0
    m = replace(m, cases=(*m.cases, verify_report.Case("q", "parallel", "different", 3)))
    r = replace(r, methods=(m,))
    assert not r.passed and "different at token 3" in verify_report.markdown(r)
    assert "- speculative: `" in verify_report.markdown(r)
    control = verify_report.MethodResult(
        "plain", (), cases=(verify_report.Case("q", "parallel", "different", 1),)
    )
    text = verify_report.markdown(
        verify_report.VerifyReport("id", "embedded", "strict", "m", (control,))
    )
    assert "- control (no speculation): `" in text and "- speculative" not in text
    m = replace(m, argv=("--spec-type", "ngram-mod"))
    r = replace(r, methods=(m,), server=("llama-server", "-m", "m.gguf", "-np", "4"))
    assert "Plain server: `llama-server -m m.gguf -np 4`" in verify_report.markdown(r)
    assert "- draft: `--spec-type ngram-mod`" in verify_report.markdown(r)
    skipped = verify_report.VerifyReport(
        "id", "x", "strict", "m", (verify_report.MethodResult("a", (), "n/a"),)
    )
    assert not skipped.passed  # nothing ran: nothing is proven


def _small_quantized(path: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 64)).astype(np.float32)
    w = GGUFWriter(str(path), arch="llama")
    w.add_name("tiny")
    w.add_file_type(7)
    w.add_uint32("llama.context_length", 64)
    q = quantize(weights, GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.w", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.norm", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequantize(q, GGMLQuantizationType.Q8_0)


def test_reference_copy_is_f32_verified_and_rebuilt_when_changed(tmp_path: Path) -> None:
    src = tmp_path / "tiny-q8_0.gguf"
    expected = _small_quantized(src)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    ref = reference.reference_copy(src, digest)
    reader = GGUFReader(ref.path)
    tensors = {t.name: t for t in reader.tensors}
    assert {int(t.tensor_type) for t in reader.tensors} == {0}  # F32
    np.testing.assert_array_equal(np.asarray(tensors["blk.0.w"].data), expected)
    assert reader.get_field("llama.context_length").contents() == 64
    assert reader.get_field("general.file_type").contents() == 0
    meta = json.loads(ref.path.with_suffix(".json").read_text())
    assert meta["source_sha256"] == digest and meta["sha256"] == ref.sha256
    # a changed copy is detected and made again; nothing half-written is left behind
    with ref.path.open("r+b") as f:
        f.seek(-8, 2)
        f.write(b"\0" * 8)
    again = reference.reference_copy(src, digest)
    assert again.sha256 == ref.sha256
    assert not list(ref.path.parent.glob(".tmp-*"))
    # a truncated, unreadable or foreign record is a mismatch too: made again, no traceback
    record = ref.path.with_suffix(".json")
    for broken in (record.read_bytes()[:20], b"\xff\xfe\x00", b"[1, 2]"):
        record.write_bytes(broken)
        said: list[str] = []
        assert reference.reference_copy(src, digest, said.append).sha256 == ref.sha256
        assert any("does not match its record" in m for m in said)
        assert json.loads(record.read_text())["sha256"] == ref.sha256


def test_reference_copy_that_does_not_fit_is_refused_before_writing(tmp_path: Path) -> None:
    src = tmp_path / "tiny-q8_0.gguf"
    _small_quantized(src)
    with pytest.raises(LlamaspecError, match=r"needs .* GiB"):
        reference.check_fits(src, tmp_path / "ref", need=1 << 60)
    assert not list((tmp_path / "ref").glob("*.gguf"))


def test_a_file_that_is_not_gguf_gets_one_paragraph(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    with pytest.raises(LlamaspecError, match="cannot be read as a GGUF"):
        reference.reference_copy(bad, "0" * 64)


def test_an_f32_model_is_its_own_reference(tmp_path: Path) -> None:
    src = tmp_path / "f32.gguf"
    w = GGUFWriter(str(src), arch="llama")
    w.add_tensor("blk.0.w", np.ones((2, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    ref = reference.reference_copy(src, digest)
    assert ref.path == src and ref.sha256 == digest
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*f32.gguf"))


def test_prompts_can_be_narrowed_by_name() -> None:
    assert [p.name for p in choose_prompts(["code", "short"])] == ["short", "code"]
    assert choose_prompts([]) == VERIFY_PROMPTS
    with pytest.raises(LlamaspecError, match="Did you mean 'prose'"):
        choose_prompts(["prse"])


def test_tune_checks_candidates_on_the_reference_copy_where_one_can_be_made(
    tmp_path: Path,
) -> None:
    from rich.console import Console

    from llamaspec.perf import tune

    src = tmp_path / "tiny-q8_0.gguf"
    _small_quantized(src)
    console = Console(record=True, width=200)
    path, what = tune.check_model(src, console)
    assert path != src and reference.is_f32(path)
    assert what.startswith("the F32 reference copy of tiny-q8_0.gguf (sha256 ")
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all")
    path, what = tune.check_model(bad, console)
    assert path == bad and what == "x.gguf itself (no F32 reference copy)"
    assert "checking candidates on x.gguf itself" in console.export_text()


def test_a_build_that_refuses_speculation_on_parallel_slots_runs_one_slot_and_says_so() -> None:
    """ik_llama.cpp 8337e4c refuses a speculative server with -np > 1: the method runs
    sequentially on one slot of the same context, and the report says parallel was not run."""
    base = ("-m", "t.gguf", "-c", "16384", "-np", "4", "--no-warmup", "-fa", "off")
    setup = verify.Setup(Path("t.gguf"), Path("t.gguf"), base, (), 1, ("-fa", "off"))
    assert verify._one_slot(setup, verify.SLOT_CTX) == (
        "-m", "t.gguf", "-c", str(verify.SLOT_CTX), "-np", "1", "--no-warmup", "-fa", "off"
    )  # fmt: skip
    m = verify_report.MethodResult(
        "ngram-mod",
        ("--spec-type", "ngram-mod"),
        cases=(verify_report.Case("p", "sequential", "identical"),),
        one_slot=True,
    )
    skipped = verify_report.MethodResult("mtp", (), skipped="this build does not offer it")
    report = verify_report.VerifyReport("id", "embedded", "strict", "m.gguf", (m, skipped))
    md = verify_report.markdown(report)
    assert report.passed
    assert "| mtp | – |  |  |  |  |  | this build does not offer it |" in md
    assert "| ngram-mod | sequential | 1 | 0 | 0 | 0 | 0 | one slot (-np 1) |" in md
    assert f"| ngram-mod | parallel |  |  |  |  |  | {verify_report.ONE_SLOT_NOTE} |" in md
    # every row has the header's eight columns
    rows = [ln for ln in md.splitlines() if ln.startswith("| ngram-mod")]
    assert len(rows) == 2 and {ln.count("|") for ln in rows} == {9}
