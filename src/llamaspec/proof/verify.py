"""Equivalence suite: speculation must change nothing but speed.

Two tiers, for every speculative method the binary supports, sequentially and on
parallel slots:

- **strict**, on a reference copy of the model in F32 (proof.reference): greedy output with
  speculation must be token-identical to output without it. There is no threshold: a
  difference, or an output that stops early, fails, reported with both continuations and
  the per-token gaps of the speculative output.
- **oracle**, for quantized and users' models: every emitted token is judged by a plain
  server's log-probabilities given exactly the emitted prefix (proof.oracle). The envelope
  belongs to a prompt and a mode: the plain output's own largest gap for that prompt under
  the configurations that change only kernel shapes and calibrate that mode (one request at
  a time: micro-batches, flash attention; the parallel mode adds parallel slots); a
  speculative token whose gap exceeds
  it fails, unless it is a near-tie: its gap within its prompt's measured noise (how far
  a first choice's gap moves between decoding the prefix one token at a time and the
  oracle's batched evaluation of it, proof.envelope.noise).

This module runs them (`verify`, given a `VerifyPlan`); the methods a build offers come
from models.methods, the built-in prompts from proof.prompts, and the report it returns
and writes is proof.verify_report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models.methods import (
    EMBEDDED_TYPES,
    Method,
    choose_methods,
    determinism_args,
    methods_for,
    takes_fa_value,
)
from llamaspec.models.server_help import check_help
from llamaspec.proof import oracle as oracle_mod
from llamaspec.proof import traffic as traffic_mod
from llamaspec.proof.compare import Judge, compare
from llamaspec.proof.defects import known_defect
from llamaspec.proof.envelope import calibrate, judge_gaps, measured_noise, with_noise
from llamaspec.proof.prompts import FAST_PROMPTS, VERIFY_PROMPTS
from llamaspec.proof.traffic import TrafficPlan
from llamaspec.proof.verify_report import (
    Case,
    Envelope,
    EnvelopeFailure,
    MethodResult,
    VerifyReport,
    print_table,
    write,
)
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
SLOT_CTX = traffic_mod.SLOT_CTX  # each slot's context: prompt and generated tokens must fit
Say = Callable[[str], None]


def shown(args: Sequence[str]) -> list[str]:
    """Server arguments as a report shows them: files by their name only."""
    return [Path(a).name if Path(a).is_file() else a for a in args]


def run_prompts(server: Server, prompts: Sequence[Prompt], parallel: bool) -> list[Completion]:
    if not parallel:
        return [complete(server, p) for p in prompts]
    with ThreadPoolExecutor(max_workers=PARALLEL_SLOTS) as pool:
        return list(pool.map(lambda p: complete(server, p), prompts))


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
    traffic: TrafficPlan | None = None  # the strict tier's traffic mode, when asked for

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
        trefs = None
        if setup.traffic is not None and "traffic" in modes:
            console.print("verify: strict: reference run of the traffic prompts")
            trefs = traffic_mod.references(ref, setup.prompts)
        orc: oracle_mod.Oracle | None = None

        def judge(case: Case, p: Prompt, s: Completion) -> Case:
            """A failure gets the per-token gaps of the speculative output."""
            nonlocal orc
            if case.kind not in ("different", "longer", "short"):
                return case
            if orc is None:  # a plain one-slot server, only when needed
                orc = oracle_mod.Oracle(stack.enter_context(oracle_server(artifact, setup, logs)))
            gaps = _gaps(orc, p, s)
            return replace(
                case,
                max_gap=oracle_mod.max_gap(gaps) if gaps else None,
                over=[oracle_mod.describe(g) for g in gaps if g.gap > 0][:8],
            )

        results = _sweep(artifact, setup, methods, modes, logs, console, ref, refs, judge)
        if trefs is None or setup.traffic is None:
            return results
        return [
            traffic_mod.method(
                artifact,
                setup.base,
                setup.target,
                setup.traffic,
                r,
                m,
                logs,
                console,
                ref,
                trefs,
                judge,
            )
            for r, m in zip(results, methods, strict=True)
        ]


def _sweep(
    artifact: Artifact,
    setup: Setup,
    methods: Sequence[Method | str],
    modes: Sequence[str],
    logs: Path,
    console: Console,
    ref: Server,
    refs: Sequence[Completion],
    judge: Judge,
) -> list[MethodResult]:
    """Every method in every mode, each output compared with the reference's output for its
    prompt (`refs`, from `ref`) and then judged by the tier; skipped methods are recorded."""
    defect = known_defect(artifact.manifest, "short-output")
    results: list[MethodResult] = []
    for m in methods:
        if isinstance(m, str):
            name, why = m.split(": ", 1)
            results.append(MethodResult(name, (), skipped=why))
            continue
        classic = [mode for mode in modes if mode != "traffic"]
        if modes and not classic:  # the traffic mode alone
            results.append(MethodResult(m.name, tuple(shown(m.argv))))
            continue
        result, outputs = _run_method(artifact, setup, m, classic, logs, console)
        cases: list[Case] = []
        for mode, outs in outputs.items():
            for (p, k), s in zip(setup.cycle(len(outs)), outs, strict=True):
                cases.append(judge(compare(p, mode, refs[k], s, ref, defect), p, s))
        results.append(replace(result, cases=tuple(cases)))
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


def _one_slot(setup: Setup, ctx: int) -> tuple[str, ...]:
    """`setup`'s server arguments for one slot of `ctx` tokens (its determinism flags kept)."""
    own = base_args(setup.target, ctx=ctx, slots=1)
    return (*own, *setup.base[len(own) :])


