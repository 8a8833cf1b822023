"""The smoke's pass rule, the quantized comparison (information) and acceptance parsing."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest

from llamaspec.proof import smoke, software, verify_report
from llamaspec.proof.smoke import Completion

pytestmark = pytest.mark.unit


def c(tokens: list[int], draft: int | None = None, acc: int | None = None) -> Completion:
    return Completion(tuple(tokens), "", 10.0, draft, acc)


def test_identical() -> None:
    assert smoke.classify(c([1, 2, 3]), c([1, 2, 3]), None).kind == "identical"


def test_near_tie_inside_margin() -> None:
    v = smoke.classify(c([1, 2, 3, 4]), c([1, 2, 9, 9]), (3, {3: -1.0, 9: -1.2, 5: -3.0}))
    assert (v.kind, v.position) == ("near-tie", 2)
    assert v.delta_nats == pytest.approx(0.2)
    assert "differs at token 2 (Δ=0.200 nats)" in v.describe()


def test_hard_outside_margin_or_outside_top_k() -> None:
    far = smoke.classify(
        c([1, 2]), c([1, 7]), (2, {2: -0.1, 7: -0.1 - smoke.NEAR_TIE_MARGIN_NATS - 0.01})
    )
    assert far.kind == "hard" and "differs at token 1" in far.describe()
    absent = smoke.classify(c([1, 2]), c([1, 7]), (2, {2: -0.1}))
    assert absent.kind == "hard" and "not in the reference's top" in absent.describe()


def test_reference_that_no_longer_reproduces_is_hard() -> None:
    # the probe's own greedy choice differs from the reference run: not a trustworthy near-tie
    assert smoke.classify(c([1, 2]), c([1, 7]), (7, {2: -0.1, 7: -0.05})).kind == "hard"


def test_speculative_prefix_that_stops_early_is_short_and_longer_is_hard() -> None:
    short = smoke.classify(c([1, 2, 3]), c([1, 2]), None)
    assert short.kind == "short" and "stopped early after 2 tokens" in short.describe()
    assert smoke.classify(c([1, 2]), c([1, 2, 3]), None).kind == "hard"


def test_log_acceptance_sums_ik_style_lines() -> None:
    log = (
        "slot 0: draft acceptance rate = 0.90000 (36 accepted / 40 generated)\n"
        "noise\nslot 0: draft acceptance rate = 1.00000 (48 accepted / 48 generated)\n"
    )
    assert smoke.log_acceptance(log) == (84, 88)
    assert smoke.log_acceptance("nothing here") is None


def _strict(kind: str, accepted: int = 4) -> smoke.StrictResult:
    case = verify_report.Case("code", "sequential", kind, None if kind == "identical" else 3)
    return smoke.StrictResult("code", "draft", case, 5, accepted)


def test_report_passes_on_the_strict_comparison_not_the_quantized_one() -> None:
    quantized = smoke.PromptResult("p", c([1]), c([2], 5, 4), smoke.Verdict("hard", 0))
    report = smoke.SmokeReport("id", "draft", (), (quantized,))
    assert not report.passed  # no strict comparison ran: nothing is proven
    report = replace(report, strict=(_strict("identical"),))
    assert report.passed  # a quantized difference is information, not a failure
    assert report.to_json()["acceptance"] == 0.8
    report = replace(report, strict=(*report.strict, _strict("different")))
    assert not report.passed and report.strict_failures[0].case.kind == "different"
    with pytest.raises(FrozenInstanceError):  # built once, when the smoke is over
        report.wall_seconds = 1.0  # type: ignore[misc]


def test_strict_short_output_fails_unless_it_is_a_known_defect() -> None:
    assert not smoke.SmokeReport("id", "draft", [], strict=[_strict("short")]).passed
    assert smoke.SmokeReport("id", "draft", [], strict=[_strict("known-defect")]).passed


def test_report_needs_accepted_drafts() -> None:
    assert not smoke.SmokeReport("id", "draft", [], strict=[_strict("identical", 0)]).passed


def test_prompts_include_one_of_at_least_32_tokens() -> None:
    assert any(len(p.text.split()) >= 32 for p in smoke.SMOKE_PROMPTS)


def t(pieces: list[str]) -> Completion:
    return Completion(tuple(pieces), "".join(pieces), 10.0, None, None)


def test_text_mode_identical_and_near_tie_on_piece_boundaries() -> None:
    ref = t(["The", " cat", " sat", " down"])
    assert smoke.classify(ref, t(["The", " cat", " sat", " down"]), None).kind == "identical"
    spec = Completion((), "The cat stood up", 10.0, 8, 8)  # speculative runs give text only
    assert smoke.divergence(ref, spec) == 2
    v = smoke.classify(ref, spec, (" sat", {" sat": -1.0, " stood": -1.1, " st": -2.0}))
    assert (v.kind, v.position) == ("near-tie", 2) and v.delta_nats == pytest.approx(0.1)
    far = smoke.classify(ref, spec, (" sat", {" sat": -0.1, " slept": -0.2}))
    assert far.kind == "hard"


def test_text_mode_shorter_output_is_short() -> None:
    ref = t(["The", " cat", " sat"])
    v = smoke.classify(ref, Completion((), "The cat", 1.0, 1, 1), None)
    assert (v.kind, v.position) == ("short", 2)


def test_log_acceptance_with_padded_counts() -> None:
    line = "draft acceptance rate = 1.00000 (   20 accepted /    20 generated)"
    assert smoke.log_acceptance(line) == (20, 20)


def test_the_f32_comparison_gates_cpu_builds_and_informs_on_gpu_backends() -> None:
    gpu = smoke.SmokeReport("id", "draft", [], strict=[_strict("different")], strict_gates=False)
    assert gpu.passed and gpu.strict_failures and gpu.to_json()["strict_gates"] is False
    cpu = smoke.SmokeReport("id", "draft", [], strict=[_strict("different")])
    assert not cpu.passed


def test_a_skipped_f32_comparison_passes_only_where_it_does_not_gate() -> None:
    quantized = smoke.PromptResult("p", c([1]), c([1], 5, 4), smoke.Verdict("identical", None))
    why = "the only device is a software one (llvmpipe)"
    sw = smoke.SmokeReport("id", "draft", [], [quantized], strict_gates=False, strict_skipped=why)
    assert sw.passed and sw.to_json()["strict_skipped"] == why
    cpu = smoke.SmokeReport("id", "draft", [], [quantized], strict_skipped=why)
    assert not cpu.passed  # on the CPU the F32 comparison is the gate: it cannot be skipped
    gpu = smoke.SmokeReport("id", "draft", [], [quantized], strict_gates=False)
    assert not gpu.passed  # neither run nor skipped with a reason


def test_device_lines_name_software_devices() -> None:
    lavapipe = "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (24105 MiB, 23146 MiB free)\n"
    nvidia = "  Vulkan1: NVIDIA GeForce RTX 4090 (24564 MiB, 23000 MiB free)\n"
    head = "Available devices:\n"
    assert software.only_software(head + lavapipe) == "llvmpipe (LLVM 15.0.6, 256 bits)"
    assert software.only_software(head + lavapipe + nvidia) is None  # a real GPU is there too
    assert software.only_software(head + nvidia) is None
    assert software.only_software(head) is None  # no devices listed: nothing to skip for
