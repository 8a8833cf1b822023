"""Speedup benchmark: a recipe's own server command, with and without speculation.

Both servers run from the same binary at the same time and take turns, workload by
workload, so drift on a shared machine hits both alike. The plain server is the recipe's
command with its speculative flags removed. Every speculative sample is a first exposure:
its server is started afresh for it (llama-server has no request that clears a speculative
pool), so no repetition replays an answer the method has already seen. Methods that keep
state across requests (`KEEPS_STATE`) get a second, labelled figure measured on purpose:
the same workload again on the same server (warm). Before the workloads, the cost model times the
target on batches (`costmodel`), so every workload's measured speedup comes with the one
the machine's costs predict. `bench` returns a frozen `BenchReport`; perf.bench_report holds
that report model and writes it as .json, .md and .png. Speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

from llamaspec.engine import backends, toolchain
from llamaspec.engine.artifact import Artifact
from llamaspec.models import dialects
from llamaspec.models.server_help import help_flags, is_number
from llamaspec.perf import costmodel, reliability
from llamaspec.perf.bench_report import BenchReport, Cell, Sample, write
from llamaspec.perf.workloads import WORKLOADS, Workload
from llamaspec.progress import LineProgress, bar
from llamaspec.runtime.client import Server, running, server_help

# Speculative methods whose state outlives a request (the n-gram pool of ngram-mod, the
# lookup cache of ngram-cache, the key map of ngram-map-k/-k4v): a second request with the
# same prompt drafts from the first one's answer.
KEEPS_STATE = frozenset({"ngram-mod", "ngram-cache", "ngram-map-k", "ngram-map-k4v"})

# Speculative flags: every dialect's (`dialects.SPEC_FLAGS` take one value,
# `dialects.SPEC_SWITCHES` none), and any other `--spec-*` option (the n-gram size knobs
# that recipes and tune pass as server extras), with the next argument where that is a value.
_SPEC_PREFIX = "--spec-"
# The cost model's prefix and the tokens appended to it in the batch timings.
_COST_PREFIX = (
    "A short note on how tides work. The moon's gravity pulls on the oceans, and the water "
    "on the side of the earth facing the moon bulges towards it. "
)
_COST_EXTRA = (
    " Meanwhile, railway timetables in mountain valleys follow the seasons: in winter the "
    "first train leaves later, snow ploughs run ahead of it, and the stations keep their "
    "waiting rooms heated until the last connection of the evening has gone. Farmers load "
    "milk churns at dawn, and the postman rides in the front carriage with the mail."
)


def split_spec(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(argv without speculation, the speculative flags with their values).

    A known flag takes one value (`dialects.SPEC_FLAGS`) or none (`SPEC_SWITCHES`); any other
    `--spec-*` option takes the next argument unless that is an option itself (starts with
    `-` and is not a number): llama-server has no positional arguments, so an argument that
    is not an option is always the value of the one before. `--flag=value` is one argument."""
    plain: list[str] = []
    spec: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, joined, _ = arg.partition("=")
        one = joined and (name in dialects.SPEC_FLAGS or name.startswith(_SPEC_PREFIX))
        if one or arg in dialects.SPEC_SWITCHES:
            n = 1
        elif arg in dialects.SPEC_FLAGS:
            n = 2
        elif arg.startswith(_SPEC_PREFIX):
            value = argv[i + 1] if i + 1 < len(argv) else "-"
            n = 2 if not value.startswith("-") or is_number(value) else 1
        else:
            plain.append(arg)
            i += 1
            continue
        spec += list(argv[i : i + n])
        i += n
    return plain, spec


def server_args(argv: Sequence[str]) -> list[str]:
    """A rendered command's arguments without the binary, --host and --port (the runner
    sets those)."""
    out: list[str] = []
    rest = list(argv[1:])
    i = 0
    while i < len(rest):
        if rest[i] in ("--host", "--port"):
            i += 2
            continue
        out.append(rest[i])
        i += 1
    return out


