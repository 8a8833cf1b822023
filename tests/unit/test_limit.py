"""The speculation ceiling (`llamaspec limit`): the arithmetic, the verification step timed on
its own at both ends (all accepted, all rejected), the perfect engine of measured costs, the
rates the server is given, bench reports set against the ceiling, and the refusals."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.perf import ceiling, limit, limit_report
from llamaspec.perf.bench_report import Sample

pytestmark = pytest.mark.unit

UPSTREAM_HELP = (
    "--spec-type TYPE\n--spec-ngram-mod-n-min N\n--spec-ngram-mod-n-max N\n"
    "--spec-ngram-mod-n-match N\n--spec-synth-len L\n--spec-synth-rates P0,P1,...\n"
)
IK_HELP = "--draft-max N\n--spec-type Name [none | ngram - mod]\n--spec-ngram-size-n N\n"


# ---------------------------------------------------------------- the bound


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
@pytest.mark.parametrize("c", [0.0, 0.1, 0.5, 1.3])
def test_at_no_acceptance_the_bound_is_one_round_per_token(gamma: int, c: float) -> None:
    assert limit.bound(0.0, gamma, c) == pytest.approx(1 / (gamma * c + 1))


def test_the_bound_at_known_points() -> None:
    # a free draft: the mean length alone
    assert limit.bound(0.5, 1, 0.0) == pytest.approx(1.5)
    assert limit.bound(0.5, 3, 0.0) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert limit.bound(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    # γ = 1: (1 + α) / (c + 1)
    for a in (0.0, 0.3, 0.9):
        assert limit.bound(a, 1, 0.25) == pytest.approx((1 + a) / 1.25)
    # the formula as the issue writes it
    a, g, c = 0.7, 5, 0.05
    assert limit.bound(a, g, c) == pytest.approx((1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)))
    # α → 1: every draft accepted, γ + 1 tokens per round
    assert limit.bound(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert limit.bound(1 - 1e-9, 4, 0.1) == pytest.approx(5 / 1.4, rel=1e-6)
    # rises with α, falls with c
    assert limit.bound(0.9, 4, 0.1) > limit.bound(0.5, 4, 0.1) > limit.bound(0.5, 4, 0.3)


def test_measured_alpha_is_the_one_whose_mean_length_was_measured() -> None:
    for a in (0.0, 0.25, 0.5, 0.9, 0.95):
        for g in (1, 2, 4, 8, 2.5):
            assert limit.alpha_for_length(limit.mean_length(a, g), g) == pytest.approx(a, abs=1e-9)
    assert limit.alpha_for_length(1.0, 4) == 0.0
    assert limit.alpha_for_length(0.7, 4) == 0.0  # below one token: no acceptance
    assert limit.alpha_for_length(5.0, 4) == 1.0
    assert limit.alpha_for_length(9.0, 4) == 1.0


# ---------------------------------------------------------------- rates given to the server


def test_the_rates_are_unconditional_powers_of_alpha_exactly_gamma_and_non_increasing() -> None:
    assert limit.synth_rates(0.5, 3) == (0.5, 0.25, 0.125)
    assert limit.synth_rates(0.0, 2) == (0.0, 0.0)
    for a in limit.DEFAULT_ALPHAS:
        for g in limit.DEFAULT_LENGTHS:
            rates = limit.synth_rates(a, g)
            assert len(rates) == g
            assert all(0.0 <= r <= 1.0 for r in rates)
            assert all(x >= y for x, y in itertools.pairwise(rates))
            # the engine turns them back into conditional chances: α at every position
            cond = [r / p if p else 0.0 for r, p in zip(rates, (1.0, *rates), strict=False)]
            assert cond == pytest.approx([a] * g)
            # and its mean length is the bound's numerator
            assert 1 + sum(rates) == pytest.approx(limit.mean_length(a, g))


def test_the_server_gets_ngram_mod_drafts_of_exactly_gamma_and_the_rates() -> None:
    argv = dialects.synthetic_steps("upstream", UPSTREAM_HELP, 3, limit.synth_rates(0.9, 3))
    assert argv is not None
    assert argv[-2:] == ["--spec-synth-rates", "0.9,0.81,0.729"]
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod"
    assert argv[argv.index("--spec-ngram-mod-n-min") + 1] == "3"
    assert argv[argv.index("--spec-ngram-mod-n-max") + 1] == "3"
    # the cost model's all-accepted steps are unchanged
    assert dialects.synthetic_steps("upstream", UPSTREAM_HELP, 2)[-1] == "1,1"
    # the all-rejected step: the same drafts of exactly γ, every rate 0 (a valid probability)
    rejected = dialects.synthetic_steps("upstream", UPSTREAM_HELP, 3, limit.synth_rates(0.0, 3))
    assert rejected is not None and rejected[-2:] == ["--spec-synth-rates", "0,0,0"]
    assert rejected[:-1] == argv[:-1]
    assert "--spec-synth-len" in dialects.SPEC_FLAGS


# ---------------------------------------------------------------- fits


def test_a_round_is_priced_after_the_plain_steps_of_the_same_run() -> None:
    # 33 tokens: the first from the prompt, 10 rounds emitting 22, and 10 plain steps
    ms = 10 * 100.0 + 10 * 250.0
    assert limit.round_ms(33, ms, 10, 12, 100.0) == pytest.approx(250.0)
    assert limit.round_ms(33, ms, 0, 0, 100.0) is None
    assert limit.round_cost(250.0, 100.0, 2) == pytest.approx(0.75)
    assert limit.round_cost(250.0, 0.0, 2) is None


def test_the_summaries_of_the_steps_are_least_squares_fits() -> None:
    fixed, per_token = 6.0, 1.5
    points = [(g, fixed + per_token * g) for g in (1, 2, 4, 8)]  # step − plain, ms
    got_fixed, got_slope = ceiling.fit_overhead(points)
    assert got_fixed == pytest.approx(fixed)
    assert got_slope == pytest.approx(per_token)
    # a single length: all of the extra counts as the round's fixed cost
    assert ceiling.fit_overhead([(4, 10.0), (4, 12.0)]) == (pytest.approx(11.0), None)
    assert ceiling.fit_overhead([]) == (None, None)
    assert ceiling.fit_c([(g, 0.2) for g in (1, 2, 4, 8)]) == pytest.approx(0.2)
    assert ceiling.fit_c([]) is None


def _sample(tokens: int, ms: float, drafts: int = 0, drafted: int = 0, accepted: int = 0):
    return Sample(tokens, tokens / (ms / 1000.0), ms / 1000.0, drafted, accepted, drafts)


def _end(gamma: int, ratios: tuple[float, ...], accepted: bool, decode: float = 100.0):
    """(plain, step) samples of one end at `ratios` plain decodes: 10 rounds drafting γ
    each, all accepted (γ + 1 tokens a round) or all rejected (1 token a round)."""
    plain = [_sample(50, 50 * decode)] * (len(ratios) + 1)
    kept = gamma if accepted else 0
    tokens = 1 + 10 * (kept + 1)
    return plain, [_sample(tokens, 10 * r * decode, 10, 10 * gamma, 10 * kept) for r in ratios]


def _step(
    gamma: int,
    ratios: tuple[float, ...],
    decode: float = 100.0,
    rejected: tuple[float, ...] | None = None,
) -> limit.StepCost:
    """A step measured at `ratios` plain decodes all accepted and `rejected` (the same when
    None) all rejected."""
    acc = _end(gamma, ratios, True, decode)
    rej = _end(gamma, ratios if rejected is None else rejected, False, decode)
    step = limit.step_cost(gamma, [acc], [rej])
    assert step is not None
    return step


def test_the_step_is_timed_between_two_plain_decodes_and_nothing_is_fitted() -> None:
    step = _step(4, (2.0, 2.4, 2.2), rejected=(1.6, 1.8, 1.7))
    acc, rej = step.accepted, step.rejected
    assert acc.ratios == pytest.approx((2.0, 2.4, 2.2))
    assert acc.ratio == pytest.approx(2.2) and (acc.low, acc.high) == (2.0, 2.4)
    assert rej.ratio == pytest.approx(1.7) and (rej.low, rej.high) == (1.6, 1.8)
    assert step.c == pytest.approx((2.2 - 1) / 4)
    assert acc.spread == pytest.approx(0.4 / 2.2) and rej.spread == pytest.approx(0.2 / 1.7)
    assert step.spread == pytest.approx(0.4 / 2.2)  # the larger of the two
    # each step against the mean of the plain decodes around it: a drift between the two
    # plain samples is split, not charged to the step
    plain = [_sample(50, 50 * 100.0), _sample(50, 50 * 140.0)]
    full = [_sample(51, 10 * 240.0, 10, 40, 40)]
    assert ceiling.timed(plain, full).ratio == pytest.approx(2.0)
    # without the plain sample after it: the one before
    assert ceiling.timed(plain[:1], full).ratio == pytest.approx(2.4)
    # an all-rejected round emits one token: the run's 10 rounds are 10 of its 11 tokens
    rejected = [_sample(11, 10 * 180.0, 10, 40, 0)]
    assert ceiling.timed(plain, rejected).ratio == pytest.approx(1.5)
    # r between lengths is linear in γ + 1, with r(1) = 1 (a plain decode), at both ends
    steps = [_step(2, (1.5,), rejected=(1.3,)), _step(4, (2.0,), rejected=(1.5,))]
    assert limit.step_ratios(steps, 2) == pytest.approx((1.5, 1.3))
    assert limit.step_ratios(steps, 3) == pytest.approx((1.75, 1.4))
    assert limit.step_ratios(steps, 1) == pytest.approx((1.25, 1.15))
    low = limit.step_ratios([_step(4, (2.0, 3.0, 2.5), rejected=(1.4, 1.2, 1.3))], 4, "low")
    assert low == pytest.approx((2.0, 1.2))
    assert limit.step_ratios([], 4) is None
    # a step whose run never drafted, at either end, is no measurement
    dry = (plain, [_sample(51, 5100.0)])
    assert limit.step_cost(4, [dry], [(plain, rejected)]) is None
    assert limit.step_cost(4, [(plain, full)], [dry]) is None
    # two server processes: every repetition pooled, each process's median kept, and how
    # far apart they ran stated (the same flags started again are a source of noise)
    two = ceiling.timed_runs([_end(4, (2.0, 2.2), True), _end(4, (1.8, 1.9), True)])
    assert two is not None and two.ratios == pytest.approx((2.0, 2.2, 1.8, 1.9))
    assert two.processes == pytest.approx((2.1, 1.85)) and two.low == pytest.approx(1.8)
    assert two.process_spread == pytest.approx(0.25 / two.ratio)
    assert ceiling.timed_runs([dry]) is None


def test_the_perfect_engine_prices_each_step_of_the_run_at_the_measured_costs() -> None:
    # 40 tokens after the first: 10 rounds of 4 drafted, 20 accepted; 10 plain steps
    assert limit.perfect_speedup(40, 10, 40, 20, 2.0, 2.0, 0.0) == pytest.approx(40 / (10 + 20))
    # the draft's cost per drafted token
    assert limit.perfect_speedup(40, 10, 40, 20, 2.0, 2.0, 0.25) == pytest.approx(40 / 40)
    assert limit.perfect_speedup(0, 0, 0, 0, 2.0, 2.0, 0.0) is None
    # each round between the two ends by what it accepted: 2 of 4 → halfway, 1.5 decodes
    assert limit.perfect_speedup(40, 10, 40, 20, 2.0, 1.0, 0.0) == pytest.approx(40 / (10 + 15))
    # in all: drafts · r_rej + accepted · (r_acc − r_rej) ÷ g + plain steps + draft cost
    want = 40 / (10 * 1.2 + 20 * (2.0 - 1.2) / 4 + 10 + 0.25 * 40)
    assert limit.perfect_speedup(40, 10, 40, 20, 2.0, 1.2, 0.25) == pytest.approx(want)
    # every step drafted, both ends equal: the closed form S(α, γ, c_γ), c_γ = (r − 1) ÷ γ
    a, g, r = 0.7, 4, 2.2
    rounds = 1000
    length = limit.mean_length(a, g)
    counts = (rounds * length, rounds, rounds * g, rounds * (length - 1))
    assert limit.perfect_speedup(*counts, r, r, 0) == pytest.approx(limit.bound(a, g, (r - 1) / g))
    assert limit.perfect_bound(a, g, r, r) == pytest.approx(limit.bound(a, g, (r - 1) / g))
    # and with a cheaper rejected step: L ÷ (r_rej + (r_acc − r_rej)(L − 1) ÷ γ)
    got = limit.perfect_speedup(*counts, r, 1.4, 0)
    assert got == pytest.approx(length / (1.4 + (r - 1.4) * (length - 1) / g))
    assert got == pytest.approx(limit.perfect_bound(a, g, r, 1.4))
    assert got > limit.bound(a, g, (r - 1) / g)


def test_a_round_with_rejections_is_priced_below_the_all_accepted_step() -> None:
    r_acc, r_rej, g = 1.55, 1.25, 2
    # all accepted: the step timed so; none: the rejected step; between: linear in k
    assert limit.round_price(r_acc, r_rej, g, g) == pytest.approx(r_acc)
    assert limit.round_price(r_acc, r_rej, 0, g) == pytest.approx(r_rej)
    assert limit.round_price(r_acc, r_rej, 1, g) == pytest.approx((r_acc + r_rej) / 2)
    for k in (0, 0.5, 1, 1.9):
        assert r_rej <= limit.round_price(r_acc, r_rej, k, g) < r_acc
    # a run of rounds that rejected some: its ceiling lies above the one pricing every
    # round at the all-accepted step (the defect: rejecting rounds beat that "ceiling")
    counts = (30, 10, 20, 10)  # 30 emitted, 10 rounds of 2, 10 accepted, 10 plain steps
    priced = limit.perfect_speedup(*counts, r_acc, r_rej, 0.0)
    assert priced == pytest.approx(30 / (10 + 10 * r_rej + 10 * (r_acc - r_rej) / 2))
    assert priced > limit.perfect_speedup(*counts, r_acc, r_acc, 0.0)


def test_a_point_from_its_samples_and_its_ceiling() -> None:
    plain = [_sample(51, 5100.0), _sample(51, 5100.0)]  # 100 ms a token
    # γ = 4: a round is 200 ms; L = 2.5 tokens a round; every step drafted
    spec = [_sample(51, 20 * 200.0, drafts=20, drafted=80, accepted=30)] * 2
    p = limit.point(0.5, 4, plain, spec)
    assert p.rates == limit.synth_rates(0.5, 4)
    assert p.plain_ms_per_token == pytest.approx(100.0)
    assert p.round_ms == pytest.approx(200.0)
    assert p.c == pytest.approx(0.25)
    assert p.mean_length == pytest.approx(2.5)
    # two acceptances: per drafted token, and the block mean through the geometric formula
    assert p.alpha_per_token == pytest.approx(30 / 80)
    assert limit.mean_length(p.measured_alpha, 4) == pytest.approx(2.5, abs=1e-3)
    assert p.measured_alpha > p.alpha_per_token
    assert p.coverage == pytest.approx(1.0)
    assert p.speedup == pytest.approx((51 / 4.0) / (51 / 5.1))
    assert p.speedup_low == pytest.approx(p.speedup)
    # with plain steps in the run: they cost a plain decode, the round stays 200 ms
    mixed = limit.point(0.5, 4, plain, [_sample(65, 14 * 100.0 + 20 * 200.0, 20, 80, 30)])
    assert mixed.round_ms == pytest.approx(200.0)
    assert mixed.coverage == pytest.approx(50 / 64, abs=1e-3)
    # the step measured at 2 plain decodes (1.8 at its cheapest): the run's rounds cost the
    # same, so the point sits on its ceiling, not above it
    step = _step(4, (1.8, 2.0, 2.2))
    [at] = limit.with_ceilings([p], [step])
    assert at.ceiling == pytest.approx(50 / (20 * 2.0), abs=1e-3)
    assert at.ceiling_high == pytest.approx(50 / (20 * 1.8), abs=1e-3)
    assert at.over_ceiling == pytest.approx(p.speedup / at.ceiling, abs=1e-3)
    assert not at.above and at.note == ""
    # plain steps count at a plain decode in the ceiling too (not the rounds' rate)
    [m] = limit.with_ceilings([mixed], [step])
    assert m.ceiling == pytest.approx(64 / (14 + 20 * 2.0), abs=1e-3)
    # a step dearer than the run's rounds: the point is above beyond noise, and says why
    [over] = limit.with_ceilings([p], [_step(4, (2.6, 2.7, 2.8))])
    assert over.above and "ran cheaper than the steps timed on their own" in over.note
    assert "below the 2.60 that the cheapest timed steps price a round" in over.note
    # a plain sample that stalled makes a speedup read high, and the note says so
    stalled = limit.point(0.5, 4, [_sample(51, 5100.0), _sample(51, 12000.0)], spec)
    [why] = limit.with_ceilings([stalled], [_step(4, (2.6, 2.7, 2.8))])
    assert "plain server stalled" in why.note
    # rounds no cheaper than the step: the machine's speed moved
    slow = limit.point(0.5, 4, plain, [_sample(51, 20 * 280.0, 20, 80, 30)] * 2)
    [moved] = limit.with_ceilings([slow], [_step(4, (2.6, 2.7, 2.8))])
    assert not moved.above
    # no drafted round, or no step measured: no ceiling
    dry = limit.point(0.0, 2, plain, [_sample(51, 5100.0)])
    assert dry.round_ms is None and dry.c is None and dry.measured_alpha is None
    assert limit.with_ceilings([dry], [step]) == (dry,)
    assert limit.with_ceilings([p], []) == (p,)


def test_a_point_is_beyond_noise_only_past_the_steps_own_restarts() -> None:
    """A point runs in a server process of its own, so it is above its ceiling beyond noise
    only by more than the step's server, started again, ran from itself."""
    plain = [_sample(51, 5100.0), _sample(51, 5100.0)]  # 100 ms a token
    # 20 rounds of 4 drafted, 2.5 accepted, at 190 ms: 1.9 plain decodes a round
    p = limit.point(0.5, 4, plain, [_sample(51, 20 * 190.0, 20, 80, 50)] * 2)
    one = _step(4, (2.0, 2.0, 2.0))
    # the same step timed in two processes, 10% apart (2.0 and 2.2)
    two = replace(one, accepted=replace(one.accepted, processes=(2.0, 2.2)))
    two = replace(two, rejected=replace(two.rejected, processes=(2.0, 2.2)))
    assert two.process_spread == pytest.approx(0.1)
    assert limit.process_noise([two], 4.0) == pytest.approx(0.1)
    [alone] = limit.with_ceilings([p], [one])
    [restarted] = limit.with_ceilings([p], [two])
    # 2.0 ÷ 1.9: about 5% above the ceiling, beyond a step with no restarts, within 10%
    assert alone.above and not restarted.above
    assert restarted.over_ceiling == pytest.approx(alone.over_ceiling)


