"""Under which flags "exact" holds: reports name the determinism flags, and a recipe's
oracle report adds the recipe under its own flags, judged against the same envelope."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.proof import suite, verify, verify_report

pytestmark = pytest.mark.unit

DET = ["--no-kv-unified", "-fa", "off"]


def _env(gap: float = 0.25) -> verify_report.Envelope:
    return verify_report.Envelope(("sequential", "parallel slots"), gap, {"sequential": gap})


def _recipe_report(own_kind: str, own_gap: float) -> verify_report.VerifyReport:
    det = verify_report.MethodResult(
        "tuned",
        ("--spec-type", "ngram-simple"),
        cases=(
            verify_report.Case("code", "sequential", "identical", max_gap=0.0),
            verify_report.Case("chat", "parallel", "within", 3, 0.1),
        ),
    )
    own = verify_report.MethodResult(
        "tuned",
        ("--spec-type", "ngram-simple"),
        cases=(
            verify_report.Case("code", "sequential", "identical", max_gap=0.0),
            verify_report.Case("chat", "sequential", own_kind, 5, own_gap, ["token 5: …"]),
        ),
        flags="own",
    )
    return verify_report.VerifyReport(
        "art", "recipe-tuned-oracle", "oracle", "m.gguf", (det, own), _env(), None, 12, 3.0,
        ("llama-server", "-m", "m.gguf", *DET), tuple(DET),
    )  # fmt: skip


def test_the_strict_report_names_its_determinism_flags() -> None:
    r = verify_report.VerifyReport(
        "art", "embedded", "strict", "m-f32.gguf", (), determinism=tuple(DET)
    )
    md = verify_report.markdown(r)
    assert "Exact under the determinism flags `--no-kv-unified -fa off`" in md
    assert "token-identical" in md and r.to_json()["determinism"] == DET
    assert r.to_json()["own_flags"] is None
    # a run on the server's defaults (the measurement option) claims no exactness
    d = verify_report.VerifyReport("art", "embedded-defaults", "strict", "m", (), determinism=())
    assert "exactness is not claimed" in verify_report.markdown(d)
    assert "--server-defaults" in verify_report.markdown(d)
    # reports that did not record flags say nothing about them
    assert "determinism" not in verify_report.markdown(
        verify_report.VerifyReport("a", "e", "strict", "m", ())
    )


def test_a_difference_under_the_recipes_own_flags_within_the_envelope_passes() -> None:
    r = _recipe_report("within", 0.013)
    assert r.passed
    md = verify_report.markdown(r)
    assert "| tuned (recipe's own flags) | sequential | 1 | 1 | 0 | 0.013 |" in md
    assert "| tuned | sequential | 1 | 0 | 0 |" in md
    assert "## Recipe's own flags vs determinism flags" in md
    assert "determinism flags `--no-kv-unified -fa off`" in md
    # only the own-flags rows are counted, against the same envelope
    assert "(0.25 nats): 1 of 2 outputs identical, 1 within the envelope, 0 over it" in md
    assert "over it; the largest per-token gap 0.013 nats." in md
    assert "stays within the envelope" in md and "Result: PASSED" in md
    assert "- tuned (recipe's own flags): `--spec-type ngram-simple` (without the" in md
    s = r.to_json()["own_flags"]
    assert s == {
        "outputs": 2, "identical": 1, "within_envelope": 1, "over_envelope": 0,
        "other_failures": 0, "max_gap": 0.013, "envelope": 0.25, "verdict": "passed",
    }  # fmt: skip
    assert [m["flags"] for m in r.to_json()["methods"]] == ["determinism", "own"]


def test_a_token_over_the_envelope_under_the_recipes_own_flags_fails() -> None:
    r = _recipe_report("over-envelope", 0.9)
    assert not r.passed
    md = verify_report.markdown(r)
    assert "FAILED: under its own flags" in md and "Result: FAILED" in md
    assert "## tuned (recipe's own flags) / chat (sequential): over-envelope at token 5" in md
    assert r.to_json()["own_flags"]["verdict"] == "failed"
    assert r.to_json()["own_flags"]["over_envelope"] == 1


def test_no_change_under_the_own_flags_is_said_plainly() -> None:
    r = _recipe_report("identical", 0.0)
    assert "the defaults changed no output here" in verify_report.markdown(r)


def test_the_console_names_the_flags_and_the_own_flags_verdict() -> None:
    console = Console(record=True, width=200)
    verify_report.print_table(_recipe_report("within", 0.013), console)
    out = console.export_text()
    rows = [line.split() for line in out.splitlines() if line.startswith("│ tuned")]
    assert [r[3] for r in rows] == ["determinism", "determinism", "own"]
    assert "--no-kv-unified -fa off" in out
    assert "stays within the envelope" in out and "verify: PASSED" in out


def test_server_defaults_drop_exactly_the_determinism_flags() -> None:
    base = ("-m", "m.gguf", "-c", "16384", "-np", "4", "--no-warmup")
    setup = verify.Setup(Path("m"), Path("m"), (*base, *DET), (), 1, tuple(DET))
    plain = setup.server_defaults()
    assert plain.base == base and plain.determinism == ()
    assert plain.server_defaults().base == base  # nothing more to drop


def test_the_own_flags_method_keeps_the_recipes_flash_attention_setting() -> None:
    argv = ["llama-server", "-m", "t.gguf", "-c", "4096", "-np", "1", "-fa", "on",
            "--spec-type", "ngram-simple", "--host", "h", "--port", "1"]  # fmt: skip
    assert suite.spec_method(argv, "r").argv == ("--spec-type", "ngram-simple")
    own = suite.spec_method(argv, "r", keep=("-fa",))
    assert own.argv == ("-fa", "on", "--spec-type", "ngram-simple")


# Which tiers a --target or --recipe run takes: decided from the target's GGUF header.
PIN = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # upstream's default pin


def _gguf(path: Path, *types: str) -> Path:
    """A tiny GGUF with one 32×32 tensor of each type named (F32, F16, BF16, Q8_0, I32)."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    w = gguf.GGUFWriter(path, "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])  # a string array to walk over
    w.add_uint32("llama.block_count", 1)
    data = np.linspace(-1, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
    for i, t in enumerate(types):
        if t == "I32":
            w.add_tensor(f"t{i}", np.arange(32, dtype=np.int32))
            continue
        q = gguf.GGMLQuantizationType[t]
        w.add_tensor(f"t{i}", quantize(data, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_precision_comes_from_the_header(tmp_path: Path) -> None:
    from llamaspec.errors import LlamaspecError
    from llamaspec.models.precision import read_precision

    f32 = read_precision(_gguf(tmp_path / "a.gguf", "F32", "F32", "I32"))
    assert (f32.kind, f32.types, f32.describe()) == ("f32", ("F32",), "F32")
    assert f32.f32_bytes == 2 * 32 * 32 * 4 + 32 * 4  # the int tensor is kept as it is
    half = read_precision(_gguf(tmp_path / "h.gguf", "F32", "BF16", "F16"))
    assert half.kind == "half" and half.describe() == "F16/BF16 (BF16, F16, F32)"
    assert half.f32_bytes == 3 * 32 * 32 * 4 and not half.quantized
    q = read_precision(_gguf(tmp_path / "q.gguf", "F32", "F16", "Q8_0"))
    assert q.quantized and q.describe() == "quantized (F16, F32, Q8_0)"
    cut = tmp_path / "cut.gguf"
    cut.write_bytes((tmp_path / "q.gguf").read_bytes()[:60])
    with pytest.raises(LlamaspecError, match="truncated or corrupt GGUF header"):
        read_precision(cut)


def test_a_full_precision_target_gets_the_strict_tier_by_default(tmp_path: Path) -> None:
    from llamaspec.models.precision import Precision

    f32 = Precision(("F32",), 4 << 30)
    t = suite.tiers_for(f32, "m.gguf", None)
    assert (t.strict, t.oracle, t.after) == (True, False, "")  # strict proves more, same file
    assert t.plan == "m.gguf is F32: the strict tier (token identity, no threshold) on " \
        "m.gguf itself (F32)"  # fmt: skip
    assert suite.tiers_for(f32, "m.gguf", None, recipe=True).oracle  # a recipe's own flags
    half = suite.tiers_for(Precision(("BF16", "F32"), 2 << 30), "h.gguf", None)
    assert (half.strict, half.oracle, half.after) == (True, True, "")
    assert "widens to F32 without loss; 2.00 GiB" in half.plan
    # asked for explicitly: as asked
    assert (suite.tiers_for(f32, "m", "oracle").strict, suite.tiers_for(f32, "m", "both").oracle) \
        == (False, True)  # fmt: skip
    only = suite.tiers_for(f32, "m.gguf", "oracle").after
    assert "only the oracle tier ran" in only and "Drop --tier oracle" in only


def test_a_quantized_target_says_what_an_oracle_only_run_means(tmp_path: Path) -> None:
    from llamaspec.models.precision import Precision

    q = Precision(("F32", "Q4_K", "Q6_K"), 1 << 30)
    t = suite.tiers_for(q, "q.gguf", None)
    assert (t.strict, t.oracle) == (False, True)
    assert t.plan == "q.gguf is quantized (F32, Q4_K, Q6_K): the oracle tier on q.gguf as it is"
    said = " ".join(t.after.split())
    assert "only the oracle tier ran on q.gguf" in said and "near-tie" in said
    assert "give an F32, F16 or BF16 file of the same model as --target" in said
    assert "add --strict to run it on an F32 copy of this one (1.00 GiB" in said
    strict = suite.tiers_for(q, "q.gguf", "both")
    assert strict.strict and strict.oracle and strict.after == ""
    assert "an F32 copy of q.gguf (quantized (F32, Q4_K, Q6_K) dequantized" in strict.plan


def _failed(tag: str, tier: str) -> verify_report.VerifyReport:
    case = verify_report.Case("code", "sequential", "different", 3)
    return verify_report.VerifyReport(
        "art", tag, tier, "m.gguf", (verify_report.MethodResult("draft", (), cases=(case,)),)
    )


def test_a_strict_failure_is_not_explained_by_a_quantized_only_defect() -> None:
    from llamaspec.engine.artifact import Artifact
    from llamaspec.errors import LlamaspecError
    from llamaspec.proof import defects

    manifest = {"engine": "llama.cpp", "commit": PIN, "patches": []}
    ids = [d.id for d in defects.explaining(manifest, quantized=False)]
    assert "quantized-spec-near-tie" not in ids
    assert "quantized-spec-near-tie" in [d.id for d in defects.explaining(manifest, True)]
    # wasted work leaves outputs right: it explains no failure
    assert "draft-model-never-drafts" in [d.id for d in defects.defects_for(manifest)]
    assert "draft-model-never-drafts" not in [d.id for d in defects.explaining(manifest, True)]
    art = Artifact("art", Path("dist"), manifest, True)
    strict = suite.Outcome((_failed("file-m", "strict"),))
    with pytest.raises(LlamaspecError) as err:
        strict.raise_if_failed(art, Path("reports"))
    assert "file-m (strict)" in str(err.value) and "quantized-spec-near-tie" not in str(err.value)
    # the oracle tier on a quantized file: the quantized-only defect may explain it
    oracle = suite.Outcome((_failed("file-q-oracle", "oracle"),), quantized=("file-q-oracle",))
    with pytest.raises(LlamaspecError, match="quantized-spec-near-tie"):
        oracle.raise_if_failed(art, Path("reports"))
