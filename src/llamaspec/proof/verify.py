"""Equivalence suite: speculation must change nothing but speed.

Two tiers, for every speculative method the binary supports, sequentially and on
parallel slots:

- **strict**, on a reference copy of the model in F32 (proof.reference): greedy output with
  speculation must be token-identical to output without it. There is no threshold: a
  difference, or an output that stops early, fails, reported with both continuations and
  the per-token gaps of the speculative output.
- **oracle**, for quantized and users' models: every emitted token is judged by a plain
  server's log-probabilities given exactly the emitted prefix (proof.oracle). The envelope
  is the plain output's own largest gap under configurations that change only kernel
  shapes (parallel slots, micro-batches, flash attention); a speculative token whose gap
  exceeds it is a hard divergence.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.proof import oracle as oracle_mod
from llamaspec.proof.defects import Defect, known_defect
from llamaspec.runtime.client import (
    Completion,
    Prompt,
    Server,
    base_args,
    complete,
    render_chat,
    running,
    server_help,
)

PARALLEL_SLOTS = 4
SLOT_CTX = 4096  # each slot's context: prompt and generated tokens must fit
Say = Callable[[str], None]

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

CODE = Prompt(
    "code",
    "Write a C function that reverses a singly linked list in place. Put a short comment "
    "above every step, then a main() that builds a list of five nodes, reverses it and "
    "prints the values.\n\n```c\n#include <stdio.h>\n#include <stdlib.h>\n",
)
PROSE = Prompt(
    "prose",
    "The printing press changed how ideas travelled across Europe. Before it, books were "
    "copied by hand, which made them rare and expensive. In a few sentences, explain what "
    "changed for ordinary readers in the fifty years after 1450:\n\n",
)
REWRITE = Prompt(
    "rewrite",
    "Rewrite this Python code, renaming `items` to `products`, and keep everything else "
    f"exactly as it is.\n\n```python\n{REWRITE_SOURCE}```\n\n```python\n",
    96,
)
VERIFY_PROMPTS: tuple[Prompt, ...] = (
    Prompt("short", "The capital of France is", 32),
    CODE,
    PROSE,
    REWRITE,
    Prompt(
        "chat",
        "".join(f"User: {turn}\nAssistant: {reply}\n" for turn, reply in CHAT_HISTORY)
        + f"User: {CHAT_TURNS[-1]}\nAssistant:",
        64,
    ),
)


def choose_prompts(names: Sequence[str]) -> tuple[Prompt, ...]:
    """The built-in prompts named (all when none), with a did-you-mean for unknown names."""
    from llamaspec.errors import choose

    by_name = {p.name: p for p in VERIFY_PROMPTS}
    if not names:
        return VERIFY_PROMPTS
    wanted = {choose("prompt", n, by_name) for n in names}
    return tuple(p for p in VERIFY_PROMPTS if p.name in wanted)


def shown(args: Sequence[str]) -> list[str]:
    """Server arguments as a report shows them: files by their name only."""
    return [Path(a).name if Path(a).is_file() else a for a in args]


@dataclass(frozen=True)
class Method:
    """A speculative method and the server arguments that turn it on."""

    name: str
    argv: tuple[str, ...]


@dataclass
class Case:
    """One prompt in one mode: how the speculative output compares with the reference."""

    prompt: str
    mode: str
    kind: str  # identical | different | short | longer | known-defect | over-envelope | within
    position: int | None = None
    max_gap: float | None = None
    over: list[str] = field(default_factory=list)  # tokens over the envelope, described
    reference: str = ""
    speculative: str = ""
    defect: str | None = None
    note: str = ""  # why a catalogued short-output defect does not excuse it


@dataclass
class MethodResult:
    method: str
    argv: list[str]
    skipped: str | None = None
    cases: list[Case] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    per_mode: dict[str, list[int]] = field(default_factory=dict)  # mode: [drafted, accepted]
    flags: str = "determinism"  # or "own": the recipe's own flags, no determinism flags

    def drafts(self, mode: str) -> tuple[int, int]:
        d, a = self.per_mode.get(mode, [0, 0])
        return d, a

    def count(self, kind: str, mode: str | None = None) -> int:
        return sum(1 for c in self.cases if c.kind == kind and mode in (None, c.mode))

    @property
    def failures(self) -> list[Case]:
        return [
            c for c in self.cases if c.kind in ("different", "short", "longer", "over-envelope")
        ]

    def max_gap(self, mode: str | None = None) -> float | None:
        gaps = [c.max_gap for c in self.cases if c.max_gap is not None and mode in (None, c.mode)]
        return max(gaps) if gaps else None


@dataclass
class Envelope:
    """The plain output's own largest per-token gap under shape-only configurations."""

    configs: list[str]
    max_gap: float
    by_config: dict[str, float] = field(default_factory=dict)
    failures: list[dict] = field(default_factory=list)


