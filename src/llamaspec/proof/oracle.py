"""The per-token oracle: how far each emitted token is from the target's own greedy choice.

For every token i of an output, a plain server (one slot, no speculation) is asked for its
top-k log-probabilities given exactly the prompt and the emitted tokens before i; the gap is
the log-probability of its own first choice minus that of the emitted token (0.0 when they
agree). It checks every token, not only the first difference, so a wrong KV state after a
rejected draft shows up even after a legitimate near-tie. Prefixes are memoized: tokens an
output shares with one already checked cost nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llamaspec.runtime.client import Prompt, Server, next_token_logprobs


@dataclass(frozen=True)
class Gap:
    """One emitted token judged by the oracle."""

    position: int
    token: int
    chosen: int
    gap: float  # nats; inf when the token is outside the oracle's top-k
    rank: int | None = None  # the token's rank among the oracle's top-k (1: its choice)

    @property
    def outside_top_k(self) -> bool:
        return math.isinf(self.gap)

    @property
    def flipped(self) -> bool:
        """The emitted token is not the oracle's choice (at a gap of 0.0 on an exact tie)."""
        return self.token != self.chosen


class Oracle:
    """Per-token gaps from a plain reference server (one slot, prompt cache on)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._prompt_ids: dict[str, list[int]] = {}
        self._memo: dict[tuple[str, tuple[int, ...]], tuple[int, dict[int, float]]] = {}
        self._texts: dict[int, str] = {}
        self.requests = 0

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        if prompt.text not in self._prompt_ids:
            self._prompt_ids[prompt.text] = self.server.tokenize(prompt.text)
        return self._prompt_ids[prompt.text]

    def top(self, prompt: Prompt, prefix: Sequence[int]) -> tuple[int, dict[int, float]]:
        """The oracle's choice after `prompt` and the emitted `prefix`, and its top-k
        log-probabilities (memoized)."""
        key = (prompt.text, tuple(prefix))
        if key not in self._memo:
            ids = self.prompt_ids(prompt)
            self._memo[key] = next_token_logprobs(self.server, [*ids, *prefix])
            self.requests += 1
        return self._memo[key]

    def gaps(self, prompt: Prompt, tokens: Sequence[int]) -> list[Gap]:
        """The gap of every token of `tokens`, generated after `prompt`."""
        out = []
        for i, tok in enumerate(tokens):
            chosen, top = self.top(prompt, tokens[:i])
            best = top.get(chosen, max(top.values(), default=0.0))
            gap = best - top[int(tok)] if int(tok) in top else math.inf
            out.append(Gap(i, int(tok), chosen, max(0.0, gap), _rank(int(tok), chosen, top)))
        return out

    def text(self, token: int) -> str:
        """One token's text, as the server detokenizes it (memoized)."""
        if token not in self._texts:
            self._texts[token] = self.server.detokenize([token])
        return self._texts[token]


def _rank(token: int, chosen: int, top: dict[int, float]) -> int | None:
    """`token`'s rank among the oracle's top-k: 1 for its choice, else 2 and up by
    log-probability (ties counted in the token's favour); None outside the top-k."""
    if token == chosen:
        return 1
    if token not in top:
        return None
    return 2 + sum(1 for t, lp in top.items() if t not in (token, chosen) and lp > top[token])


def max_gap(gaps: Sequence[Gap]) -> float:
    return max((g.gap for g in gaps), default=0.0)


def describe(g: Gap) -> str:
    where = "outside the top-10" if g.outside_top_k else f"{g.gap:.3f} nats"
    return f"token {g.position}: emitted {g.token}, oracle chose {g.chosen} ({where})"
