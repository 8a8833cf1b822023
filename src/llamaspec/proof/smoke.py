"""Smoke stage: a built server must speculate (drafts accepted) and change nothing but speed.

The gate is the strict tier's fast form on the reference copy of the embedded model in F32
(proof.reference): one prompt with the model drafting for itself, one code-copy prompt with
the draft-free `ngram-mod` where the binary has it; each must be token-identical to plain
decoding. An output that stops early fails, unless the engine pin has that defect on record
(proof.defects) and the output shows exactly its symptom, in which case the smoke names it.
The quantized model's comparison is kept as information: where it differs, the reference's
own log-probabilities at the first differing token say how close the two choices were.

The speculation gate (runtime.specgate) reads the speculative server's counters after its
requests: a loaded draft or MTP head that drafted nothing fails the smoke with its message.
`spec_args` (`llamaspec smoke --spec-args`) replaces the smoke's own speculation flags.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from llamaspec import env
from llamaspec.engine import backends
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.methods import determinism_args, offers, render_method
from llamaspec.models.server_help import check_help, help_flags
from llamaspec.proof import compare
from llamaspec.proof.defects import defects_for, known_defect
from llamaspec.proof.prompts import CODE, PROSE
from llamaspec.proof.software import software_device
from llamaspec.proof.verify_report import Case
from llamaspec.runtime import metrics, specgate
from llamaspec.runtime.client import (
    TOP_K,
    Completion,
    Prompt,
    Server,
    Token,
    base_args,
    complete,
    log_acceptance,
    running,
    server_help,
    tail,
    top_logprobs_at,
)

__all__ = [
    "SMOKE_PROMPTS",
    "Completion",
    "Prompt",
    "SmokeReport",
    "base_args",
    "classify",
    "complete",
    "divergence",
    "log_acceptance",
    "smoke",
    "smoke_artifact",
    "top_logprobs_at",
]

# Information only (the quantized model): a differing token is called a near-tie when the
# reference ranked it within this many nats of its own choice. The pass/fail decision is
# the strict comparison on the F32 reference, which needs no margin.
NEAR_TIE_MARGIN_NATS = 0.5

Kind = Literal["identical", "near-tie", "short", "hard"]

SMOKE_PROMPTS: tuple[Prompt, ...] = (CODE, PROSE)
CHAT_TOKENS = 32  # the OpenAI chat check
REWRITE = Prompt(
    "rewrite/ngram-mod",
    "Copy this code exactly, then stop.\n\n```python\ndef add(a, b):\n    return a + b\n\n\n"
    "def sub(a, b):\n    return a - b\n```\n\n```python\n",
    48,
)


@dataclass(frozen=True)
class Verdict:
    """How a quantized speculative output compares with the reference (information)."""

    kind: Kind
    position: int | None = None
    delta_nats: float | None = None
    margin: float = NEAR_TIE_MARGIN_NATS
    reference: str = ""
    speculative: str = ""

    def describe(self) -> str:
        if self.kind == "identical":
            return "identical"
        if self.kind == "short":
            return f"stopped early after {self.position} tokens"
        if self.kind == "near-tie":
            return f"differs at token {self.position} (Δ={self.delta_nats:.3f} nats)"
        delta = (
            f"not in the reference's top-{TOP_K}"
            if self.delta_nats is None
            else f"Δ={self.delta_nats:.3f} nats"
        )
        return f"differs at token {self.position} ({delta})"


@dataclass(frozen=True)
class PromptResult:
    prompt: str
    reference: Completion
    speculative: Completion
    verdict: Verdict


@dataclass(frozen=True)
class StrictResult:
    """One prompt of the strict fast form on the F32 reference."""

    prompt: str
    method: str
    case: Case
    drafted: int
    accepted: int


@dataclass(frozen=True)
class SmokeReport:
    """What the smoke found, built once it is over; `to_json()` is smoke.json."""

    artifact_id: str
    method: str
    spec_args: tuple[str, ...]
    results: tuple[PromptResult, ...] = ()
    strict: tuple[StrictResult, ...] = ()
    reference_sha256: str | None = None
    # The F32 comparison gates the smoke on CPU builds, where F32 decoding is measured to be
    # batch-invariant; on GPU backends (CUDA, Vulkan) that is not established yet, so there
    # it is reported, and `verify --tier strict` is the gate.
    strict_gates: bool = True
    # Why the F32 comparison did not run where it is information only (a software device).
    strict_skipped: str | None = None
    wall_seconds: float = 0.0
    chat_drafted: int = 0  # from the streamed chat request, where /completion has no stats
    chat_accepted: int = 0
    gate: specgate.Verdict | None = None  # the speculation gate on the speculative server

    @property
    def drafted(self) -> int:
        own = sum(r.speculative.draft_n or 0 for r in self.results)
        own += sum(s.drafted for s in self.strict)
        return own or self.chat_drafted

    @property
    def accepted(self) -> int:
        own = sum(r.speculative.draft_accepted or 0 for r in self.results)
        own += sum(s.accepted for s in self.strict)
        return own or self.chat_accepted

    @property
    def strict_failures(self) -> list[StrictResult]:
        return [s for s in self.strict if s.case.kind not in ("identical", "known-defect")]

    @property
    def passed(self) -> bool:
        if self.gate is not None and self.gate.failed:
            return False
        if not self.strict_gates:
            return self.accepted > 0 and (bool(self.strict) or bool(self.strict_skipped))
        return self.accepted > 0 and bool(self.strict) and not self.strict_failures

    def to_json(self) -> dict:
        return {
            "artifact_id": self.artifact_id,
            "method": self.method,
            "spec_args": list(self.spec_args),
            "passed": self.passed,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "wall_seconds": round(self.wall_seconds, 1),
            "reference_sha256": self.reference_sha256,
            "strict_gates": self.strict_gates,
            "strict_skipped": self.strict_skipped,
            "gate": self.gate.to_json() if self.gate is not None else None,
            "strict": [asdict(s) for s in self.strict],
            "information": {"near_tie_margin_nats": NEAR_TIE_MARGIN_NATS},
            "results": [asdict(r) for r in self.results],
        }


# --- the quantized comparison (information) -------------------------------------------


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _text_mode(ref: Completion) -> bool:
    return bool(ref.tokens) and isinstance(ref.tokens[0], str)


def _piece_at(ref: Completion, offset: int) -> tuple[int, int]:
    """(index, start offset) of the reference token covering character `offset`."""
    start = 0
    for k, piece in enumerate(ref.tokens):
        if start + len(str(piece)) > offset:
            return k, start
        start += len(str(piece))
    return len(ref.tokens), start


def divergence(ref: Completion, spec: Completion) -> int | None:
    """Index of the first reference token the speculative run did not reproduce.

    Servers without token ids (text mode) are compared by text and mapped back onto the
    reference's per-token pieces."""
    if not _text_mode(ref):
        return compare.first_difference(ref.tokens, spec.tokens)
    if ref.text == spec.text:
        return None
    offset = _common_prefix(ref.text, spec.text)
    return _piece_at(ref, offset)[0]