@dataclass
class VerifyReport:
    artifact_id: str
    tag: str
    tier: str
    model: str
    methods: list[MethodResult]
    envelope: Envelope | None = None
    reference_sha256: str | None = None
    oracle_requests: int = 0
    wall_seconds: float = 0.0
    server: list[str] = field(default_factory=list)  # the plain server's command line
    # The determinism flags every server used (rows with flags "own" excepted); [] when the
    # run used the server's defaults, None where not recorded.
    determinism: list[str] | None = None

    @property
    def passed(self) -> bool:
        ran = [m for m in self.methods if m.skipped is None]
        return bool(ran) and all(not m.failures for m in ran)

    def to_json(self) -> dict:
        out = asdict(self)
        out["passed"] = self.passed
        for m, mj in zip(self.methods, out["methods"], strict=True):
            mj["summary"] = {
                mode: {
                    "identical": m.count("identical", mode),
                    "failed": sum(1 for c in m.failures if c.mode == mode),
                    "max_gap": _finite(m.max_gap(mode)),
                }
                for mode in ("sequential", "parallel")
            }
            mj["identical"] = m.count("identical")
            mj["failed"] = len(m.failures)
        out["own_flags"] = own_flags_summary(self)
        return _json_safe(out)


FLAG_LABELS = {"determinism": "determinism flags", "own": "recipe's own flags"}


def _label(m: MethodResult) -> str:
    """A method as reports name it: rows under the recipe's own flags say so."""
    return m.method if m.flags == "determinism" else f"{m.method} ({FLAG_LABELS[m.flags]})"


def own_flags_summary(report: VerifyReport) -> dict | None:
    """What the recipe's own flags (the server's defaults) changed, in the oracle's terms:
    outputs identical to the reference, within the envelope, over it; None without such rows."""
    own = [m for m in report.methods if m.flags == "own" and m.skipped is None]
    if not own:
        return None
    cases = [c for m in own for c in m.cases]
    failed = sum(len(m.failures) for m in own)
    gaps = [g for g in (m.max_gap() for m in own) if g is not None]
    return {
        "outputs": len(cases),
        "identical": sum(1 for c in cases if c.kind == "identical"),
        "within_envelope": sum(1 for c in cases if c.kind == "within"),
        "over_envelope": sum(1 for c in cases if c.kind == "over-envelope"),
        "other_failures": failed - sum(1 for c in cases if c.kind == "over-envelope"),
        "max_gap": _finite(max(gaps)) if gaps else None,
        "envelope": round(report.envelope.max_gap, 4) if report.envelope else None,
        "verdict": "failed" if failed else "passed",
    }


def _finite(x: float | None) -> float | str | None:
    if x is None:
        return None
    return "outside top-10" if math.isinf(x) else round(x, 4)


def _json_safe(obj: object) -> object:
    if isinstance(obj, float) and math.isinf(obj):
        return "inf"
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_safe(v) for v in obj]
    return obj


def determinism_args(help_text: str) -> list[str]:
    """FACTS: separate KV caches per slot, and flash attention off on CPU."""
    out = ["--no-kv-unified"] if "--no-kv-unified" in dialects.help_flags(help_text) else []
    if takes_fa_value(help_text):
        out += ["-fa", "off"]
    return out


def takes_fa_value(help_text: str) -> bool:
    """`-fa on|off|auto` (upstream `[on|off|auto]`, ik_llama.cpp `(auto|on|off|0|1)`)."""
    return re.search(r"--flash-attn\s*[\[(][^\])]*\boff\b", help_text) is not None


# ngram-mod's defaults (48/64-token matches) draft nothing on short outputs: shorter ones.
NGRAM_MOD_KNOBS = {"ngram_mod_n_min": 4, "ngram_mod_n_max": 16, "ngram_mod_n_match": 8}


def offers(help_text: str, spec_type: str) -> bool:
    """Whether the binary's --help lists `spec_type` under --spec-type (either engine's way)."""
    listed = dialects.spec_type_choices(help_text)
    return spec_type in listed if listed is not None else spec_type in help_text


