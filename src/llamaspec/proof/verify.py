"""Equivalence suite: speculation must change nothing but speed.

For each speculative method the binary supports, greedy outputs with and without
speculation are compared token by token, sequentially and then in parallel on several
slots. A numeric envelope is measured first, without any speculation, from server
configurations that change only kernel shapes; a speculative divergence is a near-tie
when the reference's own log-probabilities put it inside that envelope, else it is hard.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamaspec.engine.build import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.proof import smoke
from llamaspec.proof.client import Server, running, server_help
from llamaspec.proof.smoke import Completion, Prompt, Verdict

PARALLEL_SLOTS = 4

CHAT_TURNS = (
    "Write a quicksort in C with comments.",
    "Now write merge sort in the same style.",
    "Write a benchmark harness that compares both on 100, 1000 and 10000 elements.",
    "Extract the timing code into a reusable benchmark() function.",
)

CHAT_HISTORY = tuple(
    (turn, f"Here is the {what}, in C99, with a comment above every step.")
    for turn, what in zip(CHAT_TURNS[:-1], ("quicksort", "merge sort", "harness"), strict=True)
)

REWRITE_SOURCE = """def total_price(items, tax_rate):
    total = 0
    for item in items:
        total = total + item.price * item.quantity
    total = total + total * tax_rate
    return total


def average_price(items):
    total = 0
    for item in items:
        total = total + item.price
    return total / len(items)
