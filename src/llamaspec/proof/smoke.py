"""Smoke stage: a built server must speculate (drafts accepted) and change nothing but speed.

Greedy outputs with and without speculation are compared token by token. Where they
differ, the reference's own top-k log-probabilities at the first differing position
tell a numeric near-tie (batched vs single-token kernels) from a hard divergence.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from openai import OpenAI
from rich.console import Console
from rich.table import Table

from llamaspec.engine.build import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.proof.client import Server, running, server_help, tail

# A speculative token that differs from the reference's greedy choice counts as a near-tie
# when the reference ranked it within this many nats of its own choice. Measured on the
# embedded Gemma 3 270M Q4_K_M (upstream b11312, 2 CPU cores, 4 prompts): with no
# speculation at all, switching flash attention off flipped tokens whose reference
# log-probabilities were 0.04, 0.10 and 0.37 nats apart; self-drafting with draft batches of
# 4-16 flipped tokens 0.04-0.26 nats apart. 0.5 covers that numeric envelope with a little
# room, while a logic bug (a stale KV cell, a lost token) picks tokens far outside it.
NEAR_TIE_MARGIN_NATS = 0.5
TOP_K = 10
N_PREDICT = 64

Kind = Literal["identical", "near-tie", "short", "hard"]


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    n_predict: int = N_PREDICT


SMOKE_PROMPTS: tuple[Prompt, ...] = (
    Prompt(
        "code",
        "Write a C function that reverses a singly linked list in place. Put a short comment "
        "above every step, then a main() that builds a list of five nodes, reverses it and "
        "prints the values.\n\n```c\n#include <stdio.h>\n#include <stdlib.h>\n",
    ),
    Prompt(
        "prose",
        "The printing press changed how ideas travelled across Europe. Before it, books were "
        "copied by hand, which made them rare and expensive. In a few sentences, explain what "
        "changed for ordinary readers in the fifty years after 1450:\n\n",
    ),
)


@dataclass(frozen=True)
class Completion:
    tokens: tuple[int | str, ...]
    text: str
    predicted_per_second: float
    draft_n: int | None
    draft_accepted: int | None


@dataclass(frozen=True)
class Verdict:
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
            return f"identical prefix, but stopped after {self.position} tokens"
        if self.kind == "near-tie":
            return f"near-tie at token {self.position} (Δ={self.delta_nats:.3f} nats)"
        delta = (
            f"not in the reference's top-{TOP_K}"
            if self.delta_nats is None
            else (f"Δ={self.delta_nats:.3f} nats > {self.margin:.3f}")
        )
        return f"HARD DIVERGENCE at token {self.position} ({delta})"


@dataclass
class PromptResult:
    prompt: str
    reference: Completion
    speculative: Completion
    verdict: Verdict


@dataclass
class SmokeReport:
    artifact_id: str
    method: str
    spec_args: list[str]
    results: list[PromptResult] = field(default_factory=list)
    wall_seconds: float = 0.0
    chat_drafted: int = 0  # from the streamed chat request, where /completion has no stats
    chat_accepted: int = 0

    @property
    def drafted(self) -> int:
        return sum(r.speculative.draft_n or 0 for r in self.results) or self.chat_drafted

    @property
    def accepted(self) -> int:
        return sum(r.speculative.draft_accepted or 0 for r in self.results) or self.chat_accepted

    @property
    def passed(self) -> bool:
        return self.accepted > 0 and all(r.verdict.kind != "hard" for r in self.results)

    def to_json(self) -> dict:
        return {
            "artifact_id": self.artifact_id,
            "method": self.method,
            "spec_args": self.spec_args,
            "near_tie_margin_nats": NEAR_TIE_MARGIN_NATS,
            "passed": self.passed,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "wall_seconds": round(self.wall_seconds, 1),
            "results": [asdict(r) for r in self.results],
        }


def request(prompt: Prompt, n_predict: int | None = None, n_probs: int = 0) -> dict:
    """A greedy, uncached /completion request that returns token ids."""
    return {
        "prompt": prompt.text,
        "n_predict": n_predict if n_predict is not None else prompt.n_predict,
        "temperature": 0.0,
        "top_k": 1,
        "seed": 0,
        "cache_prompt": False,
        "return_tokens": True,
        "n_probs": n_probs,
        "stream": False,
    }


_ACCEPT = re.compile(r"draft acceptance rate = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\)")


def log_acceptance(log_text: str) -> tuple[int, int] | None:
    """(accepted, drafted) from server-log acceptance lines (ik_llama.cpp reports it there)."""
    found = _ACCEPT.findall(log_text)
    if not found:
        return None
    return sum(int(a) for a, _ in found), sum(int(g) for _, g in found)


def complete(server: Server, prompt: Prompt) -> Completion:
    """One greedy request; token ids come from `tokens`, or (engines without
    `return_tokens`, e.g. ik_llama.cpp) from per-token `completion_probabilities`."""
    n_probs = 0 if server.returns_tokens is not False else 1
    before = server.log.stat().st_size if server.log.exists() else 0
    reply = server.post("/completion", request(prompt, n_probs=n_probs))
    if reply.get("tokens") is None:
        if n_probs == 0:
            server.returns_tokens = False
            return complete(server, prompt)
        probs = reply.get("completion_probabilities")
        if probs is None:
            raise server.failure("the server returned neither token ids nor token probabilities")
        reply["tokens"] = [token_key(p) for p in probs]
    timings = reply.get("timings", {})
    draft_n, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if draft_n is None:
        time.sleep(0.2)  # the slot's summary is logged just after the reply
        with server.log.open(errors="replace") as fh:
            fh.seek(before)
            counts = log_acceptance(fh.read())
        if counts:
            accepted, draft_n = counts
    return Completion(
        tokens=tuple(reply["tokens"]),
        text=reply.get("content", ""),
        predicted_per_second=float(timings.get("predicted_per_second", 0.0)),
        draft_n=draft_n,
        draft_accepted=accepted,
    )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


Token = int | str


def token_key(entry: dict) -> Token:
    """A generated token's identity: its id, or its text where the server gives no ids
    (older probability format: {"content", "probs": [{"tok_str", "prob"}]})."""
    return int(entry["id"]) if "id" in entry else str(entry.get("content", entry.get("tok_str")))


def top_logprobs_at(
    server: Server, prompt: Prompt, position: int
) -> tuple[Token, dict[Token, float]]:
    """The reference's chosen token and its top-k {token: logprob} at `position`."""
    reply = server.post("/completion", request(prompt, n_predict=position + 1, n_probs=TOP_K))
    probs = reply.get("completion_probabilities") or []
    if len(probs) <= position:
        raise server.failure(f"the reference returned no probabilities for token {position}")
    entry = probs[position]
    if "top_logprobs" in entry:
        top = {int(t["id"]): float(t["logprob"]) for t in entry["top_logprobs"]}
    else:
        top = {
            str(t["tok_str"]): math.log(t["prob"]) if t["prob"] > 0 else -math.inf
            for t in entry.get("probs", [])
        }
    return token_key(entry), top


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
        return first_difference(ref.tokens, spec.tokens)
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
    """Identical, a near-tie inside the numeric margin, or a hard divergence."""
    pos = divergence(ref, spec)
    if pos is None:
        return Verdict("identical")
    if _text_mode(ref):
        start = _piece_at(ref, _common_prefix(ref.text, spec.text))[1]
        rest = spec.text[start:]
        if not rest:
            return _short(pos, len(ref.tokens), margin)
        if pos >= len(ref.tokens):
            return _longer(pos, margin)
        ref_tok: Token = ref.tokens[pos]
        options = [t for t in (top[1] if top else {}) if isinstance(t, str) and t != ref_tok]
        matches = sorted((t for t in options if t and rest.startswith(t)), key=len)
        spec_tok: Token = matches[-1] if matches else rest[: len(str(ref_tok))]
    else:
        if pos == len(spec.tokens):
            return _short(pos, len(ref.tokens), margin)
        if pos >= len(ref.tokens):
            return _longer(pos, margin)
        ref_tok, spec_tok = ref.tokens[pos], spec.tokens[pos]
    delta = None
    if top is not None:
        chosen, logprobs = top
        if chosen == ref_tok and ref_tok in logprobs and spec_tok in logprobs:
            delta = logprobs[ref_tok] - logprobs[spec_tok]
    kind: Kind = "near-tie" if delta is not None and delta <= margin else "hard"
    return Verdict(kind, pos, delta, margin, _context(ref, pos), _context(spec, pos))


