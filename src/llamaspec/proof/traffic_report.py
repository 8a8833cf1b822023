"""What the strict tier's traffic mode saw on one server, and how a report shows it.

A `Traffic` is one method's server at one slot count: how many requests arrived, how they
were sent (streamed, with the prompt cache, cut short by the client) and how they ended,
and `per_slot`, each slot's drafts and acceptance from the server's per-request `timings`,
so that a slot that never accepts stands out. proof.traffic builds them; the verify report
(proof.verify_report) carries them in its method rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A mode name per slot count: "traffic-4", "traffic-8".
PREFIX = "traffic-"


def mode_name(slots: int) -> str:
    return f"{PREFIX}{slots}"


@dataclass(frozen=True)
class SlotDrafts:
    """One server slot under traffic: requests that ended there, drafts and accepted."""

    slot: int
    requests: int
    drafted: int
    accepted: int

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class Traffic:
    """One method's server under traffic at `slots` slots."""

    mode: str
    slots: int
    requests: int
    completed: int  # compared token by token with sequential plain decoding
    cancelled: int  # streams the client hung up on mid-answer (not compared)
    failed: int  # requests the server answered with an error
    streamed: int
    cached: int  # sent with cache_prompt (a slot may reuse an earlier request's prompt)
    long_prompts: int  # requests whose prompt has a long preamble (mixed prompt lengths)
    span_s: float  # first arrival to last answer
    per_slot: tuple[SlotDrafts, ...] = ()

    @property
    def silent_slots(self) -> list[int]:
        """Slots that drafted and never had a draft token accepted."""
        return [s.slot for s in self.per_slot if s.drafted and not s.accepted]


def _rate(s: SlotDrafts) -> str:
    return "–" if s.rate is None else f"{s.rate:.2f}"


def lines(methods: Sequence[tuple[str, Sequence[Traffic]]]) -> list[str]:
    """The traffic section of a Markdown report: one row per method and slot count, then
    the acceptance of every slot (nothing when no method ran under traffic)."""
    rows = [(label, t) for label, ts in methods for t in ts]
    if not rows:
        return []
    out = [
        "",
        "## Traffic",
        "",
        "Requests arrive at random times (seeded) on one server per slot count, more of them "
        "than slots: prompts of mixed lengths (some with a long preamble), streamed or not, "
        "some with the prompt cache, some streams hung up on after a few tokens, so slots are "
        "reused after cancellations. Every completed output is compared token by token with "
        "sequential plain decoding of its prompt; a cancelled one is not.",
        "",
        "| method | slots | requests | completed | cancelled | errors | streamed | cached | "
        "long prompt | span s | accepted/drafted per slot |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, t in rows:
        slots = ", ".join(f"{s.slot}: {s.accepted}/{s.drafted} ({_rate(s)})" for s in t.per_slot)
        silent = f"; never accepted on {t.silent_slots}" if t.silent_slots else ""
        out.append(
            f"| {label} | {t.slots} | {t.requests} | {t.completed} | {t.cancelled} | "
            f"{t.failed} | {t.streamed} | {t.cached} | {t.long_prompts} | {t.span_s:.1f} | "
            f"{slots or '–'}{silent} |"
        )
    return out
