"""The oracle tier's envelope: how far plain decoding's own tokens stray from the oracle's
choice (`calibrate`), and the verdict on one speculative output's per-token gaps against it
(`judge_gaps`: within the envelope, a near-tie, or over)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from llamaspec.proof import oracle as oracle_mod
from llamaspec.proof.verify_report import NEAR_TIE_RANK, Case, Envelope, EnvelopeFailure, Flip

# The oracle's second choice within this many nats of its first is a near-tie that plain
# decoding flips too (the runner-up at least e^-1 ≈ 37 % as likely): in the oracle tier such
# a token passes whatever its prompt's envelope. Plain decoding on the CPU build, with no
# speculation, put its own tokens up to 0.83 nats from the oracle's choice (micro-batch 4,
# reports/verify-llamacpp-cpu-2a65556682b3-embedded-oracle.md); a token of rank 3 or lower,
# or a runner-up further behind, still needs an envelope of its own prompt and mode that
# holds it. (On an H100 plain decoding reached
# 1.60 nats: proof.defects.OPEN_FINDINGS.)
NEAR_TIE_NATS = 1.0


def calibrate(
    configs: Sequence[tuple[str, str]],
    worst: Mapping[str, Mapping[str, float]],
    failures: Sequence[EnvelopeFailure] = (),
    near_tie: float = NEAR_TIE_NATS,
) -> Envelope:
    """The envelope from the plain outputs' largest gaps, `worst[config][prompt]`, for
    `configs` as (name, mode the configuration calibrates): per prompt and configuration,
    and the whole run's summary (a configuration that crashed is missing from `worst`)."""
    by_prompt: dict[str, dict[str, float]] = {}
    for name, _ in configs:
        for prompt, gap in worst.get(name, {}).items():
            by_prompt.setdefault(prompt, {})[name] = gap
    by_config = {n: round(max(worst[n].values(), default=0.0), 4) for n, _ in configs if n in worst}
    max_gap = max((g for w in worst.values() for g in w.values()), default=0.0)
    return Envelope(
        tuple(n for n, _ in configs),
        max_gap,
        by_config,
        tuple(failures),
        by_prompt,
        dict(configs),
        near_tie,
    )


def _allowed(g: oracle_mod.Gap, envelope: float, near_tie: float) -> str | None:
    """Why a token passes: within its prompt and mode's `envelope`, or a near-tie (the
    oracle's first NEAR_TIE_RANK choices within `near_tie` nats); None when it does not."""
    if g.gap <= envelope:
        return "envelope"
    if g.rank is not None and g.rank <= NEAR_TIE_RANK and g.gap <= near_tie:
        return "near-tie"
    return None


def judge_gaps(
    case: Case,
    gaps: Sequence[oracle_mod.Gap],
    envelope: float,
    near_tie: float = 0.0,
    text: Callable[[int], str] | None = None,
) -> Case:
    """The oracle tier's verdict on one output: its per-token gaps are recorded, every token
    that is not the oracle's choice among them (`flips`, with `text` for token texts), and a
    token neither within `envelope` (its prompt and mode's) nor a near-tie (the oracle's
    runner-up within `near_tie` nats; the tier passes NEAR_TIE_NATS) fails it (a different
    output whose every token passes is within)."""
    over = [g for g in gaps if _allowed(g, envelope, near_tie) is None]
    kind = case.kind
    if case.kind in ("different", "longer") and gaps:
        kind = "over-envelope" if over else "within"
    elif case.kind == "identical" and over:
        kind = "over-envelope"  # the plain reference itself drifted
    show = text or (lambda _t: "")
    flips = [
        Flip(
            g.position,
            g.token,
            show(g.token),
            g.chosen,
            show(g.chosen),
            g.gap,
            g.rank,
            _allowed(g, envelope, near_tie) or "over",
        )
        for g in gaps
        if g.flipped
    ]
    return replace(
        case,
        kind=kind,
        max_gap=oracle_mod.max_gap(gaps) if gaps else None,
        over=[oracle_mod.describe(g) for g in over][:8],
        envelope=envelope,
        flips=flips,
    )