def test_alpha_zero_points_are_priced_at_the_rejected_step() -> None:
    plain = [_sample(51, 5100.0), _sample(51, 5100.0)]  # 100 ms a token
    # γ = 2, α = 0: 50 rounds, each drafting 2 and emitting only the target's token, 130 ms
    zero = limit.point(0.0, 2, plain, [_sample(51, 50 * 130.0, 50, 100, 0)] * 2)
    step = _step(2, (1.6, 1.7, 1.8), rejected=(1.25, 1.3, 1.35))
    [at] = limit.with_ceilings([zero], [step])
    # every round at r_rej (1.3; 1.25 at its cheapest), not at the all-accepted 1.7
    assert at.ceiling == pytest.approx(50 / (50 * 1.3), abs=1e-3)
    assert at.ceiling_high == pytest.approx(50 / (50 * 1.25), abs=1e-3)
    assert not at.above and at.over_ceiling == pytest.approx(zero.speedup / at.ceiling, abs=1e-3)
    # priced at the all-accepted step, the same rounds would sit above it beyond noise
    [old] = limit.with_ceilings([zero], [_step(2, (1.6, 1.7, 1.8))])
    assert old.above and old.ceiling == pytest.approx(50 / (50 * 1.7), abs=1e-3)
    # a point with rejections at γ = 2 (α 0.95: 45 of 50 rounds kept both): priced between
    high = limit.point(0.95, 2, plain, [_sample(146, 50 * 165.0, 50, 100, 95)] * 2)
    [mid] = limit.with_ceilings([high], [step])
    price = 1.3 + (1.7 - 1.3) * (95 / 50) / 2
    assert mid.ceiling == pytest.approx(145 / (50 * price), abs=1e-3)
    assert 145 / (50 * 1.7) < mid.ceiling < 145 / (50 * 1.3)


