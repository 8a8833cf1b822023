"""Draft/target compatibility from GGUF metadata (models/gguf_header.py reads it), with the
engine's own rules.

A header may leave out the special-token keys (`add_bos_token`, `bos_token_id`, …); the
engine then uses its own defaults for the file's vocab type, and so does `check`
(`engine_vocab`, from the table below).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llamaspec.models.gguf_header import TokenizerInfo

# The engine's constants (common/speculative.cpp at the default pins).
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5

# ---- the engine's vocab defaults -------------------------------------------------------
# What llama.cpp uses when a header leaves a special-token key out, as the upstream pin
# sets it: src/llama-vocab.cpp (`llama_vocab::impl::load`) at commit
# 0c1e57098bba43ac29e6e3b677cdceebdd22334f (engines.yaml's llama.cpp pin, also vendored in
# llama-cpp-python 0.3.36). `common_speculative_are_compatible` (common/speculative.cpp)
# then compares the vocab *type*, not the `tokenizer.ggml.model` string.

# tokenizer.ggml.model → the engine's vocab type (any other name: the engine refuses the file)
VOCAB_TYPES = {
    "no_vocab": "NONE",
    "none": "NONE",
    "llama": "SPM",
    "bert": "WPM",
    "gpt2": "BPE",
    "hybriddna": "BPE",
    "whitespace": "BPE",
    "gemma4": "BPE",
    "t5": "UGM",
    "rwkv": "RWKV",
    "test": "TEST",
    "plamo2": "PLAMO2",
}


@dataclass(frozen=True)
class VocabDefaults:
    """The BOS/EOS ids and add flags the engine starts from (None: no such token)."""

    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool


_BPE = VocabDefaults(11, 11, False, False)
_NOTHING = VocabDefaults(None, None, False, False)
# per tokenizer.ggml.model: models of one type may differ (gemma4 is BPE without gpt2's ids)
VOCAB_DEFAULTS = {
    "no_vocab": _NOTHING,  # the engine reads no special-token key at all for these two
    "none": _NOTHING,
    "llama": VocabDefaults(1, 2, True, False),
    "bert": VocabDefaults(101, None, True, False),
    "gpt2": _BPE,
    "hybriddna": _BPE,
    "whitespace": _BPE,
    "gemma4": _NOTHING,
    "t5": VocabDefaults(None, 1, False, True),
    "rwkv": _NOTHING,
    "test": _NOTHING,
    "plamo2": VocabDefaults(1, 2, False, False),
}
# BPE only: pre-tokenizers (tokenizer.ggml.pre) that change those defaults
BPE_PRE_ADD_BOS = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
    | {"jina-v5-nano", "tekken", "chameleon"}
)
BPE_PRE_NO_BOS_ID = frozenset({"chatglm-bpe", "glm4", "glm5"})
# BPE only: add_bos is forced on after the header is read, whatever it says (Gemma 4)
BPE_PRE_FORCE_ADD_BOS = frozenset({"gemma4", "granite-embed-multi-311m"})


@dataclass(frozen=True)
class Rule:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    target: str
    draft: str
    rules: tuple[Rule, ...]

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rules)

    @property
    def failed(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if not r.ok)


@dataclass(frozen=True)
class EngineVocab:
    """What the engine makes of a header's vocab: its type, its BOS/EOS ids (None: no such
    token) and whether it adds them; `defaulted` names the values the header left to the
    engine's defaults (or gave out of the vocab's range)."""

    model: str | None
    type: str | None  # None: a tokenizer the engine does not know (it refuses the file)
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    defaulted: frozenset[str] = frozenset()


def engine_vocab(info: TokenizerInfo) -> EngineVocab:
    """The vocab as the engine loads it: the header's keys over the defaults of its
    tokenizer model (VOCAB_DEFAULTS and the BPE pre-tokenizer sets above)."""
    model = info.vocab_type
    kind = VOCAB_TYPES.get(model or "")
    base = VOCAB_DEFAULTS.get(model or "")
    if kind is None or base is None:  # unknown: the header's values as written
        return EngineVocab(
            model,
            None,
            info.bos_id,
            info.eos_id,
            bool(info.add_bos),
            bool(info.add_eos),
            frozenset(
                k for k, v in (("add_bos", info.add_bos), ("add_eos", info.add_eos)) if v is None
            ),
        )
    if kind == "NONE":  # the engine returns before reading any special-token key
        unread = frozenset(("bos", "eos", "add_bos", "add_eos"))
        return EngineVocab(model, kind, None, None, False, False, unread)
    pre = "gemma4" if model == "gemma4" else info.pre
    bos, add_bos = base.bos, base.add_bos
    if kind == "BPE" and pre in BPE_PRE_ADD_BOS:
        add_bos = True
    if kind == "BPE" and pre in BPE_PRE_NO_BOS_ID:
        bos = None
    defaulted: set[str] = set()

    def token(key: str, default: int | None, header: int | None) -> int | None:
        if default is not None and default >= info.n_vocab:
            default = None  # a default outside the vocab is disabled
        if header is None or not 0 <= header < info.n_vocab:
            defaulted.add(key)  # missing, or out of range: the engine keeps its default
            return default
        return header

    def flag(key: str, default: bool, header: bool | None) -> bool:
        if header is None:
            defaulted.add(key)
            return default
        return header

    bos = token("bos", bos, info.bos_id)
    eos = token("eos", base.eos, info.eos_id)
    add_bos = flag("add_bos", add_bos, info.add_bos)
    add_eos = flag("add_eos", base.add_eos, info.add_eos)
    if kind == "BPE" and pre in BPE_PRE_FORCE_ADD_BOS and not add_bos:
        add_bos = True
        defaulted.add("add_bos")
    return EngineVocab(model, kind, bos, eos, add_bos, add_eos, frozenset(defaulted))


def _val(v: EngineVocab, key: str) -> str:
    value = getattr(v, key)
    return f"{value!r} (engine default)" if key in v.defaulted else repr(value)


def _same(name: str, what: str, key: str, t: EngineVocab, d: EngineVocab) -> Rule:
    ok = getattr(t, key) == getattr(d, key)
    return Rule(name, ok, f"{what}: target {_val(t, key)} vs draft {_val(d, key)}")


def _vocab_type(t: EngineVocab, d: EngineVocab) -> Rule:
    def show(v: EngineVocab) -> str:
        return f"{v.model!r} ({v.type})" if v.type else f"{v.model!r} (unknown to the engine)"

    ok = t.type is not None and t.type == d.type
    if t.type is None and d.type is None and t.model == d.model:
        ok = True  # a name this table does not know: the same name is the same tokenizer
    detail = f"tokenizer.ggml.model: target {t.model!r} vs draft {d.model!r}"
    if t.model != d.model or t.type is None:
        detail = f"tokenizer.ggml.model: target {show(t)} vs draft {show(d)}"
    return Rule("vocab type", ok, detail)


def check(target: TokenizerInfo, draft: TokenizerInfo, kind: str = "draft") -> Verdict:
    """Apply the engine's draft/target rules (`common_speculative_are_compatible`) to the
    vocabs as the engine loads them (`engine_vocab`: its defaults where a header is silent)."""
    t, d = engine_vocab(target), engine_vocab(draft)
    rules = [_vocab_type(t, d)]
    rules.append(_same("add BOS", "add_bos_token", "add_bos", t, d))
    if t.add_bos:
        rules.append(_same("BOS id", "bos_token_id", "bos", t, d))
    rules.append(_same("add EOS", "add_eos_token", "add_eos", t, d))
    if t.add_eos:
        rules.append(_same("EOS id", "eos_token_id", "eos", t, d))
    nt, nd = target.n_vocab, draft.n_vocab
    diff = abs(nt - nd)
    within = diff <= VOCAB_MAX_SIZE_DIFFERENCE
    rules.append(
        Rule(
            "vocab size",
            within,
            f"draft vocab {nd} vs target {nt}: difference {diff}, "
            + (
                f"within {VOCAB_MAX_SIZE_DIFFERENCE}, ok"
                if within
                else f"over the {VOCAB_MAX_SIZE_DIFFERENCE} allowed"
            ),
        )
    )
    if kind in ("mtp", "eagle3"):
        rules.append(
            Rule("head vocab", nd >= nt, f"{kind} head vocab {nd} vs target {nt} (needs ≥)")
        )
    rules.append(_token_texts(target, draft))
    return Verdict(target.name, draft.name, tuple(rules))


def _token_texts(target: TokenizerInfo, draft: TokenizerInfo) -> Rule:
    n = min(target.n_vocab, draft.n_vocab)
    start = VOCAB_CHECK_START_TOKEN_ID
    if n <= start:
        return Rule("token texts", True, f"fewer than {start} tokens to compare")
    t = np.asarray(target.tokens[start:n], dtype=object)
    d = np.asarray(draft.tokens[start:n], dtype=object)
    diff = np.flatnonzero(t != d)
    if diff.size == 0:
        return Rule("token texts", True, f"ids {start}..{n - 1} identical")
    i = int(diff[0]) + start
    return Rule(
        "token texts",
        False,
        f"token {i} differs: {target.tokens[i]!r} vs {draft.tokens[i]!r} "
        f"({diff.size} of {n - start} ids from {start} differ)",
    )


def explain(verdict: Verdict) -> str:
    """One paragraph: why the engine would refuse this pair (or that it accepts it)."""
    if verdict.ok:
        return f"{verdict.draft} is compatible with {verdict.target} as a draft."
    failed = "; ".join(f"{r.name}: {r.detail}" for r in verdict.failed)
    return (
        f"{verdict.draft} cannot draft for {verdict.target}: the engine refuses the pair "
        f"({failed}). Pick a draft from the same tokenizer family (see `llamaspec models list`)."
    )