def _short(pos: int, total: int, margin: float) -> Verdict:
    """The speculative output is an exact prefix of the reference but stopped early: the
    tokens it chose are right, its length accounting is not (reported, not failed)."""
    return Verdict(
        "short",
        pos,
        margin=margin,
        reference=f"{total} tokens",
        speculative=f"the same first {pos} tokens, then stopped",
    )


def _longer(pos: int, margin: float) -> Verdict:
    return Verdict(
        "hard",
        pos,
        margin=margin,
        reference=f"stopped after {pos} tokens",
        speculative="went on past the reference's end",
    )


def _context(c: Completion, pos: int) -> str:
    return f"token {pos} of {len(c.tokens)}: ids {list(c.tokens[max(0, pos - 3) : pos + 6])}"


def with_text(server: Server, verdict: Verdict, ref: Completion, spec: Completion) -> Verdict:
    """Add both continuations as text: a little context, then ⟦what each run chose⟧."""
    pos = verdict.position
    if pos is None:
        return verdict

    def text(c: Completion) -> str:
        if c.tokens and isinstance(c.tokens[0], str):
            return (
                f"…{''.join(c.tokens[max(0, pos - 8) : pos])}⟦{''.join(c.tokens[pos : pos + 12])}⟧…"
            )
        before = server.post("/detokenize", {"tokens": list(c.tokens[max(0, pos - 8) : pos])})
        after = server.post("/detokenize", {"tokens": list(c.tokens[pos : pos + 12])})
        return f"…{before.get('content', '')}⟦{after.get('content', '')}⟧…"

    return replace(verdict, reference=text(ref), speculative=text(spec))