def oracle_server(artifact: Artifact, setup: Setup, logs: Path):
    """A plain one-slot server for per-token checks (prompt cache on)."""
    return running(artifact.server, list(_one_slot(setup, 8192)), logs / "oracle.log")


# ik_llama.cpp from mid-2026 (8337e4c) refuses a speculative server with -np > 1 at start.
ONE_SLOT_REFUSAL = "limited to a single server slot"


def _run_method(
    artifact: Artifact,
    setup: Setup,
    m: Method,
    modes: Sequence[str],
    logs: Path,
    console: Console,
) -> tuple[MethodResult, dict[str, list[Completion]]]:
    """Run one method's server: its result (draft counts, no cases yet) and, per mode, one
    output per prompt. A build that refuses speculation on more than one slot runs the
    sequential mode on a one-slot server, and its result says the parallel mode was not run."""
    log = logs / f"{m.name}{'' if setup.determinism else '-server-defaults'}.log"
    try:
        return _serve_method(artifact, setup, m, modes, log, console)
    except LlamaspecError:
        if not log.is_file() or ONE_SLOT_REFUSAL not in log.read_text(errors="replace"):
            raise
    console.print(
        f"verify: {m.name}: this build refuses speculation on more than one slot; "
        "sequential on one slot, parallel mode not run"
    )
    if modes and "sequential" not in modes:  # only the parallel mode was asked for
        return MethodResult(m.name, tuple(shown(m.argv)), one_slot=True), {}
    one = replace(setup, base=_one_slot(setup, SLOT_CTX))
    result, outputs = _serve_method(artifact, one, m, ["sequential"], log, console)
    return replace(result, one_slot=True), outputs


def _serve_method(
    artifact: Artifact,
    setup: Setup,
    m: Method,
    modes: Sequence[str],
    log: Path,
    console: Console,
) -> tuple[MethodResult, dict[str, list[Completion]]]:
    """One server for `m`: per mode, one output per prompt (the parallel mode repeated
    `setup.repeat` times, prompts in the same order each time)."""
    outputs: dict[str, list[Completion]] = {}
    per_mode: dict[str, tuple[int, int]] = {}
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
            per_mode[mode] = (drafted, accepted)
            outputs[mode] = outs
    result = MethodResult(
        m.name,
        tuple(shown(m.argv)),
        drafted=sum(d for d, _ in per_mode.values()),
        accepted=sum(a for _, a in per_mode.values()),
        per_mode=per_mode,
    )
    return result, outputs


def measure_envelope(
    artifact: Artifact,
    setup: Setup,
    help_text: str,
    orc: oracle_mod.Oracle,
    logs: Path,
    say: Say,
    own: Setup | None = None,
) -> Envelope:
    """The plain output's own largest gap for each prompt: no speculation, shape-only
    configurations, one request at a time (the sequential mode's envelope) and on parallel
    slots (the parallel mode's); with `own` (a recipe's own flags), also the plain server
    under those flags, both ways, so what the defaults change without speculation is inside."""
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
    worst: dict[str, dict[str, float]] = {}
    failures: list[EnvelopeFailure] = []
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
            failures.append(EnvelopeFailure(name, first, log.name))
            continue
        worst[name] = {
            p.name: oracle_mod.max_gap(_gaps(orc, p, o))
            for p, o in zip(setup.prompts, outs, strict=True)
        }
    modes = [(c[0], "parallel" if c[2] else "sequential") for c in configs]
    return calibrate(modes, worst, failures)


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
    with oracle_server(artifact, setup, logs) as osrv:
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

        def judge(case: Case, p: Prompt, s: Completion) -> Case:
            allowance = env.allowance(p.name, case.mode)
            near_tie = env.near_tie_for(p.name)
            return judge_gaps(case, _gaps(orc, p, s), allowance, near_tie, orc.text)

        with running(artifact.server, list(setup.base), logs / "reference.log") as ref:
            refs = run_prompts(ref, setup.prompts, parallel=False)
            env = with_noise(env, measured_noise(orc, ref, setup.prompts))
            console.print(
                f"verify: oracle: envelope per prompt and mode, largest {env.max_gap:.3f} nats "
                f"{env.by_config}; near-ties within each prompt's measured noise, up to "
                f"{env.near_tie:.3f} nats {dict(env.noise)}"
            )
            results = _sweep(artifact, setup, methods, modes, logs, console, ref, refs, judge)
            if own is not None:
                console.print(
                    f"verify: {own.name}: its own flags (no {' '.join(setup.determinism)})"
                )
                defaults = setup.server_defaults()
                mine = _sweep(artifact, defaults, [own], modes, logs, console, ref, refs, judge)
                results += [replace(r, flags="own") for r in mine]
        return results, env, orc.requests


