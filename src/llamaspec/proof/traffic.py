"""The strict tier under traffic: requests that arrive at random times on many slots.

For one method and one slot count, a fresh speculative server gets more requests than it
has slots, each at a seeded random time (`schedule`): the verify prompts and the same
prompts behind a long preamble (mixed prompt lengths), the full answer or half of it,
streamed or not, with the prompt cache or without, and some streams hung up on after a
few tokens, so slots are reused after cancellations and repeated prompts can find their
prefix cached. `serve` sends them and returns every answer with the slot that served it
and its drafts (the server's per-request `timings`); proof.verify compares each completed
answer token by token with sequential plain decoding of its prompt (`references`) and
proof.traffic_report shows the run.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models.methods import Method
from llamaspec.proof.compare import Judge, compare
from llamaspec.proof.defects import known_defect
from llamaspec.proof.traffic_report import SlotDrafts, Traffic, mode_name
from llamaspec.proof.verify_report import Case, MethodResult
from llamaspec.runtime import loopback
from llamaspec.runtime.client import (
    Completion,
    Prompt,
    Server,
    base_args,
    complete,
    request,
    running,
)

SLOT_CTX = 4096  # each slot's context, as in the other verify modes

SLOTS = (4, 8)  # slot counts of the traffic mode
PER_SLOT = 3  # requests per slot at each slot count
REQUEST_TIMEOUT = 300.0  # seconds one request may take, queueing included
PREAMBLE = (
    "Background for the task below, kept for the record: the team meets on Mondays, the "
    "build runs every night, reviews need two approvals, and the release notes list every "
    "change that a user can see. Questions go to the channel, not to people directly. "
) * 6


@dataclass(frozen=True)
class TrafficPlan:
    """How the traffic is drawn: slot counts, requests per slot, and the shares of each kind."""

    slots: tuple[int, ...] = SLOTS
    per_slot: int = PER_SLOT
    seed: int = 0
    stream_share: float = 0.5
    cancel_share: float = 0.3  # of the streamed requests
    cache_share: float = 0.5
    long_share: float = 0.3
    half_share: float = 0.3  # requests that ask for half the prompt's answer


@dataclass(frozen=True)
class Arrival:
    """One request of the schedule."""

    index: int
    prompt: int  # into the traffic prompts (the verify prompts, then their long versions)
    n_predict: int
    stream: bool
    cancel_after: int  # tokens read before hanging up; 0: read the whole answer
    cache: bool
    at: float  # seconds after the first arrival


@dataclass(frozen=True)
class Answer:
    """What one request got: its tokens, how it ended, the slot and its drafts."""

    arrival: Arrival
    tokens: tuple[int, ...]
    ended: str  # completed | cancelled | error: …
    slot: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    finished: float = 0.0  # seconds after the first arrival

    def completion(self) -> Completion:
        """The answer as the strict tier compares outputs."""
        return Completion(
            self.tokens, "", 0.0, self.drafted, self.accepted, len(self.tokens), "timings"
        )


@dataclass(frozen=True)
class References:
    """The traffic prompts, their sequential plain answers, and the pace of arrivals."""

    prompts: tuple[Prompt, ...]
    answers: tuple[Completion, ...]
    request_s: float  # mean seconds of one sequential plain answer


def long_version(p: Prompt, preamble: str = PREAMBLE) -> Prompt:
    return replace(p, name=f"{p.name}+preamble", text=preamble + p.text, messages=())


def _fitted(server: Server, p: Prompt, ctx: int | None) -> Prompt:
    """`p` behind as much of the preamble as the slot's context leaves room for (a small
    reference model's slot may hold a few hundred tokens only)."""
    if ctx is None:
        return long_version(p)
    room = ctx - len(server.tokenize(p.text)) - p.n_predict - 8
    words = PREAMBLE.split(" ")
    while words and len(server.tokenize(" ".join(words), add_special=False)) > room:
        words = words[: len(words) * 3 // 4]
    return long_version(p, " ".join(words) + " " if words else "")


def references(server: Server, prompts: Sequence[Prompt]) -> References:
    """Sequential plain answers (on the reference server) to the prompts and their long
    versions, timed: the schedule paces arrivals by them."""
    ctx = server.slot_ctx()
    every = (*prompts, *(_fitted(server, p, ctx) for p in prompts))
    t0 = time.monotonic()
    answers = tuple(complete(server, p) for p in every)
    for p, a in zip(every, answers, strict=True):
        if a.tokens and not isinstance(a.tokens[0], int):
            raise LlamaspecError(
                f"The traffic mode needs token ids, and this server answered {p.name!r} with "
                "token texts only (an engine without `return_tokens`). Run verify without "
                "--mode traffic on this build."
            )
    return References(every, answers, (time.monotonic() - t0) / len(every))


def schedule(
    n_prompts: int, slots: int, plan: TrafficPlan, request_s: float, full: Sequence[int]
) -> tuple[Arrival, ...]:
    """`plan.per_slot × slots` arrivals, seeded by the plan and the slot count: the prompts
    in turn (each one more than once when there are more requests than prompts), every
    kind of request at least once, arrivals about `request_s / slots` apart (exponential
    gaps), so the slots fill and empty while requests keep coming."""
    rnd = random.Random(plan.seed * 1000 + slots)
    n = max(plan.per_slot * slots, 4)
    order = [i % n_prompts for i in range(n)]
    rnd.shuffle(order)
    out: list[Arrival] = []
    at = 0.0
    for i, base in enumerate(order):
        long = rnd.random() < plan.long_share
        prompt = base + (n_prompts if long else 0)
        stream = rnd.random() < plan.stream_share
        cancel = rnd.randint(1, 6) if stream and rnd.random() < plan.cancel_share else 0
        n_predict = full[prompt] // 2 if rnd.random() < plan.half_share else full[prompt]
        out.append(
            Arrival(
                i, prompt, max(n_predict, 1), stream, cancel, rnd.random() < plan.cache_share, at
            )
        )
        at += rnd.expovariate(slots / max(request_s, 0.05))
    # every kind at least once: a long prompt, a cancelled stream, a cached repeat
    if not any(a.prompt >= n_prompts for a in out):
        a = out[0]
        out[0] = replace(a, prompt=a.prompt + n_prompts, n_predict=full[a.prompt + n_prompts])
    if not any(a.cancel_after for a in out):
        out[1] = replace(out[1], stream=True, cancel_after=2)
    if not any(a.cache for a in out[1:]):
        out[-1] = replace(out[-1], cache=True)
    return tuple(out)


def _send(url: str, prompt: Prompt, a: Arrival, t0: float) -> Answer:
    time.sleep(max(0.0, t0 + a.at - time.monotonic()))
    body = request(prompt, n_predict=a.n_predict, cache_prompt=a.cache)
    body["stream"] = a.stream
    tokens: list[int] = []
    try:
        with loopback.stream("POST", url + "/completion", body, REQUEST_TIMEOUT) as r:
            if r.status_code != 200:
                text = r.read().decode(errors="replace")[:300]
                return Answer(a, (), f"error: HTTP {r.status_code}: {text}")
            if not a.stream:
                reply = json.loads(r.read())
                return _final(a, [int(t) for t in reply.get("tokens") or []], reply, t0)
            slot = None
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    return Answer(a, tuple(tokens), f"error: {chunk['error']}", slot)
                tokens += [int(t) for t in chunk.get("tokens") or []]
                slot = _slot(chunk) if _slot(chunk) is not None else slot
                if chunk.get("stop"):
                    return _final(a, tokens, chunk, t0)
                if a.cancel_after and len(tokens) >= a.cancel_after:
                    return Answer(
                        a, tuple(tokens), "cancelled", slot, finished=time.monotonic() - t0
                    )
            return Answer(a, tuple(tokens), "error: the stream ended without a last chunk", slot)
    except (httpx.HTTPError, ValueError) as exc:
        return Answer(a, tuple(tokens), f"error: {type(exc).__name__}: {exc}"[:300])


def _slot(reply: dict) -> int | None:
    """The slot a reply names (a chunk sent before its slot was chosen names -1)."""
    slot = reply.get("id_slot")
    return slot if isinstance(slot, int) and slot >= 0 else None


def _final(a: Arrival, tokens: list[int], reply: dict, t0: float) -> Answer:
    timings = reply.get("timings") or {}
    return Answer(
        a,
        tuple(tokens),
        "completed",
        _slot(reply),
        timings.get("draft_n"),
        timings.get("draft_n_accepted"),
        time.monotonic() - t0,
    )


def serve(
    artifact: Artifact,
    args: Sequence[str],
    slots: int,
    refs: References,
    plan: TrafficPlan,
    log: Path,
) -> tuple[Traffic, list[Answer]]:
    """One server (`args`, already with `slots` slots) under the traffic of `plan`: what it
    saw and every answer, in arrival order."""
    n = len(refs.prompts) // 2
    full = [p.n_predict for p in refs.prompts]
    arrivals = schedule(n, slots, plan, refs.request_s, full)
    with running(artifact.server, list(args), log) as server:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(arrivals)) as pool:
            futures = [
                pool.submit(_send, server.url, refs.prompts[a.prompt], a, t0) for a in arrivals
            ]
            answers = [f.result() for f in futures]
    return summary(slots, answers, n), answers