def with_slots(args: Sequence[str], slots: int) -> list[str]:
    """`args` serving `slots` parallel requests (-np), with the context grown to match."""
    out = list(args)
    ctx = 4096
    for flag in ("-c", "--ctx-size"):
        if flag in out:
            i = out.index(flag)
            ctx = int(out[i + 1]) or 4096
            del out[i : i + 2]
    for flag in ("-np", "--parallel"):
        if flag in out:
            i = out.index(flag)
            del out[i : i + 2]
    return [*out, "-c", str(ctx * slots), "-np", str(slots)]


def shown(argv: Sequence[str]) -> str:
    """A command line as the report shows it: files by name only, the binary as llama-server."""
    parts = ["llama-server"]
    for a in argv:
        p = Path(a)
        parts.append(p.name if ("/" in a and p.suffix == ".gguf") or p.is_file() else a)
    return " ".join(parts)


@dataclass(frozen=True)
class BenchPlan:
    """What to bench: the server arguments with and without speculation, and its models."""

    name: str
    plain_args: tuple[str, ...]
    spec_args: tuple[str, ...]
    types: tuple[str, ...]
    target: Path
    draft: Path | None
    k_max: int  # the largest draft the cost model must price, plus one


def plan(
    name: str,
    argv: Sequence[str],
    types: Sequence[str],
    target: Path,
    draft: Path | None,
    k_max: int,
) -> BenchPlan:
    plain, spec = split_spec(server_args(argv))
    return BenchPlan(name, tuple(plain), tuple(spec), tuple(types), target, draft, k_max)


def request(prompt: str, n_predict: int) -> dict:
    """Greedy, uncached, exactly `n_predict` tokens (EOS ignored: fixed budgets)."""
    return {
        "prompt": prompt,
        "n_predict": n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": False,
        "ignore_eos": True,
        "stream": False,
        "return_tokens": True,
    }


def returned(server: Server, reply: Mapping[str, Any]) -> int:
    """Tokens a reply really holds: its token ids, or (a server without `return_tokens`, such
    as ik_llama.cpp) its text tokenized again, after the timed request."""
    ids = reply.get("tokens")
    if isinstance(ids, list) and (ids or not reply.get("content")):
        return len(ids)
    text = str(reply.get("content", ""))
    return len(server.tokenize(text, add_special=False)) if text else 0


def client(
    server: Server, w: Workload, extra: Mapping[str, Any] | None = None
) -> tuple[int, float, int, int, int]:
    """One client through every turn: (tokens the server counted, decode ms, drafted,
    accepted, tokens received). `extra`: more request fields (e.g. `speculative.n_max`)."""
    history, tokens, ms, drafted, accepted, got = "", 0, 0.0, 0, 0, 0
    for turn in range(len(w.turns)):
        prompt = w.prompt(history, turn)
        reply = server.post("/completion", {**request(prompt, w.n_predict), **(extra or {})})
        t = reply.get("timings", {})
        tokens += int(t.get("predicted_n", 0) or 0)
        ms += float(t.get("predicted_ms", 0.0) or 0.0)
        drafted += int(t.get("draft_n", 0) or 0)
        accepted += int(t.get("draft_n_accepted", 0) or 0)
        got += returned(server, reply)
        history = f"{prompt}{reply.get('content', '')}\n"
    return tokens, ms, drafted, accepted, got


def run(
    server: Server, w: Workload, concurrency: int, extra: Mapping[str, Any] | None = None
) -> Sample:
    """`concurrency` clients run workload `w` at once (each request with `extra` fields);
    counters are read around them."""
    before = costmodel.counters(server)
    t0 = time.monotonic()
    pool = ThreadPoolExecutor(concurrency)
    try:
        results = list(pool.map(lambda _i: client(server, w, extra), range(concurrency)))
    finally:
        # on an interrupt, do not wait for requests in flight: stopping the server ends them
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.monotonic() - t0
    delta = costmodel.counters(server) - before
    tps = sum(tok / (ms / 1000) for tok, ms, *_ in results if ms > 0)
    drafted = sum(r[2] for r in results)
    accepted = sum(r[3] for r in results)
    if delta.available:
        drafted, accepted = int(delta.drafted), int(delta.accepted)
    return Sample(
        sum(r[0] for r in results),
        tps,
        wall,
        drafted,
        accepted,
        int(delta.drafts),
        tuple(delta.per_pos),
        sum(r[4] for r in results),
    )