@dataclass(frozen=True)
class VerifyPlan:
    """One verify run: the model it serves and the tier, what it sweeps, and where its
    report goes (`out_dir`).

    `spec` replaces the method sweep with one configuration (a recipe's settings, under the
    determinism flags); `own` (oracle tier) adds that recipe under its own flags, judged in
    the oracle's terms. `server_defaults` drops the determinism flags from every server: a
    measurement of what the defaults change, where exactness is not claimed."""

    model: Path
    out_dir: Path
    tier: str = "strict"  # or "oracle"
    prompts: tuple[Prompt, ...] = VERIFY_PROMPTS
    methods: tuple[str, ...] | None = None  # by name; None: every method the binary offers
    types: tuple[str, ...] = EMBEDDED_TYPES  # the spec types the model can exercise
    tag: str = "embedded"
    draft: Path | None = None  # None: no draft file (the target's own heads, or n-grams)
    modes: tuple[str, ...] = ()  # sequential, parallel, traffic; (): the first two
    spec: Method | None = None
    reference_sha256: str | None = None
    repeat: int = 1  # rounds of the parallel mode
    own: Method | None = None
    server_defaults: bool = False
    traffic: TrafficPlan | None = None  # the traffic mode's plan (None: TrafficPlan())
    spec_extra: tuple[str, ...] = ()  # added to every speculative server (e.g. --spec-busy-max)


def verify(artifact: Artifact, dialect: str, plan: VerifyPlan, console: Console) -> VerifyReport:
    """Run one tier; write verify-<artifact>-<tag>[-oracle].json/.md into `plan.out_dir`."""
    t0 = time.monotonic()
    help_text = server_help(artifact.server)
    det = () if plan.server_defaults else tuple(determinism_args(help_text))
    base = (*base_args(plan.model, ctx=SLOT_CTX * PARALLEL_SLOTS, slots=PARALLEL_SLOTS), *det)
    setup = Setup(
        plan.model,
        plan.draft or plan.model,
        base,
        tuple(plan.prompts),
        plan.repeat,
        det,
        (plan.traffic or TrafficPlan()) if "traffic" in plan.modes else None,
    )
    name = plan.tag if plan.tier == "strict" else f"{plan.tag}-oracle"
    logs = plan.out_dir / f"verify-{artifact.id}-{name}-logs"
    if plan.spec is not None:
        chosen: list[Method | str] = [plan.spec]
    else:
        available = methods_for(dialect, help_text, plan.draft, plan.types)
        chosen = choose_methods(available, plan.methods, artifact.server)
    if plan.spec_extra:
        chosen = [
            replace(m, argv=(*m.argv, *plan.spec_extra)) if isinstance(m, Method) and m.argv else m
            for m in chosen
        ]
    own = plan.own
    for m in [*chosen, *([own] if own and plan.tier == "oracle" else [])]:
        if isinstance(m, Method):
            check_help(list(m.argv), help_text, str(artifact.server))
    env: Envelope | None = None
    requests = 0
    if plan.tier == "strict":
        results = strict(artifact, dialect, setup, chosen, plan.modes, logs, console)
    else:
        results, env, requests = oracle_tier(
            artifact, dialect, setup, chosen, plan.modes, logs, console, help_text, own
        )
    report = VerifyReport(
        artifact.id,
        name,
        plan.tier,
        plan.model.name,
        tuple(results),
        env,
        plan.reference_sha256 if plan.tier == "strict" else None,
        requests,
        wall_seconds=time.monotonic() - t0,
        server=(artifact.server.name, *shown(base)),
        determinism=det,
    )
    write(report, plan.out_dir)
    print_table(report, console)
    return report


@dataclass(frozen=True)
class FastCheck:
    passed: bool
    detail: str


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
    check_help(list(spec_argv), help_text, str(artifact.server))
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