def methods_for(dialect: str, help_text: str, draft: Path, has_mtp: bool) -> list[Method | str]:
    """The methods this binary supports; unsupported ones come back as a reason string."""
    out: list[Method | str] = []
    wanted: list[tuple[str, tuple[str, ...], dict]] = [
        ("draft", ("draft",), {"draft_n_max": 8, "draft_p_min": 0.0}),
        *((name, (name,), {}) for name in ("ngram-simple", "ngram-map-k", "ngram-mod")),
        ("draft+ngram-mod", ("draft", "ngram-mod"), {"draft_n_max": 8, "draft_p_min": 0.0}),
    ]
    for name, types, settings in wanted:
        if any(t.startswith("ngram") and not offers(help_text, t) for t in types):
            out.append(f"{name}: not in this binary's --spec-type list")
            continue
        try:
            argv = render_method(dialect, help_text, types, settings, draft)
        except LlamaspecError as exc:
            out.append(f"{name}: {exc.message.split('. ')[0]}")
            continue
        out.append(Method(name, tuple(argv)))
    if has_mtp:
        out.append(
            Method(
                "mtp", tuple(render_method(dialect, help_text, ("mtp",), {"draft_n_max": 1}, draft))
            )
        )
    else:
        out.append("mtp: the model has no MTP heads")
    return out


def render_method(
    dialect: str, help_text: str, types: Sequence[str], settings: dict, draft: Path
) -> list[str]:
    from llamaspec import config

    spec = config.SpecSettings(types=tuple(types), **settings)
    if "ngram-mod" in types:
        tuned = spec.model_copy(update=NGRAM_MOD_KNOBS)
        argv = list(dialects.render(dialect, tuned, draft=draft).argv)
        if {a for a in argv if a.startswith("-")} <= dialects.accepted_flags(help_text):
            return argv
    return list(dialects.render(dialect, spec, draft=draft).argv)


# The control: the same server with no speculation. Its parallel mode measures the engine's
# own batch invariance, which tells a speculation bug from plain batch variance.
PLAIN = Method("plain", ())


def _under_test(method: str) -> str:
    """What a report calls the output compared with the reference."""
    return "control (no speculation)" if method == PLAIN.name else "speculative"


def choose_methods(
    available: Sequence[Method | str], wanted: Sequence[str] | None, binary: Path
) -> list[Method | str]:
    """All available methods when none are named; `plain` only when asked for."""
    if not wanted:
        return list(available)
    offered = [PLAIN, *(m for m in available if isinstance(m, Method))]
    known = [m.name for m in offered]
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise LlamaspecError(
            f"{binary} does not support speculative method(s) {', '.join(unknown)}; it "
            f"supports: {', '.join(known)} (plain: no speculation, the control)."
        )
    return [m for m in offered if m.name in wanted]