def base_args(model: Path, ctx: int = 4096, slots: int = 1) -> list[str]:
    """Server settings for reproducible greedy runs (requests also turn off prompt reuse)."""
    return ["-m", str(model), "-c", str(ctx), "-np", str(slots), "--no-warmup"]


def smoke(
    artifact: Artifact,
    dialect: str,
    model: Path,
    out_dir: Path,
    console: Console,
    prompts: Sequence[Prompt] = SMOKE_PROMPTS,
    n_max: int = 8,
) -> SmokeReport:
    """Run the prompts without and with a draft model; write smoke.json; raise on failure."""
    t0 = time.monotonic()
    # p_min 0: draft whatever the draft model ranks first (older servers default to 0.9,
    # which with a 270M self-draft drafts almost nothing)
    settings = dialects.SpecSettings(method="draft", draft_model=model, n_max=n_max, p_min=0.0)
    spec = dialects.spec_args(dialect, settings)
    help_text = server_help(artifact.server)
    dialects.check_help(spec, help_text, str(artifact.server))
    report = SmokeReport(artifact.id, "draft", spec)
    logs = out_dir / "logs"
    with running(artifact.server, base_args(model), logs / "reference.log") as ref_srv:
        refs = [complete(ref_srv, p) for p in prompts]
        with running(artifact.server, [*base_args(model), *spec], logs / "speculative.log") as sp:
            specs = [complete(sp, p) for p in prompts]
            chat_stats = _openai_check(sp, console)
        for p, r, s in zip(prompts, refs, specs, strict=True):
            top = None
            pos = divergence(r, s)
            if pos is not None and pos < len(r.tokens):
                top = top_logprobs_at(ref_srv, p, pos)
            verdict = with_text(ref_srv, classify(r, s, top), r, s)
            report.results.append(PromptResult(p.name, r, s, verdict))
        if "ngram-mod" in help_text:
            report.results.append(_ngram_check(artifact, model, dialect, help_text, ref_srv, logs))
    if report.drafted == 0 and chat_stats:
        report.chat_drafted, report.chat_accepted = chat_stats
    report.wall_seconds = time.monotonic() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "smoke.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    print_report(report, console)
    if not report.passed:
        why = (
            "the speculative run accepted no draft tokens (speculation did not engage)"
            if report.accepted == 0
            else "greedy output with speculation diverged from the reference beyond the "
            f"near-tie margin ({NEAR_TIE_MARGIN_NATS} nats)"
        )
        raise LlamaspecError(
            f"Smoke test failed: {why}. Report: {out_dir / 'smoke.json'}. Speculative command: "
            f"{' '.join(map(str, [artifact.server, *base_args(model), *spec]))}",
            details=f"Last 40 lines of {logs / 'speculative.log'}:\n"
            + tail(logs / "speculative.log"),
        )
    return report


def ngram_tuning(help_text: str) -> list[str]:
    """Shorter ngram-mod matches and drafts than the defaults (48/64 tokens draft nothing on
    short outputs), where the binary has the knobs."""
    if "--spec-ngram-mod-n-min" not in dialects.help_flags(help_text):
        return []
    return [
        "--spec-ngram-mod-n-min",
        "4",
        "--spec-ngram-mod-n-max",
        "16",
        "--spec-ngram-mod-n-match",
        "8",
    ]


REWRITE = Prompt(
    "rewrite/ngram-mod",
    "Copy this code exactly, then stop.\n\n```python\ndef add(a, b):\n    return a + b\n\n\n"
    "def sub(a, b):\n    return a - b\n```\n\n```python\n",
    48,
)