# ---------------------------------------------------------------- bench reports


def _bench(draft_cost: float | None = 0.1) -> dict:
    summary = {
        "speedup": 1.0,
        "speedup_by_repetition": [0.95, 1.0],
        "tokens": 62,
        "drafts": 10,
        "drafted": 40,
        "accepted": 20,
    }
    return {
        "recipe": "r",
        "workloads": [
            {"workload": "copy", "concurrency": 1, "summary": summary, "spec": [{}, {}]},
            {"workload": "copy", "concurrency": 4, "summary": summary},
            {"workload": "qa", "concurrency": 1, "summary": {**summary, "drafts": None}},
        ],
        "cost_model": None if draft_cost is None else {"draft_cost_ratio": draft_cost},
    }


def test_a_recipes_speedup_over_the_ceiling_at_its_counts_and_draft_cost() -> None:
    steps = [_step(4, (1.8, 2.0, 2.2))]
    rows = limit.recipe_ceilings("bench-r.json", _bench(), steps)
    assert [(r.workload, r.note == "") for r in rows] == [("copy", True), ("qa", False)]
    copy = rows[0]
    assert copy.length == pytest.approx(4.0)
    assert copy.alpha_per_token == pytest.approx(0.5)
    assert limit.mean_length(copy.acceptance, 4) == pytest.approx(3.0, abs=1e-3)
    # 62 tokens over 2 requests: 60 after each first; 10 rounds, 30 plain steps
    assert copy.step_ratio == pytest.approx(2.0)
    assert copy.ceiling == pytest.approx(60 / (30 + 10 * 2.0 + 0.1 * 40), abs=1e-3)
    assert copy.ceiling_high == pytest.approx(60 / (30 + 10 * 1.8 + 0.1 * 40), abs=1e-3)
    assert copy.ratio == pytest.approx(1.0 / copy.ceiling, abs=1e-3)
    assert copy.speedup_low == 0.95 and not copy.above
    # no steps of the bench's own: no second reading; with them, the same engine at them
    assert copy.bench_ceiling is None and copy.bench_ratio is None
    timed = _bench()
    timed["cost_model"] = {"draft_cost_ratio": 0.1, "verify_ratio": {"3": 1.5, "5": 2.5}}
    [own, _] = limit.recipe_ceilings("bench-r.json", timed, steps)
    assert own.bench_ceiling == pytest.approx(60 / (30 + 10 * 2.5 + 0.1 * 40), abs=1e-3)
    assert own.bench_ratio == pytest.approx(1.0 / own.bench_ceiling, abs=1e-3)
    # faster in every repetition than the ceiling at the cheapest step: above, and why
    fast = _bench()
    fast["workloads"][0]["summary"] = {
        **fast["workloads"][0]["summary"],
        "speedup": 1.5,
        "speedup_by_repetition": [1.4, 1.5],
    }
    [above, _] = limit.recipe_ceilings("bench-r.json", fast, steps)
    assert above.above and "beyond noise" in above.note
    assert "drafts" in rows[1].note and rows[1].ratio is None
    assert not copy.extrapolated
    # a γ past the longest step measured is marked
    [far, _] = limit.recipe_ceilings("bench-r.json", _bench(), [_step(2, (1.5,))])
    assert far.extrapolated
    # the lengths to time around each workload's mean draft length
    report = _bench()
    report["workloads"][0]["summary"] = {**report["workloads"][0]["summary"], "drafted": 45}
    assert limit.recipe_lengths([report]) == {4, 5}
    assert limit.recipe_lengths([_bench()]) == {4}


