"""What speculation should gain here, from costs measured on this machine.

One speculative step drafts g tokens (draft cost c each, relative to one target decode;
0 for n-gram lookups), then the target checks them in one batch of g + 1 tokens, costing
r(g + 1) target decodes, and emits the accepted tokens plus one. Steps with no draft are
plain decodes. Counting a workload's own steps, drafted and accepted tokens (the server's
`/metrics` counters), the expected speedup is

    tokens / (plain steps + Σ r(g + 1) over speculative steps + c · drafted tokens)

and measured ÷ expected says how much of that survived the rest of the server's work.
The hardware's plain-decoding limit is model bytes read per token ÷ memory bandwidth.

r(k) comes from two measurements. Prompt batches (`measure_batches`) compute logits for
their last token only, while a verification step computes them for all k positions and
samples each; on a small model with a large vocabulary that is most of the cost. Where the
build offers synthetic acceptance (`--spec-synth-rates`, benchmarking only), the verifying
step itself is timed (`measure_verify`): n-gram drafts of exactly k − 1 tokens, every one
accepted, so each drafted step verifies k tokens; r(k) is then that step ÷ a plain decode
timed on a plain server just before it.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field

import httpx

from llamaspec.errors import LlamaspecError
from llamaspec.runtime import loopback, metrics
from llamaspec.runtime.client import Server

# Batch sizes the target is timed at (k ≤ the largest asked for); others are interpolated.
BATCH_POINTS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 65)
# Verification steps timed with synthetic acceptance (a server start each).
VERIFY_POINTS = (2, 3, 5, 9, 17, 33, 65)


def batch_points(k_max: int, grid: Sequence[int] = BATCH_POINTS) -> list[int]:
    """The batch sizes to time for drafts up to k_max − 1 tokens: 1 … k_max, thinned out."""
    points = [k for k in grid if k <= k_max]
    if k_max not in points:
        points.append(k_max)
    return points


def ratio(costs: Mapping[int, float], k: float) -> float:
    """r(k) = T(k) / T(1), linear between measured batch sizes, flat-slope beyond them."""
    if 1 not in costs or costs[1] <= 0:
        raise ValueError("the batch costs need T(1)")
    ks = sorted(costs)
    ts = [costs[x] / costs[1] for x in ks]
    if k <= ks[0]:
        return ts[0]
    if k >= ks[-1]:
        if len(ks) == 1:
            return ts[0] * k / ks[0]
        slope = (ts[-1] - ts[-2]) / (ks[-1] - ks[-2])
        return ts[-1] + slope * (k - ks[-1])
    i = bisect.bisect_left(ks, k)
    lo, hi = ks[i - 1], ks[i]
    return ts[i - 1] + (ts[i] - ts[i - 1]) * (k - lo) / (hi - lo)


@dataclass
class SpecCounters:
    """The server's speculative counters (`/metrics`), or their difference over a run."""

    drafts: float = 0.0  # verification steps that had a draft
    drafted: float = 0.0
    accepted: float = 0.0
    per_pos: list[float] = field(default_factory=list)  # steps accepting ≥ i+1 tokens
    available: bool = False

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_pos), len(other.per_pos))
        mine = self.per_pos + [0.0] * (n - len(self.per_pos))
        theirs = other.per_pos + [0.0] * (n - len(other.per_pos))
        return SpecCounters(
            self.drafts - other.drafts,
            self.drafted - other.drafted,
            self.accepted - other.accepted,
            [a - b for a, b in zip(mine, theirs, strict=True)],
            self.available and other.available,
        )

    def __add__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_pos), len(other.per_pos))
        mine = self.per_pos + [0.0] * (n - len(self.per_pos))
        theirs = other.per_pos + [0.0] * (n - len(other.per_pos))
        return SpecCounters(
            self.drafts + other.drafts,
            self.drafted + other.drafted,
            self.accepted + other.accepted,
            [a + b for a, b in zip(mine, theirs, strict=True)],
            self.available or other.available,
        )