def _ngram_check(
    artifact: Artifact, model: Path, dialect: str, help_text: str, ref_srv: Server, logs: Path
) -> PromptResult:
    """One prompt with a draft-free method (ngram-mod): it must not change the output."""
    argv = dialects.spec_args(dialect, dialects.SpecSettings(method="ngram-mod"))
    argv += ngram_tuning(help_text)
    ref = complete(ref_srv, REWRITE)
    with running(artifact.server, [*base_args(model), *argv], logs / "ngram-mod.log") as srv:
        spec = complete(srv, REWRITE)
    pos = divergence(ref, spec)
    top = (
        top_logprobs_at(ref_srv, REWRITE, pos)
        if pos is not None and pos < len(ref.tokens)
        else None
    )
    return PromptResult(
        REWRITE.name, ref, spec, with_text(ref_srv, classify(ref, spec, top), ref, spec)
    )


def _openai_check(server: Server, console: Console) -> tuple[int, int] | None:
    """A streamed greedy chat request through the OpenAI client, with speculation on.

    Returns (drafted, accepted) when the stream reports them (`timings_per_token`): servers
    of the ik_llama.cpp port era report draft statistics only there."""
    client = OpenAI(base_url=server.url + "/v1", api_key="llamaspec", timeout=300)
    text, timings = "", {}
    try:
        stream = client.chat.completions.create(
            model="target",
            temperature=0,
            max_tokens=32,
            stream=True,
            messages=[{"role": "user", "content": "Name three primary colours."}],
            extra_body={"timings_per_token": True},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            timings = (chunk.model_extra or {}).get("timings") or timings
    except Exception as exc:  # the client raises many types; all mean the same here
        raise server.failure(f"the OpenAI-compatible /v1/chat/completions failed: {exc}") from None
    if not text:
        raise server.failure("/v1/chat/completions returned no content")
    console.print(f"smoke: OpenAI chat endpoint ok ({len(text)} characters streamed)")
    if timings.get("draft_n"):
        return int(timings["draft_n"]), int(timings.get("draft_n_accepted", 0))
    return None


def print_report(report: SmokeReport, console: Console) -> None:
    table = Table(title=f"smoke: {report.artifact_id} ({report.method})")
    for col in ("prompt", "tok/s plain", "tok/s spec", "drafted", "accepted", "equivalence"):
        table.add_column(col)
    for r in report.results:
        table.add_row(
            r.prompt,
            f"{r.reference.predicted_per_second:.1f}",
            f"{r.speculative.predicted_per_second:.1f}",
            str(r.speculative.draft_n or 0),
            str(r.speculative.draft_accepted or 0),
            r.verdict.describe(),
        )
    console.print(table)
    for r in report.results:
        console.print(f"equivalence: {r.prompt}: {r.verdict.describe()}")
        if r.verdict.kind != "identical":
            console.print(
                f"  reference:   {r.verdict.reference}\n  speculative: {r.verdict.speculative}"
            )
    rate = f"{report.accepted / report.drafted:.0%}" if report.drafted else "n/a"
    console.print(
        f"smoke: {'PASSED' if report.passed else 'FAILED'} — acceptance {report.accepted}/"
        f"{report.drafted} ({rate}), wall {report.wall_seconds:.1f}s"
    )


# Lavapipe runs shaders on the CPU and compiles each pipeline on first use (minutes on
# small machines): the Vulkan smoke asks for fewer tokens and leaves flash attention (the
# largest shader) off; each setting applies only when the environment does not set it.
VULKAN_N_PREDICT = 32
VULKAN_SMOKE_ENV = (
    ("GGML_VK_VISIBLE_DEVICES", "0", "Vulkan device 0; ggml-vulkan hides lavapipe otherwise"),
    ("LLAMA_ARG_FLASH_ATTN", "off", "no flash-attention pipeline to compile"),
    ("LLAMASPEC_SERVER_READY_TIMEOUT", "3600", "a cold lavapipe start compiles pipelines"),
)


def smoke_artifact(artifact: Artifact, console: Console, root: Path | None = None) -> SmokeReport:
    """The smoke test of a built artifact with the embedded model (what `build` runs last)."""
    import os

    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.embedded import embedded_model

    model = embedded_model(console.print)
    prompts = SMOKE_PROMPTS
    if artifact.manifest.get("backend") == "vulkan":
        prompts = tuple(replace(p, n_predict=VULKAN_N_PREDICT) for p in prompts)
        for name, value, why in VULKAN_SMOKE_ENV:
            if name not in os.environ:
                os.environ[name] = value
                console.print(f"smoke: {name}={value} ({why})")
    dialect = dialect_for(artifact, console.print, root)
    return smoke(artifact, dialect, model, artifact.path, console, prompts)
