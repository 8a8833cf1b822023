"""The oracle tier's envelope: how far plain decoding's own tokens stray from the oracle's
choice (`calibrate`), how far one prefix's gaps move between two evaluations of it (`noise`,
the near-tie allowance), and the verdict on one speculative output's per-token gaps against
them (`judge_gaps`: within the envelope, a near-tie, or over)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from llamaspec.proof import oracle as oracle_mod
from llamaspec.proof.verify_report import Case, Envelope, EnvelopeFailure, Flip
from llamaspec.runtime.client import Prompt, Server, decode_with_top

# The first choices whose gaps the noise is measured on: the runner-up and the third, the
# tokens a flip by noise reaches (further ranks trail by more than any noise measured here).
NOISE_RANKS = 3


def noise(
    one_at_a_time: Sequence[Mapping[int, float]], batched: Sequence[Mapping[int, float]]
) -> float:
    """How far the gap of a first-choice token moves between two evaluations of the same
    prefixes: per position, the top-k log-probabilities of plain decoding (one token at a
    time) and of the oracle (the prefix evaluated in a batch); for the tokens ranked 2 to
    NOISE_RANKS by either, the largest change of their gap behind each one's first choice."""
    worst = 0.0
    for a, b in zip(one_at_a_time, batched, strict=False):
        if not a or not b:
            continue
        best_a, best_b = max(a.values()), max(b.values())
        firsts = {*sorted(a, key=lambda t: -a[t])[:NOISE_RANKS]}
        firsts |= {*sorted(b, key=lambda t: -b[t])[:NOISE_RANKS]}
        for t in firsts:
            if t in a and t in b:
                worst = max(worst, abs((best_a - a[t]) - (best_b - b[t])))
    return round(worst, 4)


def measured_noise(
    orc: oracle_mod.Oracle, server: Server, prompts: Sequence[Prompt]
) -> dict[str, float]:
    """Each prompt's near-tie allowance (`noise`): its plain output decoded one token at a
    time on `server`, against the oracle's evaluation of the same prefixes."""
    out = {}
    for p in prompts:
        tokens, tops = decode_with_top(server, p)
        out[p.name] = noise(tops, [orc.top(p, tokens[:i])[1] for i in range(len(tokens))])
    return out


def with_noise(env: Envelope, by_prompt: Mapping[str, float]) -> Envelope:
    """`env` with each prompt's measured noise as its near-tie allowance."""
    return replace(env, noise=dict(by_prompt), near_tie=max(by_prompt.values(), default=0.0))


def calibrate(
    configs: Sequence[tuple[str, str]],
    worst: Mapping[str, Mapping[str, float]],
    failures: Sequence[EnvelopeFailure] = (),
    noise_by_prompt: Mapping[str, float] | None = None,
) -> Envelope:
    """The envelope from the plain outputs' largest gaps, `worst[config][prompt]`, for
    `configs` as (name, mode the configuration calibrates): per prompt and configuration,
    and the whole run's summary (a configuration that crashed is missing from `worst`);
    `noise_by_prompt` (nats, `noise`) is each prompt's near-tie allowance (0.0: none)."""
    by_noise = dict(noise_by_prompt or {})
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
        max(by_noise.values(), default=0.0),
        by_noise,
    )


def _allowed(g: oracle_mod.Gap, envelope: float, near_tie: float) -> str | None:
    """Why a token passes: within its prompt and mode's `envelope`, or a near-tie (its gap
    within `near_tie`, its prompt's measured noise); None when it does not."""
    if g.gap <= envelope:
        return "envelope"
    if g.gap <= near_tie:
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
    token neither within `envelope` (its prompt and mode's) nor a near-tie (within
    `near_tie` nats: its prompt's measured noise) fails it (a different
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