def parse_metrics(text: str) -> SpecCounters:
    """The `llamacpp:spec_decode_*` counters from a Prometheus `/metrics` page (read by
    runtime.metrics; a page in another format counts as no counters)."""
    try:
        c = metrics.spec_counters(metrics.parse(text))
    except metrics.MetricsFormatError:
        return SpecCounters()
    return SpecCounters(c.drafts, c.drafted, c.accepted, list(c.per_pos), c.available)


def counters(server: Server) -> SpecCounters:
    try:
        reply = loopback.get(server.url + "/metrics", 10)
    except httpx.HTTPError:
        return SpecCounters()
    return parse_metrics(reply.text) if reply.status_code == 200 else SpecCounters()


def acceptance_by_position(c: SpecCounters) -> list[float]:
    """P(the draft's token i is accepted) per position, over steps that had a draft."""
    return [round(n / c.drafts, 4) for n in c.per_pos] if c.drafts else []


def accepted_length_histogram(c: SpecCounters) -> list[int]:
    """How many speculative steps accepted exactly 0, 1, 2, … drafted tokens."""
    if not c.drafts or not c.per_pos:
        return []
    at_least = [c.drafts, *c.per_pos]
    hist = [at_least[j] - at_least[j + 1] for j in range(len(c.per_pos))] + [c.per_pos[-1]]
    return [max(0, round(h)) for h in hist]


def expected_speedup(
    tokens: float, c: SpecCounters, costs: Mapping[int, float], draft_cost: float
) -> float | None:
    """Speedup the measured costs predict for a run that emitted `tokens` with counters `c`."""
    if tokens <= 0 or 1 not in costs:
        return None
    if not c.drafts:
        return 1.0
    g = c.drafted / c.drafts
    plain_steps = max(tokens - c.accepted - c.drafts, 0.0)
    time_units = plain_steps + c.drafts * ratio(costs, g + 1) + draft_cost * c.drafted
    return tokens / time_units if time_units > 0 else None


# Fewer drafts than this over all of a workload's runs: too few to judge a gap by.
FEW_DRAFTS = 10


# Why a workload has no prediction when the run skipped the cost model (its counters were
# read all the same).
NO_COST_MODEL = (
    "No prediction: the cost model was skipped (--no-cost-model); the speculative counters "
    "were read all the same (drafted, accepted)."
)


def where_the_rest_goes(
    measured_over_expected: float | None,
    by_steps: bool = False,
    drafts: float | None = None,
    cost_model: bool = True,
    draft_model: bool = False,
) -> str:
    """One sentence on the gap between the measured and the predicted speedup; `by_steps`
    when verification steps were timed (else prompt batches priced them); `drafts` is how
    many drafted steps the workload's runs had; `cost_model` false when it was skipped;
    `draft_model` when a model drafts (its decode priced), not an n-gram lookup."""
    if not cost_model:
        return NO_COST_MODEL
    if measured_over_expected is None:
        return "No prediction: the server exposed no speculative counters for this run."
    if 0.9 <= measured_over_expected < 1.1:
        return "Measured and expected agree within 10%."
    if drafts is not None and 0 < drafts < FEW_DRAFTS:
        return (
            f"Only {drafts:.0f} drafted step(s) in all the runs: one draft more or fewer, or "
            "a longer one, moves the measured speed more than a prediction priced at the "
            "mean can follow."
        )
    if measured_over_expected >= 1.1:
        if by_steps:
            return (
                "Measured beats expected: the workload's drafts vary in length, and a step is "
                "priced at the mean draft length, while the cost of a step grows unevenly "
                "with its length."
            )
        return (
            "Measured beats expected: the batch costs come from prompt batches, which are "
            "timed under different thread scheduling than decode steps, and a plain decode step "
            "pays per-token sampling and bookkeeping that a batch shares."
        )
    if by_steps and draft_model:
        return (
            "The rest goes to work the timed steps and the draft's decodes leave out: the "
            "draft model reading each prompt and each accepted run into its own cache, drafts "
            "of uneven length priced at their mean, and the server's bookkeeping per round."
        )
    if by_steps:
        return (
            "The rest goes to work the timed steps leave out: finding each draft in a longer "
            "context, drafts of uneven length priced at their mean, and rejected drafts that "
            "cost the n-gram state its next match."
        )
    return (
        "The rest goes to work the model leaves out: finding or drafting each draft, "
        "sampling and checking every drafted position (a timed prompt batch computes logits "
        "for its last token only), and the server's per-step bookkeeping."
    )


