"""How much network llama.cpp's RPC backend bears, with and without speculation.

Two network namespaces (`netlab`), the rpc-server in one bound to its veth address, the link
capped with `tc tbf`, and a delaying relay in the client namespace adding round-trip time.
For each placement (target remote, draft remote, target split) and each round trip, a plain
and a speculative server decode the same greedy request through `bench.run`; the relay
counts the bytes and the turns (request → reply waits) of each run.

The network term of the cost model: a token costs its compute time plus one RTT per turn.
Turns per token r are counted by the relay; t0 is the least of 1/tok_s − r·RTT over the
RTTs (on a shared machine other work only slows a run). They predict tok/s = 1 / (t0 + r ·
RTT) at every point; the report gives measured ÷ expected. Speculation pays where its
predicted (and measured) tok/s beats the plain one.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llamaspec import config, procs
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import recipes
from llamaspec.perf import bench, netlab
from llamaspec.perf.workloads import Workload
from llamaspec.runtime import rpc
from llamaspec.runtime.client import base_args, running

RTTS_MS = (0.0, 0.2, 1.0, 5.0)
PORT = 50052
RELAY_PORT = 50100
PROMPT = (
    "Write a C function that reverses a singly linked list in place. Put a short comment "
    "above every step, then a main() that builds a list of five nodes, reverses it and "
    "prints the values.\n\n```c\n#include <stdio.h>\n#include <stdlib.h>\n"
)


@dataclass(frozen=True)
class Placement:
    name: str
    gpu_layers: int
    target: tuple[str, ...]  # "local" and/or "remote"
    draft: str


PLACEMENTS = (
    Placement("target remote, draft local", 99, ("remote",), "local"),
    Placement("target split, draft local", 9, ("local", "remote"), "local"),
    Placement("target local, draft remote", 0, ("local",), "remote"),
)


def _argv(artifact: Artifact, p: Placement, endpoint: str, model: Path, n_max: int) -> list[str]:
    where = {"local": "local", "remote": endpoint}
    recipe = config.Recipe.model_validate(
        {
            "name": "rpc-study",
            "pair": "embedded",
            "description": p.name,
            "spec": {
                "types": ["draft"],
                "draft_n_max": n_max,
                "draft_p_min": 0.0,
                "draft_gpu_layers": 99,
            },
            "server": {
                "gpu_layers": p.gpu_layers,
                "rpc": [endpoint],
                "placement": {"target": [where[t] for t in p.target], "draft": where[p.draft]},
            },
        }
    )
    cmd = recipes.render_for(recipe, artifact, "upstream", model, model)
    out, skip = [], 0
    for a in cmd.argv[1:]:
        if skip:
            skip -= 1
        elif a in ("--host", "--port", "-m"):
            skip = 1
        else:
            out.append(a)
    return out


def _one(
    artifact: Artifact,
    args: list[str],
    relay: netlab.Relay,
    w: Workload,
    log: Path,
    repetitions: int = 2,
) -> dict:
    with running(artifact.server, [*args, "--metrics"], log) as server:
        bench.run(server, Workload("warm", "code", (PROMPT,), 8), 1)  # load, first touch
        runs = []
        for _ in range(repetitions):  # the best of them: this machine is shared
            before = relay.counts()
            sample = bench.run(server, w, 1)
            after = relay.counts()
            runs.append((sample.tokens_per_second, sample, after, before))
    _, sample, after, before = max(runs, key=lambda r: r[0])
    delta = {k: after[k] - before[k] for k in after}
    tokens = max(sample.tokens, 1)
    return {
        "tokens": sample.tokens,
        "tok_s": round(sample.tokens_per_second, 3),
        "all_tok_s": [round(r[0], 3) for r in runs],
        "drafted": sample.drafted,
        "accepted": sample.accepted,
        "drafts": sample.drafts,
        "turns_per_token": round(delta["turns"] / tokens, 3),
        "bytes_per_token": round((delta["up_bytes"] + delta["down_bytes"]) / tokens),
        "turns_per_step": round(delta["turns"] / sample.drafts, 2) if sample.drafts else None,
    }


@dataclass(frozen=True)
class RpcHost:
    endpoint: str  # HOST:PORT on the server namespace's veth address
    version: rpc.Version  # the protocol version it answered with
    process: subprocess.Popen


@contextlib.contextmanager
def rpc_host(
    hosts: netlab.TwoHosts, artifact: Artifact, log: Path, wait: float = 30.0
) -> Iterator[RpcHost]:
    """The artifact's rpc-server in the server namespace (CPU device, bound to its veth
    address only), polled from the client namespace until it answers; stopped on the way
    out. One that exits or stays silent for `wait` seconds is one paragraph with its log."""
    endpoint = f"{hosts.server_addr}:{PORT}"
    opts = rpc.ServeOptions(host=hosts.server_addr, port=PORT, devices=("CPU",), threads=2)
    with log.open("w") as fh:
        server = procs.spawn(
            [*hosts.exec_prefix(hosts.server), *rpc.serve_argv(artifact, opts)],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + wait
        with hosts.inside():
            while True:
                try:
                    version = rpc.check_hosts(artifact, [endpoint], timeout=2)[endpoint]
                    break
                except LlamaspecError as err:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise LlamaspecError(
                            f"The rpc-server at {endpoint} did not come up ({err}); its log, "
                            f"{log}:\n{log.read_text()[-2000:]}"
                        ) from None
                    time.sleep(0.2)
        yield RpcHost(endpoint, version, server)
    finally:
        server.terminate()
        server.wait(timeout=20)


def study(
    artifact: Artifact,
    model: Path,
    logs: Path,
    console: Console,
    *,
    rtts: tuple[float, ...] = RTTS_MS,
    mbit: float | None = 1000.0,
    n_predict: int = 48,
    n_max: int = 8,
    repetitions: int = 2,
) -> dict:
    w = Workload("code", "code", (PROMPT,), n_predict)
    plain = base_args(model)
    logs.mkdir(parents=True, exist_ok=True)
    cells = []
    with netlab.two_hosts() as hosts:
        hosts.shape(mbit)
        with rpc_host(hosts, artifact, logs / "rpc-server.log") as host, hosts.inside():
            endpoint = host.endpoint
            for p in PLACEMENTS:
                for rtt in rtts:
                    local = f"127.0.0.1:{RELAY_PORT}"
                    stats = logs / "relay-stats.json"
                    with netlab.relay(local, endpoint, rtt, stats) as relay:
                        spec = _argv(artifact, p, local, model, n_max)
                        flat, _ = bench.split_spec(spec)
                        slug = f"{p.name}-{rtt}".replace(", ", "-").replace(" ", "-")
                        row = {"placement": p.name, "rtt_ms": rtt}
                        for kind, args in (("plain", flat), ("spec", spec)):
                            log = logs / f"{slug}-{kind}.log"
                            row[kind] = _one(artifact, [*plain, *args], relay, w, log, repetitions)
                            console.print(f"rpc study: {p.name}, RTT {rtt} ms, {kind}: {row[kind]}")
                        cells.append(row)
    report = {
        "artifact": artifact.id,
        "model": model.name,
        "link": f"veth between two network namespaces, tbf {mbit} Mbit/s"
        if mbit
        else "veth, uncapped",
        "delay": "delaying TCP relay (asyncio) in the client namespace; the kernel has no netem"
        if not netlab.has_netem()
        else "delaying TCP relay (asyncio); netem exists here but was not used",
        "n_predict": n_predict,
        "draft_n_max": n_max,
        "repetitions": f"best of {repetitions} per server (a shared 2-core machine)",
        "cells": cells,
    }
    fit(report)
    return report


def _terms(cells: list[dict], kind: str) -> tuple[float, float] | None:
    """(t0 s/token, turns/token) of one placement and kind. Turns are counted at the lowest
    RTT (they do not depend on it); t0 = the least of 1/tok_s − turns·RTT over every RTT:
    on a shared machine other work can only slow a run, so the fastest is the best estimate."""
    first = min(cells, key=lambda c: c["rtt_ms"])
    turns = first[kind]["turns_per_token"]
    times = [1 / c[kind]["tok_s"] - turns * c["rtt_ms"] / 1000 for c in cells if c[kind]["tok_s"]]
    return (max(min(times), 1e-6), turns) if times else None


def fit(report: dict) -> None:
    """Learn t0 and turns/token per placement and kind; predict every point from them."""
    names = dict.fromkeys(c["placement"] for c in report["cells"])
    terms = {}
    for name in names:
        cells = [c for c in report["cells"] if c["placement"] == name]
        for kind in ("plain", "spec"):
            terms[name, kind] = _terms(cells, kind)
    for cell in report["cells"]:
        for kind in ("plain", "spec"):
            t = terms[cell["placement"], kind]
            if t is None:
                continue
            m = cell[kind]
            expected = 1.0 / (t[0] + t[1] * cell["rtt_ms"] / 1000)
            m["expected_tok_s"] = round(expected, 3)
            m["measured_over_expected"] = round(m["tok_s"] / expected, 3)
        p, s = cell["plain"], cell["spec"]
        cell["speedup"] = round(s["tok_s"] / p["tok_s"], 3) if p["tok_s"] else None
        if "expected_tok_s" in s and "expected_tok_s" in p:
            cell["expected_speedup"] = round(s["expected_tok_s"] / p["expected_tok_s"], 3)
    report["terms"] = {
        f"{name}: {kind}": {"t0_ms": round(t[0] * 1000, 2), "turns_per_token": t[1]}
        for (name, kind), t in terms.items()
        if t is not None
    }
    report["crossover"] = crossover(report, terms)


def crossover(report: dict, terms: dict) -> dict[str, str]:
    """Per placement, in words: the RTT where the predicted spec and plain tok/s meet."""
    out = {}
    for name in dict.fromkeys(c["placement"] for c in report["cells"]):
        if terms.get((name, "plain")) is None or terms.get((name, "spec")) is None:
            continue
        (tp, rp), (ts, rs) = terms[name, "plain"], terms[name, "spec"]
        pays_at_0 = ts < tp
        if abs(rp - rs) < 1e-9:
            out[name] = "speculation's gain does not depend on RTT (same turns per token)"
            continue
        x_ms = (ts - tp) / (rp - rs) * 1000  # tp + rp·x = ts + rs·x
        if x_ms <= 0:
            out[name] = (
                f"speculation {'pays' if pays_at_0 else 'loses'} at every RTT "
                f"({rs:.2f} vs {rp:.2f} turns per token)"
            )
        else:
            verb = "stops paying" if pays_at_0 else "starts paying"
            out[name] = (
                f"speculation {verb} above {x_ms:.2f} ms RTT ({rs:.2f} turns per token "
                f"speculative vs {rp:.2f} plain)"
            )
    return out


def markdown(report: dict) -> str:
    lines = [
        f"# RPC latency study: {report['artifact']}",
        "",
        f"Model {report['model']} as its own draft (draft length {report['draft_n_max']}), "
        f"{report['n_predict']} greedy tokens per run. Link: {report['link']}. "
        f"Delay: {report['delay']}.",
        "",
        "| placement | RTT ms | plain tok/s | spec tok/s | speedup | plain meas÷exp | "
        "spec meas÷exp | turns/token plain | turns/token spec | turns/step spec | "
        "bytes/token plain | bytes/token spec | accepted/drafted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        p, s = c["plain"], c["spec"]
        lines.append(
            f"| {c['placement']} | {c['rtt_ms']:g} | {p['tok_s']:.1f} | {s['tok_s']:.1f} | "
            f"{c['speedup']:.2f}× | {p.get('measured_over_expected', '-')} | "
            f"{s.get('measured_over_expected', '-')} | {p['turns_per_token']} | "
            f"{s['turns_per_token']} | {s['turns_per_step']} | {p['bytes_per_token']} | "
            f"{s['bytes_per_token']} | {s['accepted']}/{s['drafted']} |"
        )
    lines += ["", "## The learned terms (t0: compute per token; turns: round trips per token)", ""]
    lines += [
        f"- {k}: t0 {v['t0_ms']} ms, {v['turns_per_token']} turns/token"
        for k, v in report.get("terms", {}).items()
    ]
    lines += ["", "## Where speculation pays", ""]
    lines += [f"- {k}: {v}" for k, v in report["crossover"].items()]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, name in enumerate(dict.fromkeys(c["placement"] for c in report["cells"])):
        cells = [c for c in report["cells"] if c["placement"] == name]
        x = [max(c["rtt_ms"], 0.05) for c in cells]
        color = f"C{i}"
        ax.plot(x, [c["plain"]["tok_s"] for c in cells], "o--", color=color, label=f"{name}: plain")
        ax.plot(
            x, [c["spec"]["tok_s"] for c in cells], "s-", color=color, label=f"{name}: speculative"
        )
    ax.set_xscale("log")
    ax.set_xlabel("round-trip time, ms (0 plotted at 0.05)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("llama.cpp RPC across two namespaces")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: dict, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(markdown(report))
    plot(report, paths[2])
    return paths


def run(
    artifact: Artifact,
    model: Path | None,
    reports: Path,
    console: Console,
    *,
    rtts: Sequence[float] = (),
    mbit: float | None = 1000.0,
    n_predict: int = 48,
    n_max: int = 8,
) -> list[Path]:
    """`rpc study`: the study at `rtts` (default RTTS_MS; 0 is always measured: the network
    term is learned there) on `model` (default: the embedded one), written under `reports`
    as rpc-latency-<artifact>.{json,md,png} with its logs beside them."""
    from llamaspec.models.embedded import embedded_model

    chosen = tuple(sorted(set(rtts or RTTS_MS)))
    if chosen[0] != 0:
        chosen = (0.0, *chosen)  # the network term is learned at RTT 0
    stem = f"rpc-latency-{artifact.id}"
    report = study(
        artifact,
        model or embedded_model(console.print),
        reports / f"{stem}-logs",
        console,
        rtts=chosen,
        mbit=mbit,
        n_predict=n_predict,
        n_max=n_max,
    )
    return write(report, reports, stem)