def test_a_speedup_its_bench_report_distrusts_is_marked_against_the_ceiling() -> None:
    steps = [_step(4, (2.0,))]
    loaded = {
        **_bench(),
        "reliability": {
            "reliable": False,
            "reasons": ["machine loaded"],
            "flagged": [{"workload": "copy", "concurrency": 1}],
        },
    }
    [copy, _qa] = limit.recipe_ceilings("b.json", loaded, steps)
    assert copy.unreliable and copy.ratio is not None
    [copy, _qa] = limit.recipe_ceilings("b.json", _bench(), steps)  # no verdict: trusted
    assert not copy.unreliable
    report = replace(_report(), recipes=tuple(limit.recipe_ceilings("b.json", loaded, steps)))
    md = limit_report.markdown(report.to_json())
    assert "unreliable bench |" in md


def test_a_bench_report_without_a_field_says_which() -> None:
    steps = [_step(4, (2.0,))]
    [copy, _qa] = limit.recipe_ceilings("b.json", _bench(None), steps)
    assert copy.ratio is None and "draft_cost_ratio" in copy.note
    [copy, _qa] = limit.recipe_ceilings("b.json", _bench(), [])
    assert "measured steps" in copy.note
    [empty] = limit.recipe_ceilings("b.json", {"recipe": "r", "workloads": []}, steps)
    assert "workloads" in empty.note


