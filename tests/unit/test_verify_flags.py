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