@dataclass
class BatchCosts:
    """The target's time for a batch of k new tokens (prompt path), one decoded token, and
    (where measured) one verification step of k tokens."""

    batch_ms: dict[int, float]
    decode_ms: float
    prefix_tokens: int
    verify_ms: dict[int, float] = field(default_factory=dict)
    # the plain decode timed next to each verification step (ms per token)
    verify_decode_ms: dict[int, float] = field(default_factory=dict)

    def ratios(self) -> dict[int, float]:
        if 1 not in self.batch_ms:
            return {}
        return {k: round(ratio(self.batch_ms, k), 3) for k in sorted(self.batch_ms)}

    def step_costs(self) -> dict[int, float]:
        """What the prediction prices a step with: measured verification steps over a plain
        decode where there are any, else the prompt-path batches."""
        if self.verify_ms and self.decode_ms > 0:
            return {1: 1.0, **self._verify_ratios()}
        return self.batch_ms

    def verify_ratios(self) -> dict[int, float]:
        return {k: round(v, 3) for k, v in self._verify_ratios().items()}

    def _verify_ratios(self) -> dict[int, float]:
        """V(k) ÷ the plain decode timed with it (the cost phase's decode where none was)."""
        if not self.verify_ms or self.decode_ms <= 0:
            return {}
        return {
            k: v / self.verify_decode_ms.get(k, self.decode_ms)
            for k, v in sorted(self.verify_ms.items())
        }


def _post(server: Server, payload: dict) -> dict:
    return server.post("/completion", payload)


def measure_batches(
    server: Server,
    prefix_text: str,
    extra_text: str,
    k_max: int,
    repeats: int = 3,
    progress: Callable[[], None] = lambda: None,
) -> BatchCosts:
    """Time the target on prefix + k new tokens (k = 1 … k_max) with the prefix cached.

    Each measurement first sends the prefix alone (the slot's cache is cut back to it),
    then prefix + k tokens; `timings.prompt_ms` over `prompt_n` new tokens is T(k)."""
    prefix = server.post("/tokenize", {"content": prefix_text, "add_special": True}).get(
        "tokens", []
    )
    extra = server.post("/tokenize", {"content": extra_text, "add_special": False}).get(
        "tokens", []
    )
    while len(extra) < k_max:
        extra = extra + extra
    base = {"temperature": 0.0, "top_k": 1, "seed": 0, "cache_prompt": True, "stream": False}
    samples: dict[int, list[float]] = {}
    decode: list[float] = []
    for k in batch_points(k_max):
        for _ in range(repeats):
            warm = _post(server, {**base, "prompt": prefix, "n_predict": 4, "ignore_eos": True})
            t = warm.get("timings", {})
            if t.get("predicted_n"):
                decode.append(float(t["predicted_ms"]) / float(t["predicted_n"]))
            reply = _post(server, {**base, "prompt": prefix + extra[:k], "n_predict": 1})
            t = reply.get("timings", {})
            n = int(t.get("prompt_n", 0) or 0)
            if n >= 1:
                samples.setdefault(n, []).append(float(t["prompt_ms"]))
        progress()
    batch_ms = {n: statistics.median(v) for n, v in samples.items()}
    return BatchCosts(batch_ms, statistics.median(decode) if decode else 0.0, len(prefix))


def verify_step_ms(timings: Mapping, delta: SpecCounters, decode_ms: float) -> float | None:
    """One drafted step's milliseconds in a run whose drafts were all accepted.

    The first token comes from the prompt pass; of the rest, steps without a draft cost a
    plain decode each and each drafted step emitted its accepted tokens plus one."""
    n = int(timings.get("predicted_n", 0) or 0)
    ms = float(timings.get("predicted_ms", 0.0) or 0.0)
    if delta.drafts < 2 or n < 2 or ms <= 0:
        return None
    plain_steps = max(n - 1 - delta.accepted - delta.drafts, 0.0)
    return max(ms - plain_steps * decode_ms, 0.0) / delta.drafts


