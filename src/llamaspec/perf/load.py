"""`llamaspec load`: a bounded load test of a recipe's server, with faults.

The run is a row of phases on loopback, one server at a time: for each client count, the
recipe's speculative server, then its plain server (the same command without the
speculative flags), each started afresh with one slot per client (or `--slots` slots). In
a phase, that many client threads take requests from a seeded schedule (perf.load_plan) —
the built-in workloads' prompts, one sized near the slot's context (it fits) and one over
it (the server must refuse it), streamed or not, some streams hung up after a few tokens —
until the phase's requests are done or its share of `--duration` is spent. Every request has a
deadline; one refused while a killed server is down is sent again once it is back. Once a
second a sampler reads the server's resident memory (/proc/PID/status VmRSS) and its
`/metrics` (speculation counters).

Before the phases, a plain one-slot server sizes the prompts with /tokenize to the context a
slot really has (/slots; the engine rounds a small one up) and, where the
recipe's target is an F32 reference copy, answers each distinct prompt once, sequentially:
every completed output of the load is compared with that answer token by token.

Faults (`--fault`): `kill@S` SIGKILLs the server S seconds into the load phases, counts what
was lost and refused, restarts it and times it to a healthy /health; `stall` opens a stream
at the end of each mode's first phase, reads one token and stops reading, and watches the
slot (/slots) until it is free, closing the connection after a bound if it is not;
`overflow` adds a prompt whose answer cannot fit the slot's context. perf.load_report builds
and writes the report (atomically, also on an interrupt: then marked partial)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models.server_help import help_flags
from llamaspec.perf import bench
from llamaspec.perf.bench import BenchPlan
from llamaspec.perf.load_faults import Outage, Stall, body, reply_json, stall
from llamaspec.perf.load_plan import (
    CANCEL_AFTER,
    CANCELLED,
    DOWN,
    TIMEOUT,
    LoadPlan,
    LoadPrompt,
    Planned,
    Record,
    classify_reply,
    classify_transport,
    schedule,
)
from llamaspec.perf.workloads import WORKLOADS
from llamaspec.progress import bar
from llamaspec.runtime import loopback, metrics
from llamaspec.runtime.client import Server, running, server_help

SAMPLE_S = 1.0  # the sampler's period
IDLE_S = 5.0  # after a phase's last request, its server's memory is sampled this long, idle
RETRIES = 3  # times a request refused while the server was down is sent again
FILLER = (
    "Notes from the harbour log: the tide turned at {i} past the hour, two trawlers came "
    "in with ice on their rails, and the crane on the north quay was serviced again. "
)


@dataclass
class PhaseRun:
    """One phase as it went: its requests, memory samples, counters and restarts."""

    index: int
    mode: str  # "spec" or "plain"
    clients: int
    command: str
    started: float = 0.0
    ended: float = 0.0
    records: list[Record] = field(default_factory=list)
    rss: list[tuple[float, float]] = field(default_factory=list)  # (run clock, MB)
    rss_idle: list[float] = field(default_factory=list)  # MB, idle after the last request
    spec: dict[str, float] = field(default_factory=dict)  # drafts, drafted, accepted
    accept: list[tuple[float, float, float]] = field(default_factory=list)  # cumulative
    counters_available: bool = False
    servers: int = 0  # servers started for it (1 + restarts)


@dataclass
class LoadRun:
    """Everything a run gathered; perf.load_report turns it into the report."""

    recipe: str
    plan: LoadPlan
    speculative: bool
    ctx: int
    prompts: list[LoadPrompt] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    reference: dict[str, list[int]] = field(default_factory=dict)
    exact_why: str = ""
    phases: list[PhaseRun] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)
    commands: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def clock(self) -> float:
        return time.monotonic() - self.started


class Holder:
    """The phase's server, restartable: clients read `url` at each request."""

    def __init__(self, artifact: Artifact, args: list[str], log: Path, ready: float) -> None:
        self.artifact, self.args, self.log, self.ready = artifact, args, log, ready
        self.stack = ExitStack()
        self.server: Server | None = None
        self.url = ""
        self.done: dict[str, float] = {"drafts": 0.0, "drafted": 0.0, "accepted": 0.0}
        self.last: dict[str, float] = dict(self.done)
        self.available = False
        self.starts = 0
        self.healthy = threading.Event()  # set while a started server answers

    def start(self) -> None:
        self.starts += 1
        log = self.log if self.starts == 1 else self.log.with_suffix(f".{self.starts}.log")
        self.server = self.stack.enter_context(
            running(self.artifact.server, self.args, log, ready_timeout=self.ready)
        )
        self.url = self.server.url
        self.healthy.set()

    def kill(self) -> None:
        """SIGKILL the server; the counters it had reached count as done."""
        assert self.server is not None
        self.bank()
        self.healthy.clear()
        os.kill(self.server.proc.pid, signal.SIGKILL)
        self.server.proc.wait(timeout=30)
        self.stack.close()
        self.stack = ExitStack()
        self.server, self.url = None, ""

    def read_counters(self) -> None:
        counters = metrics.read(self.url, timeout=5) if self.url else None
        if counters is not None and counters.available:
            self.available = True
            self.last = {
                "drafts": counters.drafts,
                "drafted": counters.drafted,
                "accepted": counters.accepted,
            }

    def totals(self) -> dict[str, float]:
        """The counters over every server of the phase: banked ones plus the live one's."""
        return {k: self.done[k] + self.last[k] for k in self.done}

    def bank(self) -> None:
        self.read_counters()
        self.done = self.totals()
        self.last = dict.fromkeys(self.done, 0.0)

    def rss_mb(self) -> float | None:
        if self.server is None or self.server.proc.poll() is not None:
            return None
        try:
            text = Path(f"/proc/{self.server.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        return None

    def close(self) -> None:
        self.stack.close()


def one_request(
    url: str, item: Planned, rec: Record, clock: Callable[[], float], timeout: float
) -> None:
    """Send one scheduled request and fill `rec` (outcome, timings, tokens)."""
    t0 = time.monotonic()
    rec.started = clock()
    deadline = t0 + timeout
    limits = httpx.Timeout(timeout, connect=5.0)
    try:
        if not item.stream:
            r = loopback.post(url + "/completion", body(item.prompt, False), limits)
            reply = reply_json(r.text)
            rec.outcome, rec.reason = classify_reply(r.status_code, reply)
            if r.status_code == 200 and reply:
                rec.tokens = [int(t) for t in reply.get("tokens") or []]
        else:
            _stream(url, item, rec, t0, deadline, limits)
    except httpx.TimeoutException:
        rec.outcome, rec.reason = TIMEOUT, f"no answer within {timeout:g}s"
    except httpx.HTTPError as exc:
        rec.ended = clock()
        rec.outcome = ""  # set below from the outages
        rec.reason = f"{type(exc).__name__}: {exc}"[:300]
    rec.ended = clock()
    rec.n_tokens = len(rec.tokens)


def _stream(
    url: str, item: Planned, rec: Record, t0: float, deadline: float, limits: httpx.Timeout
) -> None:
    with loopback.stream("POST", url + "/completion", body(item.prompt, True), limits) as r:
        if r.status_code != 200:
            rec.outcome, rec.reason = classify_reply(r.status_code, reply_json(r.read().decode()))
            return
        last = t0
        final: dict | None = None
        for line in r.iter_lines():
            if time.monotonic() > deadline:
                rec.outcome, rec.reason = TIMEOUT, "the stream ran past its deadline"
                return
            if not line.startswith("data: "):
                continue
            chunk = reply_json(line[len("data: ") :]) or {}
            if "error" in chunk:
                rec.outcome, rec.reason = classify_reply(500, chunk)
                return
            got = [int(t) for t in chunk.get("tokens") or []]
            if got:
                now = time.monotonic()
                if rec.ttft_ms is None:
                    rec.ttft_ms = (now - t0) * 1000
                else:
                    rec.itl_ms.append((now - last) * 1000)
                last = now
                rec.tokens += got
            if chunk.get("stop"):
                final = chunk
                break
            if item.cancel and len(rec.tokens) >= CANCEL_AFTER:
                rec.outcome, rec.reason = CANCELLED, f"hung up after {len(rec.tokens)} tokens"
                return  # leaving the block closes the connection
        if final is None:
            rec.outcome, rec.reason = "error: stream ended without a last chunk", ""
            return
        rec.outcome, rec.reason = classify_reply(200, final)


# --- preparing: prompts and the sequential reference --------------------------------------


def sized_prompts(
    server: Server, ctx: int, plan: LoadPlan, left_out: list[str]
) -> list[LoadPrompt]:
    """The mix: each workload's first prompt that fits the slot's context, a prompt near the
    context (it fits), one over it, and (fault overflow) one whose answer overflows it."""
    n = plan.n_predict
    out = []
    for w in WORKLOADS.values():
        text = w.prompt("", 0)
        tokens = len(server.tokenize(text))
        if tokens + n > ctx:
            left_out.append(
                f"{w.name}: its prompt ({tokens} tokens) + {n} does not fit {ctx} per slot"
            )
            continue
        out.append(LoadPrompt(w.name, "workload", text, tokens, n))
    filler = "".join(FILLER.format(i=i) for i in range(ctx // 20 + 8))
    ids = server.tokenize(filler)
    while len(ids) < ctx + 32:
        ids += ids[1:]
    near = max(ctx - n - 4, 8)
    edges = [LoadPrompt("near-limit", "near-limit", tuple(ids[:near]), near, n)]
    over = ctx + 16
    edges.append(LoadPrompt("over-context", "over-context", tuple(ids[:over]), over, n))
    if plan.fault("overflow"):
        size = ctx - n // 2
        edges.append(LoadPrompt("overflow", "overflow", tuple(ids[:size]), size, n))
    return interleave(out, edges)


def interleave(workloads: list[LoadPrompt], edges: list[LoadPrompt]) -> list[LoadPrompt]:
    """The edge prompts early in the rotation, one after each of the first workloads (a
    short phase reaches them too): w0, e0, w1, e1, w2, e2, w3, …"""
    out: list[LoadPrompt] = []
    for i, w in enumerate(workloads):
        out.append(w)
        if i < len(edges):
            out.append(edges[i])
    return out + edges[len(workloads) :]


def reference(
    server: Server, prompts: Sequence[LoadPrompt], timeout: float
) -> dict[str, list[int]]:
    """Each prompt that should complete, answered once, sequentially, on one plain slot."""
    out = {}
    for p in prompts:
        if p.kind in ("workload", "near-limit"):
            reply = server.post("/completion", body(p, False), timeout=timeout)
            out[p.name] = [int(t) for t in reply.get("tokens") or []]
    return out


# --- the phases ---------------------------------------------------------------------------


def server_args(p: BenchPlan, plan: LoadPlan, ctx: int, slots: int, spec: bool, flags) -> list[str]:
    args = [a for a in p.plain_args]
    for flag in ("-c", "--ctx-size"):
        if flag in args:
            i = args.index(flag)
            del args[i : i + 2]
    args = bench.with_slots([*args, "-c", str(ctx)], slots)
    threads = ["-t", str(plan.threads)] if plan.threads else []
    cache = ["--cache-ram", str(plan.cache_ram)] if plan.cache_ram is not None else []
    out = [*args, *threads, *cache, *(p.spec_args if spec else ())]
    return [*out, *metrics.flag(out, flags)]


def recipe_ctx(p: BenchPlan) -> int:
    for flag in ("-c", "--ctx-size"):
        if flag in p.plain_args:
            return int(p.plain_args[p.plain_args.index(flag) + 1]) or 4096
    return 4096


class PhaseDriver:
    """Runs one phase: clients, the sampler, the kill fault; then the stall, if asked."""

    def __init__(self, run: LoadRun, ph: PhaseRun, holder: Holder, items: list[Planned]):
        self.run, self.ph, self.holder = run, ph, holder
        self.items = items
        self.next = 0
        self.in_flight = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def take(self, deadline: float) -> Planned | None:
        with self.lock:
            if self.stop.is_set() or self.next >= len(self.items) or time.monotonic() > deadline:
                return None
            item = self.items[self.next]
            self.next += 1
            self.in_flight += 1
            return item

    def client(self, deadline: float, advance: Callable[[], None]) -> None:
        """Take requests until the schedule or the phase's time is spent. A request refused
        while the server was down is recorded, and sent again (at most RETRIES times) once
        the restarted server is healthy, as a client that retries would."""
        plan = self.run.plan
        item: Planned | None = None
        tries = 0
        while True:
            if item is None:
                item, tries = self.take(deadline), 0
                if item is None:
                    return
            else:
                with self.lock:
                    if self.stop.is_set() or time.monotonic() > deadline:
                        return
                    self.in_flight += 1
            p = item.prompt
            rec = Record(self.ph.mode, self.ph.index, p.name, p.kind, item.stream, item.cancel)
            try:
                one_request(self.holder.url, item, rec, self.run.clock, plan.request_timeout)
            finally:
                with self.lock:
                    self.in_flight -= 1
            retry = False
            if not rec.outcome:
                windows = [o.window for o in self.run.outages]
                rec.outcome = classify_transport(rec.started, rec.ended, windows)
                if rec.outcome == DOWN:
                    left = max(deadline - time.monotonic(), 0.0)
                    tries += 1
                    retry = self.holder.healthy.wait(left) and tries <= RETRIES
            with self.lock:
                self.ph.records.append(rec)
            if not retry:
                advance()
                item = None

    def sampler(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            mb = self.holder.rss_mb()
            if mb is not None:
                self.ph.rss.append((round(self.run.clock(), 2), round(mb, 2)))
            self.holder.read_counters()
            if self.holder.available:
                now = self.holder.totals()
                self.ph.accept.append((round(self.run.clock(), 2), now["drafted"], now["accepted"]))

    def killer(self, kill_at: float, load_before: float, say: Callable[[str], None]) -> None:
        """SIGKILL the server when the load clock reaches `kill_at`, then restart it."""
        start = time.monotonic()
        while not self.stop.wait(0.1):
            if load_before + time.monotonic() - start < kill_at:
                continue
            with self.lock:
                in_flight = self.in_flight
            outage = Outage(self.ph.index, self.ph.mode, self.run.clock(), in_flight)
            self.run.outages.append(outage)
            say(f"load: fault: SIGKILL the {self.ph.mode} server ({in_flight} requests in flight)")
            self.holder.kill()
            try:
                self.holder.start()
                outage.healthy_at = self.run.clock()
                say(f"load: restarted; healthy after {outage.healthy_at - outage.at:.1f}s")
            except Exception as exc:  # the report says why; the phase ends
                outage.error = str(exc).splitlines()[0][:300]
                self.stop.set()
            return


def run_phase(
    artifact: Artifact,
    run: LoadRun,
    ph: PhaseRun,
    args: list[str],
    log: Path,
    budget: float,
    load_before: float,
    pb: Any,
    task: Any,
    say: Callable[[str], None],
) -> None:
    plan = run.plan
    holder = Holder(artifact, args, log, plan.ready_timeout)
    seed = plan.seed + ph.index * 1000
    items = schedule(run.prompts, plan.requests, plan.stream_share, plan.cancel_share, seed)
    driver = PhaseDriver(run, ph, holder, items)
    lock = threading.Lock()

    def advance() -> None:
        with lock:
            pb.advance(task)

    try:
        holder.start()
        ph.started = run.clock()
        deadline = time.monotonic() + budget
        threads = [
            threading.Thread(target=driver.client, args=(deadline, advance), daemon=True)
            for _ in range(ph.clients)
        ]
        side = [threading.Thread(target=driver.sampler, daemon=True)]
        kill = plan.fault("kill")
        if kill is not None and kill.at is not None and not run.outages:
            side.append(
                threading.Thread(
                    target=driver.killer, args=(kill.at, load_before, say), daemon=True
                )
            )
        for t in [*threads, *side]:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
        ph.ended = run.clock()
        driver.stop.set()
        for t in side:
            t.join()
        for _ in range(int(IDLE_S / SAMPLE_S)):  # what the server keeps once the load is gone
            time.sleep(SAMPLE_S)
            if (mb := holder.rss_mb()) is not None:
                ph.rss_idle.append(round(mb, 2))
        first_of_mode = not any(p.mode == ph.mode for p in run.phases[: run.phases.index(ph)])
        if plan.fault("stall") and first_of_mode and holder.server is not None:
            fits = [p for p in run.prompts if p.kind in ("workload", "near-limit")]
            shortest = min(fits, key=lambda p: p.tokens)
            say(f"load: fault: a {ph.mode} stream stops being read")
            budget = max(min(run.ctx - shortest.tokens - 8, 8 * plan.n_predict), plan.n_predict)
            run.stalls.append(
                stall(
                    holder.url,
                    run.clock,
                    shortest,
                    budget,
                    plan.stall_bound,
                    plan.request_timeout,
                    ph.index,
                    ph.mode,
                )
            )
        if holder.server is not None and holder.server.proc.poll() is None:
            holder.bank()
    finally:
        driver.stop.set()
        ph.ended = ph.ended or run.clock()
        ph.spec = dict(holder.done)
        ph.counters_available = holder.available
        ph.servers = holder.starts
        holder.close()


def execute(
    artifact: Artifact, p: BenchPlan, run: LoadRun, exact: str | None, logs: Path, console: Console
) -> None:
    """Size the prompts (and, with `exact` None, answer them once for the reference) on a
    plain one-slot server, then run every phase into `run`, which holds what was gathered
    even when this raises. `exact`: why outputs are not compared, or None to compare."""
    plan = run.plan
    if plan.speculative_only and not run.speculative:
        raise LlamaspecError(
            f"--speculative-only: recipe {run.recipe} has no speculation, so there is no "
            "speculative phase to run; leave the option out (the run is plain only), or pick "
            "a recipe with a spec type (`llamaspec recipe list`)."
        )
    flags = help_flags(server_help(artifact.server))
    prep = server_args(p, plan, run.ctx, 1, False, flags)
    run.commands["reference: plain, 1 slot, sequential"] = bench.shown(prep)
    console.print(
        "load: sizing prompts"
        + (" and answering each once, sequentially (the reference)" if exact is None else "")
    )
    with running(artifact.server, prep, logs / "reference.log", plan.ready_timeout) as srv:
        given = srv.slot_ctx()
        if given and given != run.ctx:
            console.print(
                f"load: the server gives a slot {given} tokens of context (asked {run.ctx}); "
                "the prompts are sized to that"
            )
            run.ctx = given
        run.prompts = sized_prompts(srv, run.ctx, plan, run.left_out)
        if exact is None:
            run.reference = reference(srv, run.prompts, plan.request_timeout)
    run.exact_why = exact or ""
    modes = ("spec", "plain") if run.speculative else ("plain",)
    if not run.speculative:
        console.print(f"load: recipe {run.recipe} has no speculation: plain phases only")
    elif plan.speculative_only:
        modes = ("spec",)
        console.print("load: --speculative-only: speculative phases only, no plain ones (a soak)")
    todo = [(c, m) for c in plan.clients for m in modes]
    spent = 0.0
    with bar(console) as pb:
        task = pb.add_task("load", total=len(todo) * plan.requests)
        for i, (clients, mode) in enumerate(todo):
            left = plan.duration - spent
            if left <= 0:
                console.print(f"load: --duration spent; {len(todo) - i} phase(s) not run")
                break
            slots = plan.slots or clients
            args = server_args(p, plan, run.ctx, slots, mode == "spec", flags)
            kind = "speculative" if mode == "spec" else "plain"
            label = f"{kind}, {clients} slot(s)"
            if slots != clients:
                label = f"{kind}, {clients} clients on {slots} slots"
            run.commands[label] = bench.shown(args)
            ph = PhaseRun(len(run.phases), mode, clients, label)
            run.phases.append(ph)
            pb.update(task, description=f"load: {mode} ×{clients}")
            log = logs / f"{mode}-np{slots}-c{clients}.log"
            run_phase(
                artifact, run, ph, args, log, left / (len(todo) - i), spent, pb, task, console.print
            )
            pb.update(task, completed=plan.requests * (i + 1))
            spent += ph.ended - ph.started