def classify(
    ref: Completion,
    spec: Completion,
    top: tuple[Token, dict[Token, float]] | None,
    margin: float = NEAR_TIE_MARGIN_NATS,
) -> Verdict:
    """Identical, a near-tie inside the margin, an early stop, or a difference beyond it."""
    pos = divergence(ref, spec)
    if pos is None:
        return Verdict("identical")
    if _text_mode(ref):
        start = _piece_at(ref, _common_prefix(ref.text, spec.text))[1]
        rest = spec.text[start:]
        if not rest:
            return Verdict("short", pos, margin=margin, reference=f"{len(ref.tokens)} tokens")
        if pos >= len(ref.tokens):
            return Verdict("hard", pos, margin=margin, reference=f"stopped after {pos} tokens")
        ref_tok: Token = ref.tokens[pos]
        options = [t for t in (top[1] if top else {}) if isinstance(t, str) and t != ref_tok]
        matches = sorted((t for t in options if t and rest.startswith(t)), key=len)
        spec_tok: Token = matches[-1] if matches else rest[: len(str(ref_tok))]
    else:
        if pos == len(spec.tokens):
            return Verdict("short", pos, margin=margin, reference=f"{len(ref.tokens)} tokens")
        if pos >= len(ref.tokens):
            return Verdict("hard", pos, margin=margin, reference=f"stopped after {pos} tokens")
        ref_tok, spec_tok = ref.tokens[pos], spec.tokens[pos]
    delta = None
    if top is not None:
        chosen, logprobs = top
        if chosen == ref_tok and ref_tok in logprobs and spec_tok in logprobs:
            delta = logprobs[ref_tok] - logprobs[spec_tok]
    kind: Kind = "near-tie" if delta is not None and delta <= margin else "hard"
    return Verdict(kind, pos, delta, margin)