"""

VERIFY_PROMPTS: tuple[Prompt, ...] = (
    Prompt("short", "The capital of France is", 32),
    smoke.SMOKE_PROMPTS[0],
    smoke.SMOKE_PROMPTS[1],
    Prompt(
        "rewrite",
        "Rewrite this Python code, renaming `items` to `products`, and keep everything else "
        f"exactly as it is.\n\n```python\n{REWRITE_SOURCE}```\n\n```python\n",
        96,
    ),
    Prompt(
        "chat",
        "".join(f"User: {turn}\nAssistant: {reply}\n" for turn, reply in CHAT_HISTORY)
        + f"User: {CHAT_TURNS[-1]}\nAssistant:",
        64,
    ),
)


@dataclass(frozen=True)
class Method:
    """A speculative method and the settings the suite runs it with."""

    name: str
    settings: dialects.SpecSettings
    tuning: tuple[str, ...] = ()


@dataclass
class Divergence:
    prompt: str
    mode: str
    verdict: Verdict


@dataclass
class MethodResult:
    method: str
    argv: list[str]
    skipped: str | None = None
    identical: int = 0
    near_tie: int = 0
    short: int = 0
    hard: int = 0
    drafted: int = 0
    accepted: int = 0
    divergences: list[Divergence] = field(default_factory=list)


@dataclass
class Envelope:
    """How far apart (reference log-prob) tokens flipped without any speculation."""

    configs: list[str]
    flips: list[dict]
    max_delta: float
    threshold: float
    failures: list[dict] = field(default_factory=list)


@dataclass
class VerifyReport:
    artifact_id: str
    tag: str
    model: str
    envelope: Envelope
    methods: list[MethodResult]
    wall_seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(m.hard == 0 for m in self.methods if m.skipped is None)

    def to_json(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def determinism_args(help_text: str) -> list[str]:
    """FACTS: separate KV caches per slot, and flash attention off on CPU."""
    out = ["--no-kv-unified"] if "--no-kv-unified" in dialects.help_flags(help_text) else []
    if takes_fa_value(help_text):
        out += ["-fa", "off"]
    return out


def takes_fa_value(help_text: str) -> bool:
    """`-fa on|off|auto` (upstream `[on|off|auto]`, ik_llama.cpp `(auto|on|off|0|1)`)."""
    return re.search(r"--flash-attn\s*[\[(][^\])]*\boff\b", help_text) is not None


def methods_for(dialect: str, help_text: str, draft: Path, has_mtp: bool) -> list[Method | str]:
    """The methods this binary supports; unsupported ones come back as a reason string."""
    out: list[Method | str] = [Method("draft", dialects.SpecSettings("draft", draft, n_max=8))]
    for name in ("ngram-simple", "ngram-map-k", "ngram-mod"):
        if name not in help_text:
            out.append(f"{name}: not in this binary's --spec-type list")
            continue
        tuning = tuple(smoke.ngram_tuning(help_text)) if name == "ngram-mod" else ()
        out.append(Method(name, dialects.SpecSettings(name), tuning))  # type: ignore[arg-type]
    if has_mtp:
        out.append(Method("mtp", dialects.SpecSettings("mtp", n_max=1)))
    else:
        out.append("mtp: the model has no MTP heads")
    return out


def _run(server: Server, prompts: Sequence[Prompt], parallel: bool) -> list[Completion]:
    if not parallel:
        return [smoke.complete(server, p) for p in prompts]
    with ThreadPoolExecutor(max_workers=PARALLEL_SLOTS) as pool:
        return list(pool.map(lambda p: smoke.complete(server, p), prompts))


def _probe(ref: Server, prompt: Prompt, r: Completion, s: Completion, threshold: float) -> Verdict:
    pos = smoke.divergence(r, s)
    top = None
    if pos is not None and pos < len(r.tokens):
        top = smoke.top_logprobs_at(ref, prompt, pos)
    verdict = smoke.classify(r, s, top, margin=threshold)
    return smoke.with_text(ref, verdict, r, s)


def measure_envelope(
    server_bin: Path,
    base: list[str],
    help_text: str,
    ref: Server,
    refs: Sequence[Completion],
    prompts: Sequence[Prompt],
    logs: Path,
    say: Callable[[str], None],
) -> Envelope:
    """Run the prompts without speculation under shape-only changes; record flip margins."""
    configs: list[tuple[str, list[str], bool]] = [("parallel slots", [], True)]
    if takes_fa_value(help_text):
        configs.append(("flash attention on", ["-fa", "on"], False))
    configs.append(("micro-batch 16", ["-ub", "16"], False))
    # the shapes draft verification runs (2-9 tokens), which GPUs serve with other kernels
    # than one token or sixteen
    configs.append(("micro-batch 4", ["-ub", "4"], False))
    flips: list[dict] = []
    failures: list[dict] = []
    for name, extra, parallel in configs:
        say(f"verify: envelope: {name}")
        log = logs / f"envelope-{name.replace(' ', '-')}.log"
        try:
            with running(server_bin, [*base, *extra], log) as srv:
                outs = _run(srv, prompts, parallel)
        except LlamaspecError as exc:
            # An engine that crashes under a configuration the suite does not depend on is
            # reported (with its log kept), not allowed to hide the speculative results.
            first = str(exc).splitlines()[0]
            say(f"verify: envelope: {name} FAILED, skipped: {first} (log: {log})")
            failures.append({"config": name, "error": first, "log": str(log)})
            continue
        for p, r, o in zip(prompts, refs, outs, strict=True):
            v = _probe(ref, p, r, o, threshold=float("inf"))
            if v.kind != "identical":
                flips.append(
                    {
                        "config": name,
                        "prompt": p.name,
                        "position": v.position,
                        "delta_nats": v.delta_nats,
                    }
                )
    deltas = [f["delta_nats"] for f in flips if f["delta_nats"] is not None]
    max_delta = max(deltas, default=0.0)
    return Envelope(
        [c[0] for c in configs],
        flips,
        max_delta,
        max(max_delta, smoke.NEAR_TIE_MARGIN_NATS),
        failures,
    )


def verify(
    artifact: Artifact,
    dialect: str,
    model: Path,
    out_dir: Path,
    console: Console,
    prompts: Sequence[Prompt] = VERIFY_PROMPTS,
    methods: Sequence[str] | None = None,
    has_mtp: bool = False,
    tag: str = "embedded",
    draft: Path | None = None,
    modes: Sequence[str] = (),
) -> VerifyReport:
    """Run the suite; write verify-<artifact>.json/.md into `out_dir`; return the report."""
    t0 = time.monotonic()
    help_text = server_help(artifact.server)
    base = [
        *smoke.base_args(model, ctx=4096 * PARALLEL_SLOTS, slots=PARALLEL_SLOTS),
        *determinism_args(help_text),
    ]
    logs = out_dir / f"verify-{artifact.id}-{tag}-logs"
    chosen = methods_for(dialect, help_text, draft or model, has_mtp)
    if methods:
        known = [m.name for m in chosen if isinstance(m, Method)]
        unknown = [m for m in methods if m not in known]
        if unknown:
            raise LlamaspecError(
                f"{artifact.server} does not support speculative method(s) {', '.join(unknown)}; "
                f"it supports: {', '.join(known)}."
            )
        chosen = [m for m in chosen if isinstance(m, Method) and m.name in methods]
    results: list[MethodResult] = []
    with running(artifact.server, base, logs / "reference.log") as ref:
        console.print(f"verify: reference run ({len(prompts)} prompts, no speculation)")
        refs = _run(ref, prompts, parallel=False)
        env = measure_envelope(
            artifact.server, base, help_text, ref, refs, prompts, logs, console.print
        )
        console.print(
            f"verify: numeric envelope {env.max_delta:.3f} nats "
            f"({len(env.flips)} flips); near-tie threshold {env.threshold:.3f}"
        )
        for m in chosen:
            if isinstance(m, str):
                name, why = m.split(": ", 1)
                results.append(MethodResult(name, [], skipped=why))
                continue
            argv = [*dialects.spec_args(dialect, m.settings), *m.tuning]
            dialects.check_help(argv, help_text, str(artifact.server))
            # Reports name model files, never this machine's paths.
            res = MethodResult(m.name, [Path(a).name if Path(a).is_file() else a for a in argv])
            with running(artifact.server, [*base, *argv], logs / f"{m.name}.log") as srv:
                for mode, parallel in (("sequential", False), ("parallel", True)):
                    if modes and mode not in modes:
                        continue
                    console.print(f"verify: {m.name}: {mode}")
                    for p, r, s in zip(prompts, refs, _run(srv, prompts, parallel), strict=True):
                        v = _probe(ref, p, r, s, env.threshold)
                        res.drafted += s.draft_n or 0
                        res.accepted += s.draft_accepted or 0
                        setattr(
                            res,
                            v.kind.replace("-", "_"),
                            getattr(res, v.kind.replace("-", "_")) + 1,
                        )
                        if v.kind != "identical":
                            res.divergences.append(Divergence(p.name, mode, v))
            results.append(res)
    report = VerifyReport(artifact.id, tag, model.name, env, results, time.monotonic() - t0)
    write(report, out_dir)
    print_table(report, console)
    return report


def write(report: VerifyReport, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"verify-{report.artifact_id}-{report.tag}"
    stem.with_suffix(".json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    lines = [
        f"# Equivalence: {report.artifact_id} ({report.model})",
        "",
        f"Numeric envelope (no speculation; {', '.join(report.envelope.configs)}): "
        f"max {report.envelope.max_delta:.3f} nats over {len(report.envelope.flips)} flips; "
        f"near-tie threshold {report.envelope.threshold:.3f} nats.",
        "",
        *(
            f"Envelope configuration **{f['config']}** crashed the server and was skipped: "
            f"{f['error']} (log: `{f['log']}`)."
            for f in report.envelope.failures
        ),
        "",
        "| method | identical | near-tie | short | hard | drafted | accepted | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in report.methods:
        lines.append(
            f"| {m.method} | {m.identical} | {m.near_tie} | {m.short} | {m.hard} | {m.drafted} | "
            f"{m.accepted} | {m.skipped or ''} |"
        )
    for m in report.methods:
        for d in m.divergences:
            lines += [
                "",
                f"## {m.method} / {d.prompt} ({d.mode}): {d.verdict.describe()}",
                "",
                f"- reference: `{d.verdict.reference}`",
                f"- speculative: `{d.verdict.speculative}`",
            ]
    lines += [
        "",
        f"Result: {'PASSED' if report.passed else 'FAILED'} in {report.wall_seconds:.0f}s.",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def print_table(report: VerifyReport, console: Console) -> None:
    table = Table(title=f"verify: {report.artifact_id}")
    for col in ("method", "identical", "near-tie", "short", "hard", "drafted", "accepted", "note"):
        table.add_column(col)
    for m in report.methods:
        table.add_row(
            m.method,
            str(m.identical),
            str(m.near_tie),
            str(m.short),
            str(m.hard),
            str(m.drafted),
            str(m.accepted),
            m.skipped or "",
        )
    console.print(table)
    for m in report.methods:
        for d in m.divergences:
            console.print(f"  {m.method}/{d.prompt} ({d.mode}): {d.verdict.describe()}")
    console.print(f"verify: {'PASSED' if report.passed else 'FAILED'} ({report.wall_seconds:.0f}s)")