def test_read_bench_refuses_what_is_not_a_bench_report(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{nope")
    with pytest.raises(LlamaspecError, match="not a readable bench report"):
        limit.read_bench(bad)
    bad.write_text(json.dumps({"a": 1}))
    with pytest.raises(LlamaspecError, match="not a bench report"):
        limit.read_bench(bad)
    bad.write_text(json.dumps(_bench()))
    assert limit.read_bench(bad)["recipe"] == "r"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("alpha", [1.0, 1.5, -0.1, math.nan, math.inf])
def test_alpha_outside_zero_to_one_is_refused(alpha: float) -> None:
    with pytest.raises(LlamaspecError, match=r"outside \[0, 1\)"):
        limit.LimitPlan(alphas=(0.0, alpha))


@pytest.mark.parametrize("gamma", [0, -2])
def test_a_draft_length_below_one_is_refused(gamma: int) -> None:
    with pytest.raises(LlamaspecError, match=f"γ = {gamma} is not a whole number of 1 or more"):
        limit.LimitPlan(lengths=(4, gamma))


def test_a_draft_length_above_the_recipes_longest_is_refused_at_parse_time() -> None:
    import argparse

    from llamaspec.cli import limit as cli
    from llamaspec.config.recipes import SpecSettings

    bound = next(
        m.le for m in SpecSettings.model_fields["draft_n_max"].metadata if hasattr(m, "le")
    )
    assert cli.MAX_LENGTH == limit.MAX_LENGTH == bound
    limit.LimitPlan(lengths=(1, limit.MAX_LENGTH))  # the bound itself is taken
    with pytest.raises(LlamaspecError, match=f"γ = {limit.MAX_LENGTH + 1} is above"):
        limit.LimitPlan(lengths=(4, limit.MAX_LENGTH + 1))
    assert cli.numbers(int)(f"1,{cli.MAX_LENGTH}") == (1, cli.MAX_LENGTH)
    with pytest.raises(argparse.ArgumentTypeError, match="above 256") as err:
        cli.numbers(int)("4,99999999999999999999")
    assert "\n" not in str(err.value)


def test_empty_sweeps_and_short_samples_are_refused() -> None:
    with pytest.raises(LlamaspecError, match="at least one"):
        limit.LimitPlan(alphas=())
    with pytest.raises(LlamaspecError, match="8 or more tokens"):
        limit.LimitPlan(tokens=4)
    plan = limit.LimitPlan(alphas=(0.5, 0.0, 0.5), lengths=(4, 1))
    assert plan.configurations() == [(0.0, 1), (0.5, 1), (0.0, 4), (0.5, 4)]


def test_a_build_without_synthetic_acceptance_is_refused_naming_the_pr() -> None:
    limit.check_synthetic("upstream", UPSTREAM_HELP, "this build")  # has it
    for dialect, help_text in (
        ("ik-legacy", IK_HELP),
        ("upstream", "--spec-type TYPE\n--spec-draft-n-max N\n"),
        ("upstream-legacy", "--draft-max N\n"),
    ):
        with pytest.raises(LlamaspecError) as err:
            limit.check_synthetic(dialect, help_text, "ik-x (ik_llama.cpp 55d3c05)")
        text = str(err.value)
        assert "PR #27711" in text and "b11312" in text and "\n" not in text
        assert dialect in text


def test_sweep_refuses_an_engine_without_synthetic_acceptance_before_starting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started = []
    monkeypatch.setattr(limit, "server_help", lambda _path: IK_HELP)
    monkeypatch.setattr(limit.dialects, "dialect_for", lambda *_a, **_k: "ik-legacy")
    monkeypatch.setattr(limit, "running", lambda *a, **k: started.append(a))
    manifest = {"engine": "ik_llama.cpp", "commit": "55d3c05" + "0" * 33, "backend": "cpu"}
    art = Artifact("ik-x", tmp_path, manifest, reused=False)
    with pytest.raises(LlamaspecError, match="ik-legacy"):
        limit.sweep(art, tmp_path / "m.gguf", limit.LimitPlan(), lambda _m: None)
    assert started == []


def test_the_command_line_defaults_are_the_sweeps() -> None:
    from llamaspec.cli import limit as cli

    assert cli.numbers(float)(cli.ALPHAS) == limit.DEFAULT_ALPHAS
    assert cli.numbers(int)(cli.LENGTHS) == limit.DEFAULT_LENGTHS
    assert (cli.TOKENS, cli.REPETITIONS) == (limit.DEFAULT_TOKENS, limit.DEFAULT_REPETITIONS)


def test_gpu_acceptance_sweeps_the_ceiling_on_the_engine_that_has_it() -> None:
    from llamaspec.maint import gpu_acceptance as gpu

    request = gpu.Request(reports=Path("reports"), dist=Path("dist"))
    steps = dict(gpu.steps(request, "llama.cpp", "up-1"))
    argv = steps["llama.cpp: limit"]
    assert argv[0] == "limit" and argv[argv.index("--artifact") + 1] == "up-1"
    benches = [argv[i + 1] for i, a in enumerate(argv) if a == "--bench"]
    assert benches == [str(Path("reports") / f"bench-{r}-up-1.json") for r in gpu.RECIPES]
    names = list(steps)
    assert names.index("llama.cpp: limit") > max(
        names.index(f"llama.cpp: bench {r}") for r in gpu.RECIPES
    )
    assert not any("limit" in n for n, _ in gpu.steps(request, "ik_llama.cpp", "ik-1"))


# ---------------------------------------------------------------- the report


def _report() -> limit.LimitReport:
    plain = [_sample(51, 5100.0)]
    points = [
        limit.point(0.0, 2, plain, [_sample(51, 50 * 150.0, 50, 100, 0)]),
        limit.point(0.9, 2, plain, [_sample(51, 18 * 150.0, 18, 36, 32)]),
    ]
    steps = [_step(2, (1.4, 1.5, 1.6), rejected=(1.1, 1.2, 1.3))]
    c, fixed, per_token = limit.described(steps)
    return limit.LimitReport(
        artifact_id="llamacpp-cpu-x",
        engine="llama.cpp",
        commit="0c1e570",
        backend="cpu",
        machine={"description": "test machine"},
        date="2026-11-25",
        model="m.gguf",
        plan=limit.LimitPlan(alphas=(0.0, 0.9), lengths=(2,), repetitions=1, tokens=51),
        commands={"plain": "llama-server -m m.gguf"},
        points=limit.with_ceilings(points, steps),
        steps=tuple(steps),
        c=c,
        overhead_ms=fixed,
        per_token_ms=per_token,
        plain_ms_per_token=100.0,
        recipes=tuple(limit.recipe_ceilings("bench-r.json", _bench(), steps)),
    )


def test_the_report_is_written_as_json_markdown_and_a_plot(tmp_path: Path) -> None:
    report = _report()
    assert report.c == pytest.approx(0.25)  # a step of 1.5 plain decodes at γ = 2
    assert report.overhead_ms == pytest.approx(50.0)
    console = Console(record=True, width=220)
    stem = limit_report.write(report, tmp_path, console)
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["c"] == pytest.approx(0.25) and data["overhead_ms"] == pytest.approx(50.0)
    assert [p["alpha"] for p in data["points"]] == [0.0, 0.9]
    step = data["steps"][0]
    assert step["accepted"]["ratio"] == pytest.approx(1.5) and step["c"] == 0.25
    assert step["rejected"]["ratio"] == pytest.approx(1.2)
    assert data["noise"]["step"] == pytest.approx(0.2 / 1.2, abs=1e-3)  # the rejected end's
    # α = 0: 50 rounds of 1.5 decodes for 50 tokens, priced at the rejected step's 1.2
    assert data["points"][0]["ceiling"] == pytest.approx(1 / 1.2, abs=1e-3)
    assert data["above"] == 0
    md = stem.with_suffix(".md").read_text()
    assert "r_rej(g) + (r_acc(g) − r_rej(g)) · k ÷ g plain decodes" in md
    assert "L / (r_rej + (r_acc − r_rej)(L − 1) ÷ γ)" in md
    assert "accepts them all (γ + 1 tokens emitted)" in md and "rejects them all (1" in md
    assert "nothing is fitted" in md and "beyond noise" in md
    assert "## The verification step, timed on its own" in md
    assert "| 2 | 150.0 | 100.0 | 1.500 | 1.400–1.600 | 120.0 | 100.0 | 1.200 | 1.100–1.300 |" in md
    assert "Shipped recipes against the ceiling" in md and "missing: drafts" in md
    assert md == limit_report.markdown(data)
    out = console.export_text()
    assert "speculation ceiling" in out and "limit: wrote" in out
    pytest.importorskip("matplotlib")
    assert stem.with_suffix(".png").stat().st_size > 0


def test_a_point_above_its_ceiling_is_counted_and_explained_in_the_report() -> None:
    plain = [_sample(51, 5100.0)]
    fast = limit.point(0.9, 2, plain, [_sample(51, 18 * 120.0, 18, 36, 32)])
    report = replace(_report(), points=limit.with_ceilings([fast], [_step(2, (1.5,))]))
    data = report.to_json()
    assert data["above"] == 1
    md = limit_report.markdown(data)
    assert "1 of 1 points measured above their ceiling at the median step, 1 beyond noise" in md
    assert "**above beyond noise**" in md and "Rows above their ceiling beyond noise" in md


def test_a_missing_bench_report_is_named(tmp_path: Path) -> None:
    with pytest.raises(LlamaspecError, match="no such file"):
        limit.read_bench(tmp_path / "gone.json")


def test_a_stem_with_a_dot_keeps_its_whole_name(tmp_path: Path) -> None:
    """A sweep of `qwen2.5-coder-7b.gguf` (or a bench of a recipe named so) writes
    `…-qwen2.5-coder-7b.json`, not `…-qwen2.json`: the name's dot is not a suffix."""
    stem = limit_report.write(_report(), tmp_path, Console(record=True), "limit-x-qwen2.5-coder")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file())[:2] == [
        "limit-x-qwen2.5-coder.json",
        "limit-x-qwen2.5-coder.md",
    ]
    assert json.loads((tmp_path / "limit-x-qwen2.5-coder.json").read_text())["c"] > 0
    assert stem.name == "limit-x-qwen2.5-coder"
