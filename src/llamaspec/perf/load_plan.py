"""What a load run (`llamaspec load`) is asked to do, checked before anything starts, and
the arithmetic its report needs: the plan and its faults, the request schedule, outcome
classification, percentiles, the least-squares slope of the server's memory, and the
comparison of an output with the sequential reference. perf.load runs it; perf.load_report
writes it down. Nothing here starts a process or opens a connection."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llamaspec.errors import LlamaspecError

MAX_CLIENTS = 64
DEFAULT_CLIENTS = (1, 8)
DEFAULT_REQUESTS = 32  # per phase (one mode at one client count)
DEFAULT_DURATION = 300.0  # seconds for the whole run
DEFAULT_N_PREDICT = 32
DEFAULT_STREAM_SHARE = 0.5
DEFAULT_CANCEL_SHARE = 0.25
DEFAULT_REQUEST_TIMEOUT = 120.0  # every request's deadline, seconds
DEFAULT_READY_TIMEOUT = 300.0  # a server's start-up limit, seconds
DEFAULT_STALL_BOUND = 30.0  # a stalled stream is closed by the client after this long
CANCEL_AFTER = 3  # tokens a cancelling client reads before it hangs up
SEED = 0

# Outcomes: ok, truncated (the server stopped at the slot's context), cancelled (on
# purpose), and errors by reason.
OK, TRUNCATED, CANCELLED = "ok", "truncated", "cancelled"
OVER_CONTEXT = "error: over context"
KILLED = "error: server killed (in flight)"
DOWN = "error: refused while down"
TIMEOUT = "error: deadline"
CONNECTION = "error: connection"
FAULT_KINDS = ("kill", "stall", "overflow")


@dataclass(frozen=True)
class Fault:
    """One fault to inject: `kill@S` (SIGKILL the server S seconds into the load phases,
    then restart it), `stall` (a stream that stops being read, once per mode), `overflow`
    (requests whose prompt + n_predict exceed the slot's context, in the mix)."""

    kind: str
    at: float | None = None  # kill: seconds into the load phases

    def __str__(self) -> str:
        return f"{self.kind}@{self.at:g}" if self.at is not None else self.kind


def parse_fault(text: str) -> Fault:
    """`kill@SECONDS`, `stall` or `overflow` → a Fault; anything else a one-paragraph error."""
    kind, at, when = text.strip().partition("@")
    usage = (
        "Give --fault kill@SECONDS (SIGKILL the server that many seconds into the load, "
        "then restart it), --fault stall (a client stops reading a stream) or --fault "
        "overflow (prompts whose answer overflows the slot's context); repeatable."
    )
    if kind not in FAULT_KINDS:
        raise LlamaspecError(f"--fault {text!r} is not a fault llamaspec knows. {usage}")
    if kind != "kill":
        if at:
            raise LlamaspecError(f"--fault {text!r}: {kind} takes no time. {usage}")
        return Fault(kind)
    try:
        seconds = float(when)
    except ValueError:
        seconds = math.nan
    if not at or not (0 < seconds < math.inf):
        raise LlamaspecError(
            f"--fault {text!r}: kill needs a time above 0 in seconds, e.g. kill@20. {usage}"
        )
    return Fault("kill", seconds)


def check_share(value: float, what: str) -> float:
    if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
        raise LlamaspecError(
            f"{what} {value} is not a share between 0 and 1 (e.g. 0.25 for a quarter)."
        )
    return float(value)


@dataclass(frozen=True)
class LoadPlan:
    """A bounded load run: for each client count, a speculative phase and a plain phase
    (plain only for a recipe without speculation), each of at most `requests` requests and
    together within `duration` seconds."""

    clients: tuple[int, ...] = DEFAULT_CLIENTS
    requests: int = DEFAULT_REQUESTS
    duration: float = DEFAULT_DURATION
    n_predict: int = DEFAULT_N_PREDICT
    stream_share: float = DEFAULT_STREAM_SHARE
    cancel_share: float = DEFAULT_CANCEL_SHARE
    faults: tuple[Fault, ...] = ()
    exact: bool = True
    ctx: int | None = None  # context per slot; None: the recipe's
    threads: int | None = None
    slots: int | None = None  # every phase's server slots; None: one per client
    cache_ram: int | None = None  # the server's prompt-cache memory, MiB; None: its default
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    stall_bound: float = DEFAULT_STALL_BOUND
    seed: int = SEED
    speculative_only: bool = False  # no plain phases: a soak of the speculative server

    def __post_init__(self) -> None:
        if not self.clients:
            raise LlamaspecError("--clients needs at least one client count, e.g. 1,8.")
        for c in self.clients:
            if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CLIENTS:
                raise LlamaspecError(
                    f"--clients {c} is out of range: a load run takes 1 to {MAX_CLIENTS} "
                    f"clients at once (each gets a server slot); give e.g. --clients 1,8."
                )
        if not isinstance(self.requests, int) or self.requests < 1:
            raise LlamaspecError(
                f"--requests {self.requests}: a phase needs 1 or more requests (default "
                f"{DEFAULT_REQUESTS})."
            )
        for value, what in (
            (self.duration, "--duration"),
            (self.request_timeout, "--request-timeout"),
            (self.ready_timeout, "--ready-timeout"),
            (self.stall_bound, "the stall bound"),
        ):
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise LlamaspecError(
                    f"{what} {value} is not a time above 0 in seconds: the load run is bounded, "
                    "so give a finite limit (e.g. --duration 120)."
                )
        if not isinstance(self.n_predict, int) or self.n_predict < CANCEL_AFTER + 1:
            raise LlamaspecError(
                f"--n-predict {self.n_predict}: give {CANCEL_AFTER + 1} or more tokens an answer "
                f"(a cancelling client hangs up after {CANCEL_AFTER})."
            )
        if self.ctx is not None and self.ctx < 4 * self.n_predict:
            raise LlamaspecError(
                f"--ctx {self.ctx} is too small for --n-predict {self.n_predict}: the context "
                "per slot must hold a prompt and its answer; give at least 4 × n-predict."
            )
        check_share(self.stream_share, "--stream-share")
        check_share(self.cancel_share, "--cancel-share")
        if sum(f.kind == "kill" for f in self.faults) > 1:
            raise LlamaspecError("--fault kill@SECONDS may be given once per run.")

    def fault(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind), None)