def _compare_quantized(ref_srv: Server, prompt: Prompt, r: Completion, s: Completion) -> Verdict:
    pos = divergence(r, s)
    top = top_logprobs_at(ref_srv, prompt, pos) if pos is not None and pos < len(r.tokens) else None
    return classify(r, s, top)


# --- the smoke ------------------------------------------------------------------------


def smoke(
    artifact: Artifact,
    dialect: str,
    model: Path,
    out_dir: Path,
    console: Console,
    prompts: Sequence[Prompt] = SMOKE_PROMPTS,
    n_max: int = 8,
    reference: Path | None = None,
    reference_sha256: str | None = None,
    strict_n_predict: int | None = None,
    strict_skipped: str | None = None,
    chat_tokens: int = CHAT_TOKENS,
    spec_args: Sequence[str] | None = None,
) -> SmokeReport:
    """Strict fast form on `reference` (F32) and the quantized comparison; write smoke.json.
    `strict_skipped` says why a non-gating F32 comparison is left out (no `reference`).
    `spec_args`: speculation flags instead of the smoke's own (`model` drafting for itself)."""
    t0 = time.monotonic()
    # p_min 0: draft whatever the draft model ranks first (older servers default to 0.9,
    # which with a 270M self-draft drafts almost nothing)
    settings = dialects.SpecSettings("draft", draft_model=model, n_max=n_max, p_min=0.0)
    spec = list(spec_args) if spec_args is not None else dialects.spec_args(dialect, settings)
    help_text = server_help(artifact.server)
    check_help(spec, help_text, str(artifact.server))
    strict_gates = backends.backend(artifact.manifest.get("backend")).batch_invariant_f32
    logs = out_dir / "logs"
    sp_args = [*base_args(model), *spec, *metrics.flag(spec, help_flags(help_text))]
    with running(artifact.server, base_args(model), logs / "reference.log") as ref_srv:
        refs = [complete(ref_srv, p) for p in prompts]
        with running(artifact.server, sp_args, logs / "speculative.log") as sp:
            before = metrics.read(sp.url)
            specs = [complete(sp, p) for p in prompts]
            chat_stats = _openai_check(sp, console, chat_tokens)
            after = metrics.read(sp.url)
        gate = specgate.judge_replies(sp_args, before, after, specs, dialect, chat_stats)
        console.print(f"smoke: speculation gate: {gate.message}", markup=False)
        if gate.failed:  # nothing else the smoke finds changes the verdict
            reference = None
        results = tuple(
            PromptResult(p.name, r, s, _compare_quantized(ref_srv, p, r, s))
            for p, r, s in zip(prompts, refs, specs, strict=True)
        )
    # the chat's counts stand in only where the quantized runs report no drafts
    drafted = sum(r.speculative.draft_n or 0 for r in results)
    chat_drafted, chat_accepted = chat_stats if chat_stats and drafted == 0 else (0, 0)
    strict: tuple[StrictResult, ...] = ()
    if reference is not None:
        strict = tuple(
            _strict(artifact, dialect, reference, help_text, logs, n_max, console, strict_n_predict)
        )
    report = SmokeReport(
        artifact.id,
        "draft" if spec_args is None else "custom",
        tuple(spec),
        results,
        strict,
        reference_sha256=reference_sha256,
        strict_gates=strict_gates,
        strict_skipped=strict_skipped if reference is None and not strict_gates else None,
        wall_seconds=time.monotonic() - t0,
        chat_drafted=chat_drafted,
        chat_accepted=chat_accepted,
        gate=gate,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "smoke.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    print_report(report, console)
    for d in defects_for(artifact.manifest):  # what the embedded model cannot show, too
        console.print(f"smoke: this build has a {d.describe()}")
    if not report.passed:
        raise LlamaspecError(
            f"Smoke test failed: {_why(report)}. Report: {out_dir / 'smoke.json'}. Speculative "
            f"command: {' '.join(map(str, [artifact.server, *base_args(model), *spec]))}",
            details=f"Last 40 lines of {logs / 'speculative.log'}:\n"
            + tail(logs / "speculative.log"),
        )
    return report


def _why(report: SmokeReport) -> str:
    if report.gate is not None and report.gate.failed:
        return report.gate.message
    if not report.strict and not report.strict_skipped:
        return "no strict comparison ran (no reference model)"
    if report.strict_failures:
        s = report.strict_failures[0]
        return (
            f"on the F32 reference, {s.method} changed the output of prompt {s.prompt!r} "
            f"({s.case.kind} at token {s.case.position}"
            + (f", {s.case.note}" if s.case.note else "")
            + f": reference {s.case.reference!r}, speculative {s.case.speculative!r})"
        )
    return "the speculative runs accepted no draft tokens (speculation did not engage)"


def _strict(
    artifact: Artifact,
    dialect: str,
    reference: Path,
    help_text: str,
    logs: Path,
    n_max: int,
    console: Console,
    n_predict: int | None = None,
) -> list[StrictResult]:
    """One draft prompt and one ngram-mod prompt on the F32 reference: token-identical."""
    defect = known_defect(artifact.manifest, "short-output")
    runs = [
        (
            "draft",
            CODE,
            dialects.spec_args(
                dialect, dialects.SpecSettings("draft", reference, n_max=n_max, p_min=0.0)
            ),
        )
    ]
    if offers(help_text, "ngram-mod"):
        argv = render_method(dialect, help_text, ("ngram-mod",), {}, reference)
        runs.append(("ngram-mod", REWRITE, argv))
    if n_predict is not None:
        runs = [(m, replace(p, n_predict=min(p.n_predict, n_predict)), a) for m, p, a in runs]
    base = [*base_args(reference), *determinism_args(help_text)]
    out = []
    with running(artifact.server, base, logs / "strict-reference.log") as ref:
        for method, prompt, argv in runs:
            check_help(argv, help_text, str(artifact.server))
            r = complete(ref, prompt)
            log = logs / f"strict-{method}.log"
            with running(artifact.server, [*base, *argv], log) as srv:
                s = complete(srv, prompt)
            case = compare.compare(prompt, "sequential", r, s, ref, defect)
            out.append(
                StrictResult(prompt.name, method, case, s.draft_n or 0, s.draft_accepted or 0)
            )
            console.print(f"smoke: strict (F32 reference): {method}/{prompt.name}: {case.kind}")
    return out


def _openai_check(server: Server, console: Console, max_tokens: int) -> tuple[int, int] | None:
    """A streamed greedy chat request through the OpenAI client, with speculation on.

    Returns (drafted, accepted) when the stream reports them (`timings_per_token`): servers
    of the ik_llama.cpp port era report draft statistics only there."""
    text, timings = server.chat_stream("Name three primary colours.", max_tokens)
    if not text:
        raise server.failure("/v1/chat/completions returned no content")
    console.print(f"smoke: OpenAI chat endpoint ok ({len(text)} characters streamed)")
    if timings.get("draft_n"):
        return int(timings["draft_n"]), int(timings.get("draft_n_accepted", 0))
    return None


def print_report(report: SmokeReport, console: Console) -> None:
    if report.strict_skipped:
        console.print(f"smoke: strict (F32 reference): not run: {report.strict_skipped}")
    if report.strict:
        table = Table(title=f"smoke: {report.artifact_id}: strict tier on the F32 reference")
        for col in ("method", "prompt", "drafted", "accepted", "equivalence"):
            table.add_column(col)
        for s in report.strict:
            what = (
                s.case.kind
                if s.case.kind == "identical"
                else (f"{s.case.kind} at token {s.case.position}")
            )
            table.add_row(s.method, s.prompt, str(s.drafted), str(s.accepted), what)
        console.print(table)
    # no speed columns: the default pair drafts for itself (it checks the plumbing and cannot
    # be faster) and a few short runs are no measurement; `bench` measures speed (issue 55)
    table = Table(
        title=f"smoke: {report.artifact_id} ({report.method}, quantized model: checks the "
        "plumbing, not the speed)"
    )
    for col in ("prompt", "drafted", "accepted", "comparison"):
        table.add_column(col)
    for r in report.results:
        table.add_row(
            r.prompt,
            str(r.speculative.draft_n or 0),
            str(r.speculative.draft_accepted or 0),
            r.verdict.describe(),
        )
    console.print(table)
    if report.strict_failures and not report.strict_gates:
        console.print(
            "information: on this GPU backend the F32 comparison differs; batch invariance of "
            "F32 decoding is established on the CPU backend only, so the smoke reports it and "
            "`llamaspec verify --tier strict` judges it"
        )
    for s in report.strict:
        console.print(f"equivalence: {s.method}/{s.prompt}: {s.case.kind}")
        if s.case.defect:
            console.print(f"  {s.case.defect}")
        elif s.case.kind != "identical":
            if s.case.note:
                console.print(f"  {s.case.note}")
            console.print(f"  reference:   {s.case.reference}\n  speculative: {s.case.speculative}")
    for r in report.results:
        console.print(f"information (quantized): {r.prompt}: {r.verdict.describe()}")
    rate = f"{report.accepted / report.drafted:.0%}" if report.drafted else "n/a"
    console.print(
        f"smoke: {'PASSED' if report.passed else 'FAILED'} — acceptance {report.accepted}/"
        f"{report.drafted} ({rate}), wall {report.wall_seconds:.1f}s"
    )
    console.print(
        "smoke: speed is not measured here; `llamaspec bench RECIPE` measures it (for the "
        "embedded model: `llamaspec bench gemma3-270m-ngram-tuned`)"
    )


# Lavapipe runs shaders on the CPU and compiles each pipeline on first use (minutes on
# small machines): the Vulkan smoke asks for fewer tokens and leaves flash attention (the
# largest shader) off; each setting applies only when the environment does not set it.
VULKAN_N_PREDICT = 32
# On a software device (lavapipe) the speculative server compiles pipelines for every new
# verification batch shape (7 s a token at draft length 8 on a cold cache): one code prompt
# (self-drafting accepts most there), 16 tokens, drafts of 2, an 8-token chat.
SOFTWARE_PROMPTS: tuple[Prompt, ...] = (CODE,)
SOFTWARE_N_PREDICT = 16
SOFTWARE_N_MAX = 2
SOFTWARE_CHAT_TOKENS = 8
VULKAN_SMOKE_ENV = (
    ("GGML_VK_VISIBLE_DEVICES", "0", "Vulkan device 0; ggml-vulkan hides lavapipe otherwise"),
    ("LLAMA_ARG_FLASH_ATTN", "off", "no flash-attention pipeline to compile"),
    (env.SERVER_READY_TIMEOUT.name, "3600", "a cold lavapipe start compiles pipelines"),
)


# In `--spec-args`, this stands for the embedded model's path (a draft for itself).
MODEL_PLACEHOLDER = "{model}"
SPEC_ARGS_FIX = "Give --spec-args flags this build's llama-server --help lists."


def smoke_artifact(
    artifact: Artifact,
    console: Console,
    root: Path | None = None,
    spec_args: Sequence[str] | None = None,
    out_dir: Path | None = None,
) -> SmokeReport:
    """The smoke test of a built artifact with the embedded model (what `build` runs last).
    `spec_args`: speculation flags instead of the smoke's own (`{model}`: the embedded
    model); `out_dir`: where smoke.json and the logs go (default: the artifact's folder)."""
    import os

    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.embedded import EMBEDDED_SHA256, embedded_model
    from llamaspec.proof.reference import reference_copy

    if not artifact.server.is_file():  # before the models are prepared
        raise LlamaspecError(
            f"Artifact {artifact.id} has no {artifact.server.relative_to(artifact.path)} (an "
            f"unfinished build or copy in {artifact.path.parent}); build it again."
        )
    model = embedded_model(console.print)
    if spec_args is not None:
        spec_args = [a.replace(MODEL_PLACEHOLDER, str(model)) for a in spec_args]
        check_help(spec_args, server_help(artifact.server), str(artifact.server), SPEC_ARGS_FIX)
        console.print(f"smoke: speculation arguments given: {' '.join(spec_args)}")
    prompts, strict_n, skipped = SMOKE_PROMPTS, None, None
    n_max, chat_tokens = 8, CHAT_TOKENS
    if backends.backend(artifact.manifest.get("backend")).compiles_pipelines:
        prompts = tuple(replace(p, n_predict=VULKAN_N_PREDICT) for p in prompts)
        strict_n = VULKAN_N_PREDICT
        for name, value, why in VULKAN_SMOKE_ENV:
            if name not in os.environ:
                os.environ[name] = value
                console.print(f"smoke: {name}={value} ({why})")
        device = software_device(artifact)
        if device:
            prompts = tuple(replace(p, n_predict=SOFTWARE_N_PREDICT) for p in SOFTWARE_PROMPTS)
            n_max, chat_tokens = SOFTWARE_N_MAX, SOFTWARE_CHAT_TOKENS
            console.print(
                f"smoke: the only device is a software one ({device}): one prompt of "
                f"{SOFTWARE_N_PREDICT} tokens, draft length {n_max}, a {chat_tokens}-token chat "
                "(each new batch shape compiles pipelines there: the fewest that still draft "
                "and accept)"
            )
        if device and not env.get(env.SMOKE_STRICT_ON_SOFTWARE):
            skipped = (
                f"the only device is a software one ({device}), where the F32 comparison "
                f"reports and does not gate, and costs minutes of shader compiles; set "
                f"{env.SMOKE_STRICT_ON_SOFTWARE.name}=1 to run it"
            )
    ref = None if skipped else reference_copy(model, EMBEDDED_SHA256, console.print)
    dialect = dialect_for(artifact, console.print, root)
    return smoke(
        artifact,
        dialect,
        model,
        out_dir or artifact.path,
        console,
        prompts,
        reference=ref.path if ref else None,
        reference_sha256=ref.sha256 if ref else None,
        strict_n_predict=strict_n,
        strict_skipped=skipped,
        n_max=n_max,
        chat_tokens=chat_tokens,
        spec_args=spec_args,
    )