def _counters(samples: Sequence[Sample]) -> costmodel.SpecCounters:
    total = costmodel.SpecCounters(available=True)
    for s in samples:
        total = total + costmodel.SpecCounters(
            s.drafts, s.drafted, s.accepted, list(s.per_pos), True
        )
    return total


def _spread(samples: Sequence[Sample]) -> list[float]:
    tps = [s.tokens_per_second for s in samples]
    return [round(min(tps), 2), round(max(tps), 2)] if tps else [0.0, 0.0]


def summarize(
    cell: Cell,
    costs: Mapping[int, float] | None,
    draft_cost: float,
    has_counters: bool,
    by_steps: bool = False,
) -> dict:
    """Medians, spread, speedup, acceptance, and (one client at a time) the prediction;
    `costs` are prompt batches, or verification steps over a plain decode (`by_steps`);
    None where the run skipped the cost model (its counters are read all the same)."""
    plain = statistics.median(s.tokens_per_second for s in cell.plain) if cell.plain else 0.0
    spec = statistics.median(s.tokens_per_second for s in cell.spec) if cell.spec else 0.0
    c = _counters(cell.spec)
    tokens = sum(s.tokens for s in cell.spec)
    speedup = spec / plain if plain else 0.0
    expected = None
    if costs and has_counters and cell.concurrency == 1:
        expected = costmodel.expected_speedup(tokens, c, costs, draft_cost)
    ratio = speedup / expected if expected else None
    per_rep = reliability.per_repetition(
        [s.tokens_per_second for s in cell.plain], [s.tokens_per_second for s in cell.spec]
    )
    warm: dict[str, Any] = {}
    if cell.warm:
        wc = _counters(cell.warm)
        wtps = statistics.median(s.tokens_per_second for s in cell.warm)
        wexp = None
        if costs and has_counters and cell.concurrency == 1:
            wtokens = sum(s.tokens for s in cell.warm)
            wexp = costmodel.expected_speedup(wtokens, wc, costs, draft_cost)
        warm = {
            "warm_spec_tps_median": round(wtps, 2),
            "warm_spec_tps_spread": _spread(cell.warm),
            "warm_speedup": round(wtps / plain, 3) if plain else 0.0,
            "warm_speedup_by_repetition": [
                round(x, 3)
                for x in reliability.per_repetition(
                    [s.tokens_per_second for s in cell.plain],
                    [s.tokens_per_second for s in cell.warm],
                )
            ],
            "warm_acceptance": round(wc.accepted / wc.drafted, 4) if wc.drafted else 0.0,
            "warm_mean_accepted_length": round(wc.accepted / wc.drafts, 3) if wc.drafts else None,
            "warm_expected_speedup": round(wexp, 3) if wexp else None,
        }
    return {
        "plain_tps_median": round(plain, 2),
        "spec_tps_median": round(spec, 2),
        "plain_tps_spread": _spread(cell.plain),
        "spec_tps_spread": _spread(cell.spec),
        "speedup": round(speedup, 3),
        "speedup_by_repetition": [round(x, 3) for x in per_rep],
        "tokens": tokens,
        "drafts": int(c.drafts),
        "drafted": int(c.drafted),
        "accepted": int(c.accepted),
        "acceptance": round(c.accepted / c.drafted, 4) if c.drafted else 0.0,
        "mean_accepted_length": round(c.accepted / c.drafts, 3) if c.drafts else None,
        "acceptance_by_position": costmodel.acceptance_by_position(c),
        "accepted_length_histogram": costmodel.accepted_length_histogram(c),
        "expected_speedup": round(expected, 3) if expected else None,
        "measured_over_expected": round(ratio, 3) if ratio else None,
        "counters_from": "/metrics" if has_counters else "reply timings",
        "where_the_rest_goes": costmodel.where_the_rest_goes(
            ratio, by_steps, c.drafts, cost_model=costs is not None, draft_model=draft_cost > 0
        )
        if cell.concurrency == 1
        else "Several slots batch their steps together; the single-client cost model does "
        "not apply.",
        **warm,
    }


def _model_bytes(path: Path) -> int:
    """A GGUF's size, all parts of a split file together."""
    name = path.name
    if "-00001-of-" in name:
        stem = name.split("-00001-of-")[0]
        return sum(p.stat().st_size for p in path.parent.glob(f"{stem}-*-of-*.gguf"))
    return path.stat().st_size