def measure_verify(
    start: Callable[[int], AbstractContextManager[Server]],
    prompt: str,
    decode: Callable[[], float],
    k_max: int,
    n_predict: int = 160,
    progress: Callable[[], None] = lambda: None,
) -> dict[int, tuple[float, float]]:
    """(V(k), D) for k in VERIFY_POINTS up to k_max: `start(k)` runs a server whose every
    step drafts k − 1 tokens and accepts them all; `decode()` times a plain decode (ms per
    token) on a plain server, right before each run, so that r(k) = V(k) ÷ D compares two
    times taken together (this machine's speed drifts by a fifth over minutes). Medians of
    two runs per k, each long enough for several drafted steps. A k whose server does not
    start is left out (the prediction interpolates between the others)."""
    out: dict[int, tuple[float, float]] = {}
    for k in batch_points(k_max, VERIFY_POINTS):
        if k < 2:
            continue
        with suppress(LlamaspecError):
            out.update(_verify_at(start, k, prompt, decode, n_predict))
        progress()
    return out


def _verify_at(
    start: Callable[[int], AbstractContextManager[Server]],
    k: int,
    prompt: str,
    decode: Callable[[], float],
    n_predict: int,
) -> dict[int, tuple[float, float]]:
    with start(k) as server:
        steps, decodes = [], []
        for _ in range(2):
            d = decode()
            before = counters(server)
            reply = _post(
                server,
                {
                    "prompt": prompt,
                    "n_predict": max(n_predict, 4 * k),
                    "temperature": 0.0,
                    "top_k": 1,
                    "cache_prompt": False,
                    "ignore_eos": True,
                },
            )
            step = verify_step_ms(reply.get("timings", {}), counters(server) - before, d)
            if step is not None and d > 0:
                steps.append(step)
                decodes.append(d)
    return {k: (statistics.median(steps), statistics.median(decodes))} if steps else {}


def decode_ms_per_token(server: Server, prompt: str, n_predict: int = 48) -> float:
    """One plain greedy decode's milliseconds per generated token."""
    reply = _post(
        server,
        {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "ignore_eos": True,
        },
    )
    t = reply.get("timings", {})
    return float(t.get("predicted_ms", 0.0)) / max(1.0, float(t.get("predicted_n", 0) or 0))


def memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second one copy of a large array moves (read + write), best of `repeats`."""
    try:
        import numpy as np
    except ImportError:
        return 0.0
    src = np.ones(megabytes << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def decode_limit(model_bytes: int, bandwidth: float) -> float:
    """Tokens/s if every weight is read once per token at `bandwidth` bytes/s."""
    return bandwidth / model_bytes if model_bytes > 0 else 0.0


def summary(costs: BatchCosts, draft_cost: float, bandwidth: float, model_bytes: int) -> dict:
    return {
        "batch_ms": {str(k): round(v, 3) for k, v in sorted(costs.batch_ms.items())},
        "batch_ratio": {str(k): v for k, v in costs.ratios().items()},
        "verify_ms": {str(k): round(v, 3) for k, v in sorted(costs.verify_ms.items())},
        "verify_decode_ms": {
            str(k): round(v, 3) for k, v in sorted(costs.verify_decode_ms.items())
        },
        "verify_ratio": {str(k): v for k, v in costs.verify_ratios().items()},
        "priced_by": "verification steps" if costs.verify_ms else "prompt batches",
        "decode_ms_per_token": round(costs.decode_ms, 3),
        "prefix_tokens": costs.prefix_tokens,
        "draft_cost_ratio": round(draft_cost, 4),
        # None where host bandwidth was not measured (a GPU backend: it bounds nothing there)
        "memory_bandwidth_gb_s": round(bandwidth / 1e9, 2) if bandwidth > 0 else None,
        "model_bytes": model_bytes,
        "plain_decode_limit_tps": round(decode_limit(model_bytes, bandwidth), 1)
        if bandwidth > 0
        else None,
    }