def summary(slots: int, answers: Sequence[Answer], n_prompts: int) -> Traffic:
    """What the run saw, per slot included."""
    by_slot: dict[int, list[Answer]] = {}
    for a in answers:
        if a.slot is not None:
            by_slot.setdefault(int(a.slot), []).append(a)
    per_slot = tuple(
        SlotDrafts(
            s,
            len(got),
            sum(a.drafted or 0 for a in got),
            sum(a.accepted or 0 for a in got),
        )
        for s, got in sorted(by_slot.items())
    )
    return Traffic(
        mode_name(slots),
        slots,
        len(answers),
        sum(1 for a in answers if a.ended == "completed"),
        sum(1 for a in answers if a.ended == "cancelled"),
        sum(1 for a in answers if a.ended.startswith("error")),
        sum(1 for a in answers if a.arrival.stream),
        sum(1 for a in answers if a.arrival.cache),
        sum(1 for a in answers if a.arrival.prompt >= n_prompts),
        round(max((a.finished for a in answers), default=0.0), 2),
        per_slot,
    )


def method(
    artifact: Artifact,
    base: Sequence[str],
    target: Path,
    plan: TrafficPlan,
    result: MethodResult,
    m: Method | str,
    logs: Path,
    console: Console,
    ref: Server,
    refs: References,
    judge: Judge,
) -> MethodResult:
    """`m` under traffic at each slot count of `plan`, on servers of `base` (the verify
    server's arguments, its slots and context replaced): its completed answers compared with
    sequential plain decoding (`refs`), judged like every other output, and what each server
    saw, added to `result`."""
    if not isinstance(m, Method) or result.one_slot:
        return result
    defect = known_defect(artifact.manifest, "short-output")
    cases, seen, per_mode = list(result.cases), [], dict(result.per_mode)
    for slots in plan.slots:
        own = base_args(target, ctx=SLOT_CTX * slots, slots=slots)
        args = (*own, *base[len(own) :], *m.argv)
        log = logs / f"{m.name}-{mode_name(slots)}.log"
        console.print(f"verify: {m.name}: traffic on {slots} slots")
        t, answers = serve(artifact, args, slots, refs, plan, log)
        for a in answers:
            p = replace(refs.prompts[a.arrival.prompt], n_predict=a.arrival.n_predict)
            p = replace(p, name=f"{p.name} #{a.arrival.index}")
            if a.ended.startswith("error"):
                cases.append(Case(p.name, t.mode, "error", note=a.ended))
            elif a.ended == "completed":
                r = refs.answers[a.arrival.prompt]
                r = replace(r, tokens=r.tokens[: a.arrival.n_predict])
                s = a.completion()
                cases.append(judge(compare(p, t.mode, r, s, ref, defect), p, s))
        per_mode[t.mode] = (sum(x.drafted for x in t.per_slot), sum(x.accepted for x in t.per_slot))
        seen.append(t)
    return replace(
        result,
        cases=tuple(cases),
        per_mode=per_mode,
        drafted=sum(d for d, _ in per_mode.values()),
        accepted=sum(a for _, a in per_mode.values()),
        traffic=tuple(seen),
    )