def bench(
    artifact: Artifact,
    p: BenchPlan,
    workloads: Sequence[Workload],
    out_dir: Path,
    console: Console,
    *,
    concurrency: Sequence[int] = (1, 4),
    repetitions: int = 3,
    cost_model: bool = True,
    extra_args: Sequence[str] = ("--metrics",),
    write_report: bool = True,
    stem: str | None = None,
) -> BenchReport:
    """Run every workload `repetitions` times per concurrency, plain and speculative."""
    # beside the report, named as it is (a run with --server-arg has its own)
    logs = out_dir / f"{stem or f'bench-{p.name}-{artifact.id}'}-logs"
    has_ngram_only = all(t.startswith("ngram") for t in p.types)
    levels = sorted(set(concurrency))
    keeps_state = sorted(KEEPS_STATE & set(p.types))
    steps = len(levels) * repetitions * len(workloads) * (3 if keeps_state else 2)
    help_text = server_help(artifact.server)
    dialect = dialects.dialect_for(artifact, lambda _m: None)
    verify_steps = cost_model and dialects.synthetic_steps(dialect, help_text, 1) is not None
    cost_steps = len(costmodel.batch_points(p.k_max)) if cost_model else 0
    if verify_steps:
        cost_steps += len(costmodel.batch_points(p.k_max, costmodel.VERIFY_POINTS)) - 1
    costs: costmodel.BatchCosts | None = None
    draft_cost = 0.0
    # the samples of each (workload, concurrency): plain, first exposure, warm
    taken: dict[tuple[str, int], tuple[list[Sample], list[Sample], list[Sample]]] = {
        (w.name, c): ([], [], []) for c in levels for w in workloads
    }
    commands: dict[str, str] = {}
    has_counters = False
    flags = help_flags(help_text)
    # the load before any server starts, after every repetition, and at the end
    (load_before, before_from), load_during = reliability.sample_before(), []
    started = time.monotonic()
    with progress(console) as bar:
        task = bar.add_task("bench", total=steps + cost_steps)
        for c in levels:
            plain_args = [*with_slots(p.plain_args, c), *extra_args]
            spec_args = [*with_slots(p.plain_args, c), *p.spec_args, *extra_args]
            commands[f"plain, {c} slot(s)"] = shown(plain_args)
            commands[f"speculative, {c} slot(s)"] = shown(spec_args)
            if c == min(levels) and cost_model:
                # A full-size sliding-window cache lets the slot cut back to exactly the
                # prefix (otherwise it restarts from a checkpoint a few tokens earlier).
                swa = ["--swa-full"] if "--swa-full" in flags else []
                cost_args = [*with_slots(p.plain_args, 1), *swa]
                commands["cost model"] = shown(cost_args)
                with running(artifact.server, cost_args, logs / "cost-model.log") as cost_srv:
                    bar.update(task, description="cost model: target batch timings")
                    costs = costmodel.measure_batches(
                        cost_srv,
                        _COST_PREFIX,
                        _COST_EXTRA,
                        p.k_max,
                        progress=lambda: bar.advance(task),
                    )
                    draft_cost = _draft_cost(artifact, p, cost_srv, logs, has_ngram_only)
                    if verify_steps:
                        bar.update(task, description="cost model: verification steps")
                        base = [*cost_args, "--metrics"]
                        start = partial(_synthetic_server, artifact, base, dialect, help_text, logs)
                        timed = costmodel.measure_verify(
                            start,
                            WORKLOADS["copy"].turns[0],
                            partial(costmodel.decode_ms_per_token, cost_srv, _COST_PREFIX),
                            p.k_max,
                            progress=lambda: bar.advance(task),
                        )
                        costs = replace(
                            costs,
                            verify_ms={k: v for k, (v, _d) in timed.items()},
                            verify_decode_ms={k: d for k, (_v, d) in timed.items()},
                        )
                        synth = dialects.synthetic_steps(dialect, help_text, p.k_max - 1) or []
                        commands["cost model, verification steps of k tokens"] = shown(
                            [*base, *synth]
                        )
            with running(artifact.server, plain_args, logs / f"plain-np{c}.log") as plain_srv:
                for rep in range(repetitions):
                    for w in workloads:
                        plain, spec, warm = taken[(w.name, c)]
                        bar.update(task, description=f"{w.name} ×{c} plain ({rep + 1})")
                        plain.append(run(plain_srv, w, c))
                        bar.advance(task)
                        # a fresh speculative server: this sample is its first exposure
                        log = logs / f"spec-np{c}.log"
                        with running(artifact.server, spec_args, log) as spec_srv:
                            bar.update(task, description=f"{w.name} ×{c} spec ({rep + 1})")
                            spec.append(run(spec_srv, w, c))
                            bar.advance(task)
                            if keeps_state:
                                bar.update(task, description=f"{w.name} ×{c} warm ({rep + 1})")
                                warm.append(run(spec_srv, w, c))
                                bar.advance(task)
                            has_counters = has_counters or costmodel.counters(spec_srv).available
                    if (now := reliability.load_now()) is not None:
                        load_during.append(now)
    cells = []
    for (name, c), (plain, spec, warm) in taken.items():
        cell = Cell(name, c, tuple(plain), tuple(spec), tuple(warm))
        summary = summarize(
            cell,
            costs.step_costs() if costs else None,
            draft_cost,
            has_counters,
            by_steps=bool(costs and costs.verify_ms),
        )
        cells.append(replace(cell, summary=summary))
    # host memory bounds plain decoding only where the weights live in it: the CPU backend
    on_host = not backends.backend(artifact.manifest.get("backend")).gpu
    bandwidth = costmodel.memory_bandwidth() if cost_model and on_host else 0.0
    model_bytes = _model_bytes(p.target)
    host_load = reliability.HostLoad(
        os.cpu_count() or 1,
        reliability.server_threads(p.plain_args),
        load_before,
        tuple(load_during),
        reliability.load_now(),
        before_from,
    )
    report = BenchReport(
        recipe=p.name,
        artifact_id=artifact.id,
        engine=artifact.manifest.get("engine"),
        commit=artifact.manifest.get("commit"),
        backend=artifact.manifest.get("backend"),
        machine=toolchain.machine(),
        date=dt.date.today().isoformat(),
        types=tuple(p.types),
        spec_args=tuple(shown([a])[len("llama-server ") :] for a in p.spec_args),
        commands=commands,
        models={"target": p.target.name, "draft": p.draft.name if p.draft else None},
        repetitions=repetitions,
        concurrency=tuple(levels),
        exposure="first: the speculative server is restarted before every sample"
        + (
            f"; warm: the same workload again on that server ({', '.join(keeps_state)} keep "
            "state across requests)"
            if keeps_state
            else ""
        ),
        keeps_state=tuple(keeps_state),
        workloads=tuple(cells),
        cost_model=costmodel.summary(costs, draft_cost, bandwidth, model_bytes) if costs else None,
        wall_seconds=round(time.monotonic() - started, 1),
        host_load=host_load.to_json(),
    )
    report = replace(report, reliability=reliability.judge(report.to_json()).to_json())
    if write_report:
        write(report, out_dir, console, stem)
    return report


def _synthetic_server(
    artifact: Artifact, base: list[str], dialect: str, help_text: str, logs: Path, k: int
):
    """A server whose every step drafts k − 1 n-gram tokens and accepts them all (timing)."""
    synth = dialects.synthetic_steps(dialect, help_text, k - 1) or []
    return running(artifact.server, [*base, *synth], logs / f"cost-model-verify-{k}.log")


def _draft_cost(
    artifact: Artifact, p: BenchPlan, target_srv: Server, logs: Path, ngram_only: bool
) -> float:
    """The draft model's decode time per token ÷ the target's (0 without a draft model)."""
    if ngram_only or p.draft is None:
        return 0.0
    if p.draft.resolve() == p.target.resolve():
        return 1.0
    prompt = _COST_PREFIX
    target_ms = costmodel.decode_ms_per_token(target_srv, prompt)
    with running(artifact.server, ["-m", str(p.draft), "-c", "2048"], logs / "draft.log") as d:
        draft_ms = costmodel.decode_ms_per_token(d, prompt)
    return draft_ms / target_ms if target_ms else 0.0


def progress(console: Console) -> Progress | LineProgress:
    return bar(console)
