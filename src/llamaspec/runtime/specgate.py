"""The speculation gate: a draft model or MTP head is loaded, so something must be drafted.

Upstream llama.cpp since PR #23988 loads a draft model given with `-md` and never drafts with
it unless `--spec-type` names a draft type (`draft-simple`, …): upstream issue #25345. The
server then answers correctly, only as slowly as without speculation, while holding the
draft in memory. `loaded` reads from a server's argv (and its LLAMA_ARG_* environment) what
speculation it loads; `judge` takes the server's counters before and after some generated
tokens (`runtime.metrics`, or the counts of its replies where the engine exports none) and
returns a `Verdict`: drafting, loaded but nothing drafted (loud, with the likely cause and
the fix), no draft or MTP head loaded, or not known yet. The smoke test fails on the loud
one, `serve` logs it, and the image's health check (docker/healthcheck.sh) does the same in
shell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from llamaspec.models import dialects
from llamaspec.runtime.client import Completion
from llamaspec.runtime.metrics import SpecCounters

__all__ = ["SOURCES", "Loaded", "Verdict", "judge", "judge_replies", "loaded"]

# Where the counts came from, as the verdict names it.
SOURCES = {
    "metrics": "/metrics (llamacpp:spec_decode_*)",
    "timings": "the replies' timings.draft_n",
    "log": "the server log's acceptance lines",
}

DRAFT_MODEL_FLAGS = dialects.DRAFT_MODEL_FLAGS
DRAFT_MODEL_ENV = ("LLAMA_ARG_SPEC_DRAFT_MODEL", "LLAMA_ARG_MODEL_DRAFT")
SPEC_TYPE_ENV = "LLAMA_ARG_SPEC_TYPE"
TYPE_FLAG = min(dialects.SPEC_TYPE_FLAGS)  # every dialect spells it alike
# Engine spellings of the spec types that draft with a draft model, and with an MTP head.
MODEL_TYPE_NAMES = frozenset(
    d.type_names[t]
    for d in dialects.DIALECTS.values()
    for t in dialects.MODEL_TYPES
    if t in d.type_names
)
MTP_TYPE_NAMES = frozenset(
    d.type_names["mtp"] for d in dialects.DIALECTS.values() if "mtp" in d.type_names
)
# A draft p-min at or above this discards most drafts of a small draft model.
HIGH_P_MIN = 0.8

Kind = Literal["drafting", "idle", "none", "unknown"]


def _values(argv: Sequence[str], flags: frozenset[str]) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in flags:
            if eq:
                out.append(value)
            elif i + 1 < len(argv):
                out.append(argv[i + 1])
    return out


@dataclass(frozen=True)
class Loaded:
    """What speculation a server's command line asks for."""

    draft_model: str | None = None  # the draft file, as given
    draft_flag: str | None = None  # the flag (or variable) that gave it
    types: tuple[str, ...] = ()  # the engine's spec type names, as given (params dropped)
    mtp: str | None = None  # how an MTP head is switched on: `--spec-type draft-mtp`, `-mtp`
    n_max: str | None = None
    p_min: str | None = None

    @property
    def drafts(self) -> bool:
        """A draft model or an MTP head is loaded: the gate's subject."""
        return self.draft_model is not None or self.mtp is not None

    @property
    def model_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.types if t in MODEL_TYPE_NAMES)

    def describe(self) -> str:
        parts = []
        if self.draft_model is not None:
            parts.append(f"draft model {self.draft_model} ({self.draft_flag})")
        if self.mtp is not None:
            parts.append(f"the target's MTP head ({self.mtp})")
        if self.types:
            parts.append(f"{TYPE_FLAG} {','.join(self.types)}")
        return " with ".join(parts[:1]) + "".join(f", {p}" for p in parts[1:]) or "nothing"