def parse_clients(text: str) -> tuple[int, ...]:
    """`8` or `1,8` → client counts (range checked by LoadPlan, so the message is one)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(int(part))
        except ValueError:
            raise LlamaspecError(
                f"--clients {text!r} is not a whole number or a comma-separated list of them "
                f"(1 to {MAX_CLIENTS}), e.g. --clients 1,8."
            ) from None
    if not out:
        raise LlamaspecError(f"--clients {text!r} names no client count; give e.g. 1,8.")
    return tuple(out)


# --- prompts and the schedule ------------------------------------------------------------


@dataclass(frozen=True)
class LoadPrompt:
    """A prompt of the mix: text, or token ids (sized against the context), its kind
    (workload, near-limit, over-context, overflow) and its length in tokens."""

    name: str
    kind: str
    prompt: str | tuple[int, ...]
    tokens: int
    n_predict: int

    @property
    def expect_refusal(self) -> bool:
        return self.kind == "over-context"


@dataclass(frozen=True)
class Planned:
    """One scheduled request: which prompt, streamed or not, and whether it hangs up."""

    index: int
    prompt: LoadPrompt
    stream: bool
    cancel: bool


def schedule(
    prompts: Sequence[LoadPrompt], count: int, stream_share: float, cancel_share: float, seed: int
) -> list[Planned]:
    """`count` requests taking the prompts in turn, each streamed with probability
    `stream_share` and, streamed, cancelled with probability `cancel_share` (seeded: the same
    plan gives the same schedule)."""
    if not prompts:
        return []
    rng = random.Random(seed)
    out = []
    for i in range(count):
        stream = rng.random() < stream_share
        cancel = stream and rng.random() < cancel_share
        out.append(Planned(i, prompts[i % len(prompts)], stream, cancel))
    return out


# --- outcomes ------------------------------------------------------------------------------


def classify_reply(status: int, body: dict | None) -> tuple[str, str]:
    """(outcome, the server's reason) of a finished reply: 200 → ok, or truncated where the
    server says it stopped at the slot's context; 400 exceed_context_size → over context;
    other codes → `error: http N`."""
    body = body or {}
    if status == 200:
        if body.get("truncated"):
            reason = (
                f"truncated by the server (stop_type {body.get('stop_type')!r}, "
                f"{body.get('tokens_predicted')} tokens predicted after "
                f"{body.get('tokens_evaluated')} prompt tokens)"
            )
            return TRUNCATED, reason
        return OK, ""
    err = body.get("error") if isinstance(body.get("error"), dict) else {}
    message = str(err.get("message") or body.get("error") or "")[:300]
    if err.get("type") == "exceed_context_size_error" or "context size" in message:
        return OVER_CONTEXT, message
    return f"error: http {status}", message


def classify_transport(
    started: float, ended: float, outages: Iterable[tuple[float, float | None]]
) -> str:
    """The outcome of a request that failed in transport, from when it ran and the server's
    outages ((killed at, healthy again at or None) on the run's clock): in flight at a kill
    → server killed; started while the server was down → refused while down; else a
    connection error."""
    for down, up in outages:
        if started <= down <= ended:
            return KILLED
        if down <= started and (up is None or started < up):
            return DOWN
    return CONNECTION


def is_error(outcome: str) -> bool:
    return outcome.startswith("error")


def count(outcomes: Iterable[str]) -> dict[str, int]:
    """Outcome → requests, ok first, errors last, each group by name."""
    out: dict[str, int] = {}
    for o in outcomes:
        out[o] = out.get(o, 0) + 1
    order = {OK: 0, TRUNCATED: 1, CANCELLED: 2}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], 3), kv[0])))


# --- statistics ----------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's
    default); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def percentiles(values: Sequence[float], digits: int = 1) -> dict[str, float | int | None]:
    """{n, p50, p95, p99} of `values`."""
    out: dict[str, float | int | None] = {"n": len(values)}
    for q in (50, 95, 99):
        p = percentile(values, q)
        out[f"p{q}"] = None if p is None else round(p, digits)
    return out


def slope_per_minute(samples: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of (seconds, value) samples, per minute; None under 2 times."""
    if len({t for t, _ in samples}) < 2:
        return None
    mt = sum(t for t, _ in samples) / len(samples)
    mv = sum(v for _, v in samples) / len(samples)
    den = sum((t - mt) ** 2 for t, _ in samples)
    return sum((t - mt) * (v - mv) for t, v in samples) / den * 60.0


WARMUP_SHARE = 0.2  # the start of a phase left out of the "after warm-up" memory slope
WINDOWS = 6  # acceptance over time: a phase cut into this many equal spans of time


def slope_after_warmup(samples: Sequence[tuple[float, float]]) -> float | None:
    """`slope_per_minute` of the samples after the first WARMUP_SHARE of their time span:
    a server's memory grows as it loads and warms its caches, and a leak is the growth
    that goes on after that."""
    if not samples:
        return None
    t0, t1 = samples[0][0], samples[-1][0]
    cut = t0 + WARMUP_SHARE * (t1 - t0)
    return slope_per_minute([s for s in samples if s[0] >= cut])


def acceptance_windows(
    samples: Sequence[tuple[float, float, float]], windows: int = WINDOWS
) -> list[dict[str, float]]:
    """Acceptance over time from cumulative (seconds, drafted, accepted) samples: the span
    cut into `windows` equal parts, each with the tokens drafted and accepted in it and
    their ratio (None where nothing was drafted)."""
    if len(samples) < 2:
        return []
    t0, t1 = samples[0][0], samples[-1][0]
    edges = [t0 + (t1 - t0) * i / windows for i in range(windows + 1)]
    out: list[dict[str, float]] = []
    for lo, hi in itertools.pairwise(edges):
        inside = [s for s in samples if lo < s[0] <= hi]  # (lo, hi]: a sample counts once
        before = [s for s in samples if s[0] <= lo]
        if not inside:
            continue
        first = before[-1] if before else inside[0]
        drafted, accepted = inside[-1][1] - first[1], inside[-1][2] - first[2]
        out.append(
            {
                "from_s": round(lo, 1),
                "to_s": round(hi, 1),
                "drafted": int(drafted),
                "accepted": int(accepted),
                "rate": round(accepted / drafted, 4) if drafted > 0 else None,
            }
        )
    return out


def first_difference(got: Sequence[int], want: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (a shorter one differs where it
    ends); None when they are identical."""
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


@dataclass
class Record:
    """One request as it went: what was asked, what came back and when (the run's clock)."""

    mode: str
    phase: int
    prompt: str
    kind: str
    stream: bool
    cancel: bool
    started: float = 0.0
    ended: float = 0.0
    outcome: str = ""
    reason: str = ""
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    n_tokens: int = 0
