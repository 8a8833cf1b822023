"""What `llamaspec load` saw, written down: reports/load-<recipe>-<artifact>.json (`to_json`
of the run), a Markdown page beside it and, where matplotlib is installed, a PNG (the
server's memory over time, and latency percentiles by mode). Each file is written to a
temporary name and renamed, only once the run has ended — also when it was interrupted or
failed after its first phase began: that report says `"complete": false` and why
(`stopped`); a run that fails before any phase leaves no report. `run` is the command
whole: the recipe's plan, perf.load.execute, then `write`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llamaspec.engine import toolchain
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.perf import bench_plans, load
from llamaspec.perf.load import LoadRun, PhaseRun
from llamaspec.perf.load_plan import (
    CANCELLED,
    DOWN,
    KILLED,
    OK,
    OVER_CONTEXT,
    TRUNCATED,
    WARMUP_SHARE,
    LoadPlan,
    Record,
    acceptance_windows,
    count,
    first_difference,
    is_error,
    percentiles,
    slope_after_warmup,
    slope_per_minute,
)

MODE_NAMES = {"spec": "speculative", "plain": "plain"}


def _acceptance(spec: Mapping[str, float], available: bool) -> dict[str, Any] | None:
    if not available:
        return None
    drafted, accepted = spec.get("drafted", 0.0), spec.get("accepted", 0.0)
    return {
        "drafts": int(spec.get("drafts", 0)),
        "drafted": int(drafted),
        "accepted": int(accepted),
        "rate": round(accepted / drafted, 4) if drafted else 0.0,
    }


def figures(records: Sequence[Record], wall: float) -> dict[str, Any]:
    """Outcomes, latency percentiles and throughput of some requests over `wall` seconds."""
    tokens = sum(r.n_tokens for r in records)
    done = sum(r.outcome in (OK, TRUNCATED) for r in records)
    return {
        "requests": len(records),
        "outcomes": count(r.outcome for r in records),
        "ttft_ms": percentiles([r.ttft_ms for r in records if r.ttft_ms is not None]),
        "itl_ms": percentiles([x for r in records for x in r.itl_ms], 2),
        "tokens": tokens,
        "tokens_per_second": round(tokens / wall, 2) if wall > 0 else None,
        "requests_per_second": round(done / wall, 3) if wall > 0 else None,
    }


def phase_json(ph: PhaseRun) -> dict[str, Any]:
    wall = ph.ended - ph.started
    slope, warm = slope_per_minute(ph.rss), slope_after_warmup(ph.rss)
    return {
        "index": ph.index,
        "mode": ph.mode,
        "clients": ph.clients,
        "command": ph.command,
        "started_s": round(ph.started, 2),
        "wall_seconds": round(wall, 2),
        "servers_started": ph.servers,
        **figures(ph.records, wall),
        "acceptance": _acceptance(ph.spec, ph.counters_available),
        "acceptance_over_time": acceptance_windows(ph.accept),
        "rss_mb": {
            "samples": [list(s) for s in ph.rss],
            "max": max((mb for _, mb in ph.rss), default=None),
            "idle_after": ph.rss_idle[-1] if ph.rss_idle else None,  # once the load was gone
            "slope_mb_per_min": None if slope is None else round(slope, 3),
            "slope_after_warmup_mb_per_min": None if warm is None else round(warm, 3),
        },
    }


def exactness(run: LoadRun) -> dict[str, Any]:
    """Completed outputs against the sequential reference, where there is one."""
    if not run.reference:
        return {"checked": False, "why": run.exact_why or "no reference was made"}
    compared, differences = 0, []
    for ph in run.phases:
        for r in ph.records:
            if r.outcome != OK or r.prompt not in run.reference:
                continue
            compared += 1
            pos = first_difference(r.tokens, run.reference[r.prompt])
            if pos is not None:
                differences.append(
                    {"prompt": r.prompt, "mode": r.mode, "clients": ph.clients, "position": pos}
                )
    identical = compared - len(differences)
    return {
        "checked": True,
        "why": "the target is an F32 reference copy: every completed output must equal the "
        "sequential plain answer (one slot, temperature 0) to the same prompt",
        "compared": compared,
        "identical": identical,
        "share": round(identical / compared, 4) if compared else None,
        "differences": differences,
    }


def faults_json(run: LoadRun) -> dict[str, Any]:
    records = [r for ph in run.phases for r in ph.records]
    kills = []
    for o in run.outages:
        kills.append(
            {
                "phase": o.phase,
                "mode": o.mode,
                "at_s": round(o.at, 2),
                "in_flight": o.in_flight,
                "lost_in_flight": sum(r.outcome == KILLED for r in records),
                "refused_while_down": sum(r.outcome == DOWN for r in records),
                "time_to_healthy_s": None
                if o.healthy_at is None
                else round(o.healthy_at - o.at, 2),
                "restart_error": o.error or None,
            }
        )
    overflow = [
        {"mode": r.mode, "phase": r.phase, "outcome": r.outcome, "reason": r.reason}
        for r in records
        if r.kind == "overflow"
    ]
    kill = run.plan.fault("kill")
    return {
        "asked": [str(f) for f in run.plan.faults],
        "kill": kills,
        "kill_not_fired": bool(kill and not kills),
        "stall": [
            {
                **dataclasses.asdict(s),
                "slot_back_after_s": None
                if s.began is None or s.slot_free_at is None
                else round(s.slot_free_at - s.began, 2),
            }
            for s in run.stalls
        ],
        "overflow": overflow,
    }


def unexpected_error(r: Record) -> bool:
    """An error that is not the point of its request: the over-context prompt's refusal and
    requests lost to a kill (in flight, or refused while down) are expected."""
    if not is_error(r.outcome) or r.outcome in (KILLED, DOWN):
        return False
    return not (r.outcome == OVER_CONTEXT and r.kind == "over-context")


def arrangement(run: LoadRun) -> str:
    """How the phases were laid out, as the report states it."""
    slots = (
        f"{run.plan.slots} slots whatever the client count"
        if run.plan.slots
        else "one slot per client"
    )
    if run.speculative and not run.plan.speculative_only:
        phases = "for each client count a speculative phase then a plain phase"
    elif run.speculative:
        phases = "speculative phases only (--speculative-only, a soak), one per client count"
    else:
        phases = "the recipe has no speculation, so plain phases only, one per client count"
    cache = (
        f"; prompt cache bounded to {run.plan.cache_ram} MiB (--cache-ram)"
        if run.plan.cache_ram is not None
        else "; the server's own prompt-cache bound"
    )
    return (
        f"one server at a time, on 127.0.0.1: {phases}, each its own fresh server with "
        f"{slots}{cache}"
    )


def to_json(
    run: LoadRun, artifact: Artifact, stopped: str | None, wall: float | None = None
) -> dict[str, Any]:
    records = [r for ph in run.phases for r in ph.records]
    by_mode = {}
    for mode in ("spec", "plain"):
        phs = [ph for ph in run.phases if ph.mode == mode]
        if not phs:
            continue
        wall_m = sum(ph.ended - ph.started for ph in phs)
        spec = {
            k: sum(ph.spec.get(k, 0.0) for ph in phs) for k in ("drafts", "drafted", "accepted")
        }
        by_mode[mode] = {
            **figures([r for ph in phs for r in ph.records], wall_m),
            "acceptance": _acceptance(spec, any(ph.counters_available for ph in phs)),
            "rss_slope_mb_per_min": [phase_json(ph)["rss_mb"]["slope_mb_per_min"] for ph in phs],
        }
    unexpected = [
        r
        for r in records
        if is_error(r.outcome) and not (r.outcome == OVER_CONTEXT and r.kind == "over-context")
    ]
    unexpected = [r for r in unexpected if r.outcome not in (KILLED, DOWN)]
    m = artifact.manifest
    return {
        "kind": "load",
        "complete": stopped is None,
        "stopped": stopped,
        "recipe": run.recipe,
        "artifact_id": artifact.id,
        "engine": m.get("engine"),
        "commit": m.get("commit"),
        "backend": m.get("backend"),
        "machine": toolchain.machine(),
        "date": dt.date.today().isoformat(),
        "arrangement": arrangement(run),
        "speculative": run.speculative,
        "ctx_per_slot": run.ctx,
        "plan": {
            **dataclasses.asdict(run.plan),
            "clients": list(run.plan.clients),
            "faults": [str(f) for f in run.plan.faults],
        },
        "commands": dict(run.commands),
        "prompts": [
            {"name": p.name, "kind": p.kind, "tokens": p.tokens, "n_predict": p.n_predict}
            for p in run.prompts
        ],
        "left_out": list(run.left_out),
        "outcomes": count(r.outcome for r in records),
        "unexpected_errors": len(unexpected),
        "cancelled": sum(r.outcome == CANCELLED for r in records),
        "by_mode": by_mode,
        "phases": [phase_json(ph) for ph in run.phases],
        "faults": faults_json(run),
        "exactness": exactness(run),
        "wall_seconds": round(wall if wall is not None else run.clock(), 1),
    }


# --- renderings ----------------------------------------------------------------------------


def _p(d: Mapping[str, Any] | None) -> str:
    if not d or not d.get("n"):
        return "—"
    return f"{d['p50']} / {d['p95']} / {d['p99']}"


def _outcomes(o: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in o.items()) or "—"


HEAD = (
    "phase",
    "clients",
    "requests",
    "outcomes",
    "TTFT ms p50/95/99",
    "ITL ms p50/95/99",
    "tok/s",
    "req/s",
    "acceptance",
    "RSS max MB",
    "RSS MB/min",
)


def rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    out = []
    for ph in report["phases"]:
        acc = ph["acceptance"]
        out.append(
            (
                MODE_NAMES[ph["mode"]],
                str(ph["clients"]),
                str(ph["requests"]),
                _outcomes(ph["outcomes"]),
                _p(ph["ttft_ms"]),
                _p(ph["itl_ms"]),
                f"{ph['tokens_per_second']}",
                f"{ph['requests_per_second']}",
                "—" if acc is None or ph["mode"] != "spec" else f"{acc['rate']:.1%}",
                f"{ph['rss_mb']['max']}",
                f"{ph['rss_mb']['slope_mb_per_min']}",
            )
        )
    return out


def over_time(report: Mapping[str, Any]) -> list[str]:
    """Each speculative phase's acceptance over time and each phase's memory slope after
    warm-up: what a soak is judged by."""
    md = ["", "## Over time", ""]
    for ph in report["phases"]:
        name = f"{MODE_NAMES[ph['mode']]} ×{ph['clients']}"
        warm = ph["rss_mb"].get("slope_after_warmup_mb_per_min")
        idle = ph["rss_mb"].get("idle_after")
        samples = ph["rss_mb"]["samples"]
        md.append(
            f"- {name}: RSS slope {ph['rss_mb']['slope_mb_per_min']} MB/min over the phase, "
            f"{warm} MB/min after its first {WARMUP_SHARE:.0%}"
            + (
                f"; {samples[0][1]} MB at the first sample, {ph['rss_mb']['max']} MB at most "
                f"under load, {idle} MB idle after it"
                if idle is not None and samples
                else ""
            )
        )
        win = [w for w in ph.get("acceptance_over_time") or () if w["rate"] is not None]
        if ph["mode"] == "spec" and win:
            rates = [w["rate"] for w in win]
            md.append(
                f"- {name}: acceptance over time ({len(win)} equal spans that drafted): "
                + ", ".join(f"{r:.1%}" for r in rates)
                + f" (min {min(rates):.1%}, max {max(rates):.1%})"
            )
    return md


def fault_lines(report: Mapping[str, Any]) -> list[str]:
    f = report["faults"]
    out = []
    for k in f["kill"]:
        healthy = (
            f"healthy again after {k['time_to_healthy_s']}s (GET /health 200)"
            if k["time_to_healthy_s"] is not None
            else f"not restarted: {k['restart_error']}"
        )
        out.append(
            f"kill: the {MODE_NAMES[k['mode']]} server was SIGKILLed at {k['at_s']}s with "
            f"{k['in_flight']} request(s) in flight; {k['lost_in_flight']} lost in flight, "
            f"{k['refused_while_down']} refused while down; {healthy}"
        )
    if f["kill_not_fired"]:
        out.append("kill: not fired (the load phases ended before its time)")
    for s in f["stall"]:
        back = s["slot_back_after_s"]
        out.append(
            f"stall ({MODE_NAMES[s['mode']]}): began at {s['began']}s; "
            + (f"slot free again after {back}s; " if back is not None else "slot not freed; ")
            + s["how"]
            + f" (watched with {s['watched_with']})"
        )
    for o in f["overflow"]:
        out.append(
            f"overflow ({MODE_NAMES[o['mode']]}): {o['outcome']}"
            + (f" — {o['reason']}" if o["reason"] else "")
        )
    return out


def exact_line(report: Mapping[str, Any]) -> str:
    e = report["exactness"]
    if not e["checked"]:
        return f"exactness: not checked ({e['why']})"
    line = (
        f"exactness: {e['identical']}/{e['compared']} completed outputs identical to the "
        "sequential plain reference"
    )
    for d in e["differences"]:
        line += f"; {d['prompt']} ({d['mode']}, {d['clients']} clients)"
        line += f" differs at token {d['position']}"
    return line


def markdown(report: Mapping[str, Any]) -> str:
    plan = report["plan"]
    status = (
        "complete"
        if report["complete"]
        else f"**partial** — the run stopped early: {report['stopped']}"
    )
    md = [
        f"# Load test: {report['recipe']} on {report['artifact_id']}",
        "",
        f"- status: {status}",
        f"- machine: {report['machine']['description']}",
        f"- engine: {report['engine']} {report['commit']} ({report['backend']}), {report['date']}",
        f"- arrangement: {report['arrangement']}",
        f"- plan: clients {', '.join(map(str, plan['clients']))}, up to {plan['requests']} "
        "requests a phase, "
        f"{plan['duration']}s for the load phases, {plan['n_predict']} tokens an answer, "
        f"{plan['stream_share']:.0%} streamed, {plan['cancel_share']:.0%} of streams hung up "
        f"after a few tokens, {report['ctx_per_slot']} tokens of context per slot, every "
        f"request's deadline {plan['request_timeout']}s; faults: "
        f"{', '.join(plan['faults']) or 'none'}",
        "- prompts: "
        + ", ".join(f"{p['name']} ({p['tokens']} tokens)" for p in report["prompts"])
        + (f"; left out: {'; '.join(report['left_out'])}" if report["left_out"] else ""),
        f"- outcomes: {_outcomes(report['outcomes'])}; unexpected errors: "
        f"{report['unexpected_errors']} (over-context refusals of the over-context prompt and "
        "requests lost to a kill are expected)",
        f"- {exact_line(report)}",
        f"- wall: {report['wall_seconds']}s",
        "",
        "Measured on this run. TTFT and inter-token latency (ITL) come from streamed requests, "
        "as the client saw them; tokens/s and requests/s are over the phase's wall time; "
        "acceptance is from the server's /metrics; RSS is /proc/PID/status VmRSS sampled "
        "once a second, its slope a least-squares line.",
        "",
        "| " + " | ".join(HEAD) + " |",
        "|" + "---|" * len(HEAD),
        *("| " + " | ".join(r) + " |" for r in rows(report)),
    ]
    md += over_time(report)
    if report["faults"]["asked"]:
        md += ["", "## Faults", "", *(f"- {line}" for line in fault_lines(report))]
    md += ["", "Commands:", ""]
    md += [f"- {what}: `{cmd}`" for what, cmd in report["commands"].items()]
    return "\n".join(md) + "\n"


def plot(report: Mapping[str, Any], path: Path) -> bool:
    """The server's RSS over the run (one line per phase), TTFT/ITL p50/p95/p99 by mode and,
    where a speculative phase drafted, its acceptance over time."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = [
        (ph, [w for w in ph.get("acceptance_over_time") or () if w["rate"] is not None])
        for ph in report["phases"]
        if ph["mode"] == "spec"
    ]
    spans = [(ph, w) for ph, w in spans if w]
    fig, axes = plt.subplots(1, 3 if spans else 2, figsize=(16 if spans else 11, 4.5))
    a, b = axes[0], axes[1]
    for ph, win in spans:
        axes[2].plot(
            [(w["from_s"] + w["to_s"]) / 2 for w in win],
            [w["rate"] for w in win],
            marker="o",
            label=f"speculative ×{ph['clients']}",
        )
    if spans:
        axes[2].set_ylim(0, 1.05)
        axes[2].set_xlabel("seconds into the run")
        axes[2].set_ylabel("acceptance (accepted ÷ drafted)")
        axes[2].legend(fontsize=8)
    for ph in report["phases"]:
        s = ph["rss_mb"]["samples"]
        xs: list[float] = []
        ys: list[float] = []
        for x, y in s:  # a gap (the server killed and restarting) breaks the line
            if xs and x - xs[-1] > 3.0:
                xs.append(float("nan"))
                ys.append(float("nan"))
            xs.append(x)
            ys.append(y)
        if s:
            a.plot(xs, ys, label=f"{ph['mode']} ×{ph['clients']}")
    for k in report["faults"]["kill"]:
        a.axvline(k["at_s"], color="red", linestyle="--", linewidth=0.8)
    a.set_xlabel("seconds into the run")
    a.set_ylabel("server RSS (MB)")
    a.legend(fontsize=8)
    labels, values = [], []
    for mode, m in report["by_mode"].items():
        for what in ("ttft_ms", "itl_ms"):
            d = m[what]
            if d.get("n"):
                labels.append(f"{mode} {what[:-3].upper()}")
                values.append([d["p50"], d["p95"], d["p99"]])
    for i, q in enumerate(("p50", "p95", "p99")):
        b.bar([x + i * 0.27 for x in range(len(labels))], [v[i] for v in values], 0.27, label=q)
    b.set_xticks([x + 0.27 for x in range(len(labels))], labels, fontsize=8)
    b.set_ylabel("ms")
    b.legend(fontsize=8)
    fig.suptitle(
        f"load — {report['recipe']} — {report['artifact_id']}"
        + ("" if report["complete"] else " (partial)")
        + f"\n{report['machine']['description']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write(report: Mapping[str, Any], out_dir: Path, stem_name: str, console: Console) -> Path:
    """The report as .json, .md and .png (where matplotlib is), each written whole under a
    temporary name and renamed; its table and fault lines on the console."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / stem_name
    _atomic(
        stem.with_name(stem.name + ".json"),
        lambda t: t.write_text(json.dumps(report, indent=2) + "\n"),
    )
    _atomic(stem.with_name(stem.name + ".md"), lambda t: t.write_text(markdown(report)))
    plotted = [False]

    def png(t: Path) -> None:
        plotted[0] = plot(report, t)
        if not plotted[0]:
            t.write_bytes(b"")

    png_path = stem.with_name(stem.name + ".png")
    _atomic(png_path, png)
    if not plotted[0]:
        png_path.unlink(missing_ok=True)
    summary(report, console)
    made = ".json, .md and .png" if plotted[0] else ".json and .md (no matplotlib: no plot)"
    console.print(f"load: wrote {stem}{made}" + ("" if report["complete"] else " (partial)"))
    return stem


def summary(report: Mapping[str, Any], console: Console) -> None:
    table = Table(title=f"load ({report['recipe']}, {report['artifact_id']})")
    for h in HEAD:
        table.add_column(h)
    for r in rows(report):
        table.add_row(*r)
    console.print(table)
    console.print(f"load: outcomes: {_outcomes(report['outcomes'])}")
    console.print(f"load: {exact_line(report)}")
    for line in fault_lines(report):
        console.print(f"load: {line}")
    if not report["speculative"]:
        console.print("load: the recipe has no speculation: plain phases only")


def target_is_f32(recipe: str) -> str | None:
    """None where the recipe's target is an F32 reference copy (outputs must match the
    sequential reference exactly), else why outputs are not compared."""
    from llamaspec.models import recipes

    found, models = recipes.find(recipe)
    handle = models.pairs[found.pair].target
    if models.models[handle].dtype == "f32":
        return None
    return (
        f"the target {handle} is not an F32 reference copy: greedy outputs of a quantized "
        "model may differ between batched and sequential runs"
    )


def run(
    artifact: Artifact, recipe: str, plan: LoadPlan, reports: Path, console: Console
) -> dict[str, Any] | None:
    """`llamaspec load`: the recipe's plan for `artifact`, its load phases, the report."""
    p = bench_plans.bench_plan(artifact, recipe, None, None, [], None, console)
    exact = target_is_f32(recipe) if plan.exact else "--no-exact"
    ctx = plan.ctx or load.recipe_ctx(p)
    state = LoadRun(p.name, plan, bool(p.spec_args), ctx)
    stem = f"load-{p.name}-{artifact.id}"
    stopped: str | None = "failed"
    report: dict[str, Any] | None = None
    try:
        load.execute(artifact, p, state, exact, reports / f"{stem}-logs", console)
        stopped = None
    except KeyboardInterrupt:
        stopped = "interrupted (Ctrl-C)"
        raise
    except LlamaspecError as exc:
        stopped = f"failed: {exc.message}"[:500]
        raise
    finally:
        if state.phases:  # nothing measured: no report
            report = to_json(state, artifact, stopped)
            write(report, reports, stem, console)
    return report