def loaded(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Loaded:
    """What a llama-server argv (and its LLAMA_ARG_* `env`, which the argv overrides) loads."""
    env = env or {}
    drafts = _values(argv, DRAFT_MODEL_FLAGS)
    flag = next(
        (a.partition("=")[0] for a in argv if a.partition("=")[0] in DRAFT_MODEL_FLAGS), None
    )
    draft = drafts[-1] if drafts else None
    if draft is None:
        name = next((n for n in DRAFT_MODEL_ENV if env.get(n)), None)
        draft, flag = (env[name], name) if name else (None, None)
    given = _values(argv, dialects.SPEC_TYPE_FLAGS) or (
        [env[SPEC_TYPE_ENV]] if env.get(SPEC_TYPE_ENV) else []
    )
    types = tuple(
        t.split(":")[0].strip()
        for value in given
        for t in value.split(",")
        if t.split(":")[0].strip() not in ("", "none")
    )
    mtp = None
    switched = [a for a in argv if a in dialects.MTP_SWITCHES | dialects.MTP_OFF]
    if switched and switched[-1] in dialects.MTP_SWITCHES:
        mtp = switched[-1]
    elif any(t in MTP_TYPE_NAMES for t in types):
        mtp = f"{TYPE_FLAG} {next(t for t in types if t in MTP_TYPE_NAMES)}"
    n_max = _values(argv, dialects.N_MAX_FLAGS)
    p_min = _values(argv, dialects.P_MIN_FLAGS)
    return Loaded(
        draft,
        flag if draft else None,
        types,
        mtp,
        n_max[-1] if n_max else None,
        p_min[-1] if p_min else None,
    )


@dataclass(frozen=True)
class Verdict:
    """The gate's finding. `failed`: a draft or MTP head is loaded and nothing was drafted."""

    kind: Kind
    loaded: Loaded
    counters: SpecCounters | None
    source: str | None  # a key of SOURCES
    message: str

    @property
    def failed(self) -> bool:
        return self.kind == "idle"

    def to_json(self) -> dict:
        c = self.counters
        return {
            "kind": self.kind,
            "loaded": self.loaded.describe(),
            "source": SOURCES.get(self.source or "", self.source),
            "drafted": None if c is None else c.drafted,
            "accepted": None if c is None else c.accepted,
            "generated": None if c is None else c.predicted,
            "message": self.message,
        }


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def cause_and_fix(what: Loaded, dialect: str | None = None) -> tuple[str, str]:
    """The likely cause of a loaded draft that drafts nothing, and the fix, from the argv
    (and the dialect the binary speaks, where known)."""
    d = dialects.DIALECTS.get(dialect or "")
    by_model = d is not None and "draft" in d.by_model  # -md alone drafts (older pins)
    if what.draft_model is not None and not what.model_types and not by_model:
        name = d.type_names.get("draft", "draft-simple") if d else "draft-simple"
        others = ",".join((name, *what.types))
        return (
            f"a draft model without a draft spec type: since upstream llama.cpp PR #23988, "
            f"{what.draft_flag} loads the draft and never drafts with it unless --spec-type "
            f"names a draft type (upstream issue #25345)"
            + (f"; --spec-type lists only {','.join(what.types)}" if what.types else ""),
            f"add `--spec-type {others}` (draft-eagle3, draft-dflash or draft-dspark instead "
            f"for those drafters), or in a recipe list `draft` under `spec: types:`",
        )
    n_max = _number(what.n_max)
    if n_max is not None and n_max <= 0:
        return (f"the draft length is {what.n_max}", "set the draft length (n_max) to 1 or more")
    p_min = _number(what.p_min)
    if p_min is not None and p_min >= HIGH_P_MIN:
        return (
            f"a draft p-min of {what.p_min} discards every draft token the draft model is "
            "less sure of",
            "lower it (e.g. `--spec-draft-p-min 0.0`; recipes: `draft_p_min`)",
        )
    if what.mtp is not None and what.draft_model is None:
        return (
            "the target has no MTP head the build can use (no nextn layers in the GGUF, or a "
            "build that does not run it)",
            "use a target GGUF converted with its MTP layers, or a draft model instead",
        )
    return (
        "not clear from the command line",
        "read the server log's speculative lines (draft loading, acceptance), and run "
        "`llamaspec smoke` on this build",
    )


def judge(
    argv: Sequence[str],
    before: SpecCounters | None,
    after: SpecCounters | None,
    *,
    source: str = "metrics",
    dialect: str | None = None,
    env: Mapping[str, str] | None = None,
    subject: str = "llama-server",
) -> Verdict:
    """The gate's verdict on a server that generated tokens between `before` and `after`.

    `source` says where the counters come from (a key of SOURCES); `before` None counts from
    zero (a fresh server); `after` None (no counters at all) is "unknown"."""
    what = loaded(argv, env)
    if not what.drafts:
        return Verdict("none", what, None, None, f"{subject}: no draft model or MTP head loaded")
    where = SOURCES.get(source, source)
    if after is None or not after.available:
        return Verdict(
            "unknown",
            what,
            after,
            source,
            f"{subject}: {what.describe()} is loaded; drafting cannot be told: {where} "
            "gave no speculation counts",
        )
    delta = after - before if before is not None else after
    if delta.drafted > 0 or delta.drafts > 0:
        rate = f" ({delta.accepted / delta.drafted:.0%} accepted)" if delta.drafted else ""
        return Verdict(
            "drafting",
            what,
            delta,
            source,
            f"{subject}: drafting: {delta.drafted:g} draft tokens, {delta.accepted:g} "
            f"accepted{rate} ({where})",
        )
    if delta.predicted <= 0:
        return Verdict(
            "unknown",
            what,
            delta,
            source,
            f"{subject}: {what.describe()} is loaded; no tokens generated yet ({where})",
        )
    cause, fix = cause_and_fix(what, dialect)
    return Verdict(
        "idle",
        what,
        delta,
        source,
        f"SPECULATION GATE: {subject} loads {what.describe()}, but nothing was drafted: over "
        f"{delta.predicted:g} generated tokens {where} counted {delta.drafts:g} drafts, "
        f"{delta.drafted:g} draft tokens and {delta.accepted:g} accepted. Every token was "
        f"decoded by the target alone: the draft costs memory and load time and buys no "
        f"speed. Likely cause: {cause}. Fix: {fix}.",
    )


def judge_replies(
    argv: Sequence[str],
    before: SpecCounters | None,
    after: SpecCounters | None,
    replies: Sequence[Completion],
    dialect: str | None,
    chat: tuple[int, int] | None = None,
) -> Verdict:
    """`judge` on a server that answered `replies` (and a streamed chat reporting `chat`
    (drafted, accepted)): its `/metrics` counters, or, where the engine exports none
    (ik_llama.cpp), the draft counts the replies report (`timings.draft_n`, else the server
    log's acceptance lines); where nothing reports drafts at all, the gate cannot tell."""
    if after is not None and after.available:
        return judge(argv, before, after, source="metrics", dialect=dialect)
    sources = {c.draft_source for c in replies if c.draft_source}
    drafted = sum(c.draft_n or 0 for c in replies)
    accepted = sum(c.draft_accepted or 0 for c in replies)
    if chat is not None:
        sources.add("timings")
        drafted, accepted = drafted + chat[0], accepted + chat[1]
    counts = SpecCounters(
        drafted=drafted,
        accepted=accepted,
        predicted=sum(c.tokens_predicted or len(c.tokens) for c in replies),
        available=bool(sources),
    )
    source = "timings" if "timings" in sources or not sources else "log"
    return judge(argv, None, counts, source=source, dialect=dialect)