def run_prompts(server: Server, prompts: Sequence[Prompt], parallel: bool) -> list[Completion]:
    if not parallel:
        return [complete(server, p) for p in prompts]
    with ThreadPoolExecutor(max_workers=PARALLEL_SLOTS) as pool:
        return list(pool.map(lambda p: complete(server, p), prompts))


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first item where `a` and `b` differ (the shorter one's length when one
    is a prefix of the other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _continuation(server: Server, c: Completion, pos: int) -> str:
    """A little context, then ⟦what the run chose⟧ from `pos` on."""
    before, after = c.tokens[max(0, pos - 8) : pos], c.tokens[pos : pos + 12]
    if c.tokens and isinstance(c.tokens[0], str):
        return f"…{''.join(map(str, before))}⟦{''.join(map(str, after))}⟧…"
    return f"…{server.detokenize(before)}⟦{server.detokenize(after)}⟧…"  # type: ignore[arg-type]


def compare(
    prompt: Prompt,
    mode: str,
    ref: Completion,
    spec: Completion,
    ref_server: Server,
    defect: Defect | None,
) -> Case:
    """Strict comparison: identical, or a failure of a named kind (short, longer, different).

    A short output is excused as `defect` (a catalogued short-output defect) only when it
    shows exactly that symptom; otherwise the case says why not."""
    pos = first_difference(ref.tokens, spec.tokens)
    if pos is None:
        return Case(prompt.name, mode, "identical")
    if pos == len(spec.tokens):
        kind = "short"
    elif pos == len(ref.tokens):
        kind = "longer"
    else:
        kind = "different"
    case = Case(
        prompt.name,
        mode,
        kind,
        pos,
        reference=_continuation(ref_server, ref, pos) if pos < len(ref.tokens) else "(ended)",
        speculative=_continuation(ref_server, spec, pos) if pos < len(spec.tokens) else "(ended)",
    )
    if defect is not None:
        why = defect.not_short_output(
            ref.tokens, spec.tokens, spec.tokens_predicted, prompt.n_predict
        )
        if why is None:
            case.kind, case.defect = "known-defect", defect.describe()
        else:
            case.note = f"not the catalogued defect {defect.id}: {why}"
    return case


def _gaps(orc: oracle_mod.Oracle | None, prompt: Prompt, c: Completion) -> list[oracle_mod.Gap]:
    if orc is None or not c.tokens or not isinstance(c.tokens[0], int):
        return []
    return orc.gaps(prompt, c.tokens)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Setup:
    """What a verify run serves: target and draft files, server arguments, prompts."""

    target: Path
    draft: Path
    base: tuple[str, ...]
    prompts: tuple[Prompt, ...]
    repeat: int = 1  # rounds of the parallel mode
    determinism: tuple[str, ...] = ()  # the determinism flags at the end of `base`

    def server_defaults(self) -> Setup:
        """The same setup without the determinism flags: the server's defaults."""
        cut = len(self.base) - len(self.determinism)
        return replace(self, base=self.base[:cut], determinism=())

    def cycle(self, n: int) -> list[tuple[Prompt, int]]:
        """(prompt, index into the reference outputs) for `n` outputs in prompt order."""
        return [(self.prompts[i % len(self.prompts)], i % len(self.prompts)) for i in range(n)]


def strict(
    artifact: Artifact,
    dialect: str,
    setup: Setup,
    methods: Sequence[Method | str],
    modes: Sequence[str],
    logs: Path,
    console: Console,
) -> list[MethodResult]:
    """Token identity with and without speculation, on a reference (F32) model."""
    with contextlib.ExitStack() as stack:
        ref = stack.enter_context(
            running(artifact.server, list(setup.base), logs / "reference.log")
        )
        setup = prepared(ref, setup)
        console.print(f"verify: strict: reference run ({len(setup.prompts)} prompts)")
        refs = run_prompts(ref, setup.prompts, parallel=False)
        orc: oracle_mod.Oracle | None = None

        def judge(case: Case, p: Prompt, s: Completion) -> None:
            """A failure gets the per-token gaps of the speculative output."""
            nonlocal orc
            if case.kind not in ("different", "longer", "short"):
                return
            if orc is None:  # a plain one-slot server, only when needed
                orc = oracle_mod.Oracle(stack.enter_context(_oracle_server(artifact, setup, logs)))
            gaps = _gaps(orc, p, s)
            case.max_gap = oracle_mod.max_gap(gaps) if gaps else None
            case.over = [oracle_mod.describe(g) for g in gaps if g.gap > 0][:8]

        return _sweep(artifact, setup, methods, modes, logs, console, ref, refs, judge)


def _sweep(
    artifact: Artifact,
    setup: Setup,
    methods: Sequence[Method | str],
    modes: Sequence[str],
    logs: Path,
    console: Console,
    ref: Server,
    refs: Sequence[Completion],
    judge: Callable[[Case, Prompt, Completion], None],
) -> list[MethodResult]:
    """Every method in every mode, each output compared with the reference's output for its
    prompt (`refs`, from `ref`) and then judged by the tier; skipped methods are recorded."""
    defect = known_defect(artifact.manifest, "short-output")
    results: list[MethodResult] = []
    for m in methods:
        if isinstance(m, str):
            name, why = m.split(": ", 1)
            results.append(MethodResult(name, [], skipped=why))
            continue
        res = _run_method(artifact, setup, m, modes, logs, console)
        result: MethodResult = res["result"]
        for mode, outs in res["outputs"].items():
            for (p, k), s in zip(setup.cycle(len(outs)), outs, strict=True):
                case = compare(p, mode, refs[k], s, ref, defect)
                judge(case, p, s)
                result.cases.append(case)
        results.append(result)
    return results


def prepared(server: Server, setup: Setup) -> Setup:
    """The prompts as they will be sent: chats through the model's own template, and each
    one checked to fit a slot's context with the tokens it asks for."""
    prompts = tuple(render_chat(server, p) for p in setup.prompts)
    for p in prompts:
        n = len(server.tokenize(p.text))
        if n + p.n_predict > SLOT_CTX:
            raise LlamaspecError(
                f"Prompt {p.name!r} is {n} tokens and asks for {p.n_predict} more: "
                f"{n + p.n_predict} do not fit in the {SLOT_CTX}-token context of a verify "
                "slot. Shorten its text or lower its n_predict."
            )
    return replace(setup, prompts=prompts)


def _oracle_server(artifact: Artifact, setup: Setup, logs: Path):
    """A plain one-slot server for per-token checks (prompt cache on)."""
    own = base_args(setup.target, ctx=8192, slots=1)
    args = [*own, *setup.base[len(own) :]]  # the same determinism flags, one slot
    return running(artifact.server, args, logs / "oracle.log")


def _run_method(
    artifact: Artifact,
    setup: Setup,
    m: Method,
    modes: Sequence[str],
    logs: Path,
    console: Console,
) -> dict:
    """Run one method's server; `outputs[mode]` lists one output per prompt (the parallel
    mode repeated `setup.repeat` times, prompts in the same order each time)."""
    res = MethodResult(m.name, shown(m.argv))
    outputs: dict[str, list[Completion]] = {}
    log = logs / f"{m.name}{'' if setup.determinism else '-server-defaults'}.log"
    with running(artifact.server, [*setup.base, *m.argv], log) as srv:
        for mode, parallel in (("sequential", False), ("parallel", True)):
            if modes and mode not in modes:
                continue
            rounds = setup.repeat if parallel else 1
            console.print(f"verify: {m.name}: {mode}" + (f" × {rounds}" if rounds > 1 else ""))
            outs: list[Completion] = []
            for _ in range(rounds):
                outs += run_prompts(srv, setup.prompts, parallel)
            drafted = sum(o.draft_n or 0 for o in outs)
            accepted = sum(o.draft_accepted or 0 for o in outs)
            res.per_mode[mode] = [drafted, accepted]
            res.drafted += drafted
            res.accepted += accepted
            outputs[mode] = outs
    return {"result": res, "outputs": outputs}


def measure_envelope(
    artifact: Artifact,
    setup: Setup,
    help_text: str,
    orc: oracle_mod.Oracle,
    logs: Path,
    say: Say,
    own: Setup | None = None,
) -> Envelope:
    """The plain output's own largest gap: no speculation, shape-only configurations; with
    `own` (a recipe's own flags), also the plain server under those flags, one request at a
    time and on parallel slots, so what the defaults change without speculation is inside."""
    configs: list[tuple[str, list[str], bool, Setup]] = [
        ("sequential", [], False, setup),
        ("parallel slots", [], True, setup),
        ("micro-batch 4", ["-ub", "4"], False, setup),
        ("micro-batch 16", ["-ub", "16"], False, setup),
    ]
    if takes_fa_value(help_text):
        configs.append(("flash attention on", ["-fa", "on"], False, setup))
    if own is not None:
        configs += [
            ("own flags, sequential", [], False, own),
            ("own flags, parallel slots", [], True, own),
        ]
    env = Envelope([c[0] for c in configs], 0.0)
    for name, extra, parallel, where in configs:
        say(f"verify: oracle: envelope: {name}")
        log = logs / f"envelope-{name.replace(' ', '-').replace(',', '')}.log"
        try:
            with running(artifact.server, [*where.base, *extra], log) as srv:
                outs = run_prompts(srv, setup.prompts, parallel)
        except LlamaspecError as exc:
            # An engine that crashes under a configuration the suite does not depend on is
            # reported (with its log kept), not allowed to hide the speculative results.
            first = str(exc).splitlines()[0]
            say(f"verify: envelope: {name} FAILED, skipped: {first} (log: {log})")
            env.failures.append({"config": name, "error": first, "log": log.name})
            continue
        worst = max(
            (
                oracle_mod.max_gap(_gaps(orc, p, o))
                for p, o in zip(setup.prompts, outs, strict=True)
            ),
            default=0.0,
        )
        env.by_config[name] = round(worst, 4)
        env.max_gap = max(env.max_gap, worst)
    return env


def judge_gaps(case: Case, gaps: Sequence[oracle_mod.Gap], envelope: float) -> None:
    """The oracle tier's verdict on one output: its per-token gaps are recorded, and a gap
    over the envelope fails it (a different output within the envelope passes)."""
    case.max_gap = oracle_mod.max_gap(gaps) if gaps else None
    over = [g for g in gaps if g.gap > envelope]
    case.over = [oracle_mod.describe(g) for g in over][:8]
    if case.kind in ("different", "longer") and gaps:
        case.kind = "over-envelope" if over else "within"
    elif case.kind == "identical" and over:
        case.kind = "over-envelope"  # the plain reference itself drifted


def oracle_tier(
    artifact: Artifact,
    dialect: str,
    setup: Setup,
    methods: Sequence[Method | str],
    modes: Sequence[str],
    logs: Path,
    console: Console,
    help_text: str,
    own: Method | None = None,
) -> tuple[list[MethodResult], Envelope, int]:
    """Every emitted token's gap against the plain server's choice, within the envelope.

    `own`: a recipe under its own flags, run after the sweep without the determinism flags
    and judged against the same reference, oracle and envelope (rows with flags "own")."""
    with _oracle_server(artifact, setup, logs) as osrv:
        setup = prepared(osrv, setup)
        probe = complete(osrv, setup.prompts[0])
        if probe.tokens and not isinstance(probe.tokens[0], int):
            raise LlamaspecError(
                f"The oracle tier needs token ids, and {artifact.manifest.get('engine')} at "
                f"{str(artifact.manifest.get('commit'))[:7]} returns none (only token texts). "
                "Verify this build with the strict tier instead (`--strict` with --recipe or "
                "--target, `--tier strict` for the built-in models)."
            )
        orc = oracle_mod.Oracle(osrv)
        own_setup = setup.server_defaults() if own is not None else None
        env = measure_envelope(artifact, setup, help_text, orc, logs, console.print, own_setup)
        console.print(f"verify: oracle: envelope {env.max_gap:.3f} nats {env.by_config}")

        def judge(case: Case, p: Prompt, s: Completion) -> None:
            judge_gaps(case, _gaps(orc, p, s), env.max_gap)

        with running(artifact.server, list(setup.base), logs / "reference.log") as ref:
            refs = run_prompts(ref, setup.prompts, parallel=False)
            results = _sweep(artifact, setup, methods, modes, logs, console, ref, refs, judge)
            if own is not None:
                console.print(
                    f"verify: {own.name}: its own flags (no {' '.join(setup.determinism)})"
                )
                defaults = setup.server_defaults()
                mine = _sweep(artifact, defaults, [own], modes, logs, console, ref, refs, judge)
                for r in mine:
                    r.flags = "own"
                results += mine
        return results, env, orc.requests


def verify(
    artifact: Artifact,
    dialect: str,
    model: Path,
    out_dir: Path,
    console: Console,
    *,
    tier: str = "strict",
    prompts: Sequence[Prompt] = VERIFY_PROMPTS,
    methods: Sequence[str] | None = None,
    has_mtp: bool = False,
    tag: str = "embedded",
    draft: Path | None = None,
    modes: Sequence[str] = (),
    spec: Method | None = None,
    reference_sha256: str | None = None,
    repeat: int = 1,
    own: Method | None = None,
    server_defaults: bool = False,
) -> VerifyReport:
    """Run one tier; write verify-<artifact>-<tag>[-oracle].json/.md into `out_dir`.

    `spec` replaces the method sweep with one configuration (a recipe's settings, under the
    determinism flags); `own` (oracle tier) adds that recipe under its own flags, judged in
    the oracle's terms. `server_defaults` drops the determinism flags from every server: a
    measurement of what the defaults change, where exactness is not claimed."""
    t0 = time.monotonic()
    help_text = server_help(artifact.server)
    det = () if server_defaults else tuple(determinism_args(help_text))
    base = (*base_args(model, ctx=SLOT_CTX * PARALLEL_SLOTS, slots=PARALLEL_SLOTS), *det)
    setup = Setup(model, draft or model, base, tuple(prompts), repeat, det)
    name = tag if tier == "strict" else f"{tag}-oracle"
    logs = out_dir / f"verify-{artifact.id}-{name}-logs"
    if spec is not None:
        chosen: list[Method | str] = [spec]
    else:
        available = methods_for(dialect, help_text, setup.draft, has_mtp)
        chosen = choose_methods(available, methods, artifact.server)
    for m in [*chosen, *([own] if own and tier == "oracle" else [])]:
        if isinstance(m, Method):
            dialects.check_help(list(m.argv), help_text, str(artifact.server))
    if tier == "strict":
        results = strict(artifact, dialect, setup, chosen, modes, logs, console)
        report = VerifyReport(artifact.id, name, tier, model.name, results, None, reference_sha256)
    else:
        results, env, n = oracle_tier(
            artifact, dialect, setup, chosen, modes, logs, console, help_text, own
        )
        report = VerifyReport(artifact.id, name, tier, model.name, results, env, None, n)
    report.wall_seconds = time.monotonic() - t0
    report.server = [artifact.server.name, *shown(base)]
    report.determinism = list(det)
    write(report, out_dir)
    print_table(report, console)
    return report


@dataclass(frozen=True)
class FastCheck:
    passed: bool
    detail: str


FAST_PROMPTS = (CODE, REWRITE)


def fast_check(
    artifact: Artifact,
    dialect: str,
    model: Path,
    spec_argv: Sequence[str],
    console: Console,
    logs: Path | None = None,
) -> FastCheck:
    """Two prompts, sequential: token-identical with and without `spec_argv`, or not."""
    import tempfile

    help_text = server_help(artifact.server)
    dialects.check_help(list(spec_argv), help_text, str(artifact.server))
    base = [*base_args(model), *determinism_args(help_text)]
    with tempfile.TemporaryDirectory(prefix="llamaspec-check-") as tmp:
        where = logs or Path(tmp)
        with running(artifact.server, base, where / "check-reference.log") as ref:
            refs = [complete(ref, p) for p in FAST_PROMPTS]
            with running(artifact.server, [*base, *spec_argv], where / "check-spec.log") as srv:
                specs = [complete(srv, p) for p in FAST_PROMPTS]
            cases = [
                compare(p, "sequential", r, s, ref, None)
                for p, r, s in zip(FAST_PROMPTS, refs, specs, strict=True)
            ]
    bad = [c for c in cases if c.kind != "identical"]
    if not bad:
        return FastCheck(True, f"{len(cases)} prompts identical")
    c = bad[0]
    return FastCheck(False, f"{c.prompt}: {c.kind} at token {c.position}")


def write(report: VerifyReport, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"verify-{report.artifact_id}-{report.tag}"
    stem.with_suffix(".json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(report))


def markdown(report: VerifyReport) -> str:
    lines = [f"# Equivalence ({report.tier} tier): {report.artifact_id} ({report.model})", ""]
    if report.tier == "strict":
        lines += [
            "Reference copy in F32"
            + (f" (sha256 `{report.reference_sha256[:16]}…`)" if report.reference_sha256 else "")
            + ": greedy output with speculation must be token-identical to output without it.",
            *flags_lines(report),
            "",
            "| method | mode | identical | failed | known defect | drafted | accepted | note |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        env = report.envelope
        assert env is not None
        lines += [
            f"Envelope (no speculation; {', '.join(env.configs)}): max per-token gap "
            f"{env.max_gap:.3f} nats ({', '.join(f'{k}: {v}' for k, v in env.by_config.items())}); "
            f"{report.oracle_requests} oracle requests.",
            *flags_lines(report),
            "",
            *(
                f"Envelope configuration **{f['config']}** crashed the server and was skipped: "
                f"{f['error']} (log: `{f['log']}`)."
                for f in env.failures
            ),
            "",
            "| method | mode | identical | within envelope | over envelope | max gap | drafted | "
            "accepted | note |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    for m in report.methods:
        if m.skipped:
            lines.append(f"| {_label(m)} | – | | | | | | | {m.skipped} |")
            continue
        for mode in ("sequential", "parallel"):
            if not any(c.mode == mode for c in m.cases):
                continue
            if report.tier == "strict":
                failed = sum(1 for c in m.failures if c.mode == mode)
                d, a = m.drafts(mode)
                lines.append(
                    f"| {_label(m)} | {mode} | {m.count('identical', mode)} | {failed} | "
                    f"{m.count('known-defect', mode)} | {d} | {a} | |"
                )
            else:
                gap = _finite(m.max_gap(mode))
                d, a = m.drafts(mode)
                lines.append(
                    f"| {_label(m)} | {mode} | {m.count('identical', mode)} | "
                    f"{m.count('within', mode)} | {m.count('over-envelope', mode)} | {gap} | "
                    f"{d} | {a} | |"
                )
    if report.server:
        lines += [
            "",
            f"Plain server: `{' '.join(report.server)}`; each method adds its arguments:",
            "",
            *(
                f"- {_label(m)}: `{' '.join(m.argv) or '(none)'}`"
                + (" (without the determinism flags)" if m.flags == "own" else "")
                for m in report.methods
                if not m.skipped
            ),
        ]
    own = own_flags_lines(report)
    if own:
        lines += ["", "## Recipe's own flags vs determinism flags", "", *own]
    for m in report.methods:
        who = _under_test(m.method)
        for c in m.cases:
            if c.kind in ("identical", "within"):
                continue
            lines += [
                "",
                f"## {_label(m)} / {c.prompt} ({c.mode}): {c.kind} at token {c.position}",
                "",
            ]
            if c.defect:
                lines.append(f"- known defect: {c.defect}")
            if c.note:
                lines.append(f"- {c.note}")
            lines += [f"- reference: `{c.reference}`", f"- {who}: `{c.speculative}`"]
            if c.max_gap is not None:
                lines.append(f"- largest per-token gap of the {who} output: {_finite(c.max_gap)}")
            lines += [f"- {o}" for o in c.over]
    lines += [
        "",
        f"Result: {'PASSED' if report.passed else 'FAILED'} in {report.wall_seconds:.0f}s.",
    ]
    return "\n".join(lines) + "\n"


def flags_lines(report: VerifyReport) -> list[str]:
    """Which server flags the report's claim holds under (nothing where not recorded)."""
    det = report.determinism
    if det is None:
        return []
    if not det:
        return [
            "",
            "Server defaults, no determinism flags (`--server-defaults`): exactness is not "
            "claimed here; a difference measures what the defaults change, with its gaps.",
        ]
    flags = f"`{' '.join(det)}`"
    if report.tier == "strict":
        text = (
            f"Exact under the determinism flags {flags}, which every server of this run uses "
            "(one KV cache per slot, flash attention off); with the server's defaults "
            "exactness is not claimed."
        )
    else:
        text = f"Reference, envelope and oracle run under the determinism flags {flags}" + (
            "; the rows under the recipe's own flags run without them."
            if any(m.flags == "own" for m in report.methods)
            else "."
        )
    return ["", text]


def own_flags_lines(report: VerifyReport) -> list[str]:
    """What the recipe's own flags changed against the same reference and envelope."""
    s = own_flags_summary(report)
    if s is None:
        return []
    det = " ".join(report.determinism or []) or "the determinism flags"
    if s["verdict"] == "failed":
        verdict = (
            "FAILED: under its own flags the recipe emits tokens the oracle puts over the "
            "envelope (details below)."
        )
    elif s["within_envelope"]:
        verdict = (
            "Passed: what the defaults change stays within the envelope, the numerics of "
            "other kernel shapes, not a failure."
        )
    else:
        verdict = "Passed: the defaults changed no output here."
    return [
        f"Under the determinism flags (`{det}`) the recipe ran as the strict tier needs it to "
        "be exact. Under the recipe's own flags it ran the way `serve` runs it: the "
        "server's defaults for the rest, no determinism flags. Against the same reference "
        "and envelope "
        f"({s['envelope']} nats): {s['identical']} of {s['outputs']} outputs identical, "
        f"{s['within_envelope']} within the envelope, {s['over_envelope']} over it"
        + (f", {s['other_failures']} cut short or failed otherwise" if s["other_failures"] else "")
        + f"; the largest per-token gap {s['max_gap']} nats.",
        "",
        verdict,
    ]


def print_table(report: VerifyReport, console: Console) -> None:
    table = Table(title=f"verify ({report.tier}): {report.artifact_id} ({report.model})")
    own = any(m.flags == "own" for m in report.methods)
    cols = ["method", *(["flags"] if own else []), "mode", "identical"]
    cols += ["failed", "known defect"] if report.tier == "strict" else ["within", "over", "max gap"]
    for col in (*cols, "drafted", "accepted", "note"):
        table.add_column(col)
    for m in report.methods:
        first = [m.method, *([m.flags] if own else [])]
        if m.skipped:
            table.add_row(*first, "–", *[""] * (len(cols) - len(first) - 1), "", "", m.skipped)
            continue
        for mode in ("sequential", "parallel"):
            if not any(c.mode == mode for c in m.cases):
                continue
            if report.tier == "strict":
                extra = [
                    str(sum(1 for c in m.failures if c.mode == mode)),
                    str(m.count("known-defect", mode)),
                ]
            else:
                extra = [
                    str(m.count("within", mode)),
                    str(m.count("over-envelope", mode)),
                    str(_finite(m.max_gap(mode))),
                ]
            table.add_row(
                *first,
                mode,
                str(m.count("identical", mode)),
                *extra,
                *map(str, m.drafts(mode)),
                "",
            )
    console.print(table)
    for line in (*flags_lines(report), *own_flags_lines(report)):
        console.print(f"  {line}" if line else "", markup=False)
    for m in report.methods:
        who = _under_test(m.method)
        for c in m.cases:
            if c.kind not in ("identical", "within"):
                console.print(
                    f"  {_label(m)}/{c.prompt} ({c.mode}): {c.kind} at token {c.position}"
                    + (f" — {c.defect}" if c.defect else "")
                )
                if c.note:
                    console.print(f"    {c.note}")
                if c.kind != "known-defect":
                    console.print(f"    reference: {c.reference}\n    {who}: {c.speculative}")
    console.print(f"verify: {'PASSED' if report.passed else 'FAILED'} ({report.wall_seconds:.0f}s)")
