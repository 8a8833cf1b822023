"""Draft/target compatibility from GGUF metadata, with the engine's own rules.

The tokenizer metadata sits in the GGUF header (key/value section), before the tensor
infos and the weights, so a remote file is judged from its first megabytes: `read_header`
takes any `fetch(n)` that returns the file's first n bytes (a local read or an HTTP range).
The tensor infos (names, shapes) follow the key/values; their names tell whether a file
carries MTP heads (`nextn` tensors), which an MTP recipe needs.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUF_MAGIC, READER_SUPPORTED_VERSIONS, GGUFValueType, Keys

from llamaspec.errors import LlamaspecError

# The engine's constants (common/speculative.cpp at the default pins).
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
FIRST_READ = 4 << 20
MAX_HEADER = 256 << 20
MTP_LAYERS_SUFFIX = ".nextn_predict_layers"
# `<arch>.…` keys that size the KV cache (a memory estimate reads them)
SHAPE_KEYS = (
    "block_count",
    "embedding_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
)


@dataclass(frozen=True)
class TokenizerInfo:
    """What the engine compares between a target and a draft."""

    name: str
    arch: str
    vocab_type: str | None
    tokens: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool | None
    add_eos: bool | None
    mtp_layers: int | None = None  # `<arch>.nextn_predict_layers`
    nextn_tensors: int = 0  # tensors with `nextn` in their name
    params: int = 0  # parameters: the elements of every tensor (from the tensor infos)
    basename: str = ""  # `general.basename` (e.g. "gemma-3"), the model family's name
    size_label: str = ""  # `general.size_label` (e.g. "270M")
    shape: tuple[tuple[str, int], ...] = ()  # `<arch>.block_count`, head counts, lengths

    def dim(self, key: str) -> int | None:
        """`<arch>.<key>` (e.g. `block_count`, `attention.head_count_kv`), where the header
        has it."""
        return dict(self.shape).get(key)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def has_mtp(self) -> bool:
        """Whether the file carries multi-token-prediction (NextN) heads."""
        return (self.mtp_layers or 0) > 0 or self.nextn_tensors > 0


class _Truncated(Exception):
    pass


_SCALARS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_WANTED = {
    Keys.General.ARCHITECTURE,
    Keys.Tokenizer.MODEL,
    Keys.Tokenizer.LIST,
    Keys.Tokenizer.BOS_ID,
    Keys.Tokenizer.EOS_ID,
    Keys.Tokenizer.ADD_BOS,
    Keys.Tokenizer.ADD_EOS,
    Keys.General.BASENAME,
    Keys.General.SIZE_LABEL,
}


class _Cursor:
    """Little-endian reads over a byte buffer; running off its end means 'truncated'."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> object:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _Truncated
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self, decode: bool = True) -> str | None:
        n = int(self.take("Q"))  # type: ignore[call-overload]
        end = self.pos + n
        if end > len(self.data):
            raise _Truncated
        raw = self.data[self.pos : end]
        self.pos = end
        return raw.decode("utf-8", errors="replace") if decode else None

    def value(self, vtype: int, keep: bool) -> object:
        if vtype == GGUFValueType.STRING:
            return self.string(keep)
        if vtype in _SCALARS:
            return self.take(_SCALARS[GGUFValueType(vtype)])
        if vtype != GGUFValueType.ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        itype = int(self.take("I"))  # type: ignore[call-overload]
        count = int(self.take("Q"))  # type: ignore[call-overload]
        if itype in _SCALARS and not keep:
            self.pos += count * struct.calcsize(_SCALARS[GGUFValueType(itype)])
            if self.pos > len(self.data):
                raise _Truncated
            return None
        items = [self.value(itype, keep) for _ in range(count)]
        return items if keep else None


# The first four bytes of every GGUF file.
MAGIC = GGUF_MAGIC.to_bytes(4, "little")


def _parse(data: bytes, name: str) -> TokenizerInfo:
    """The tokenizer keys of a GGUF header (gguf's reader parses every array element
    through numpy, 20 s for a 262k vocabulary on 2 cores; this skips what it does not need)."""
    cur = _Cursor(data)
    try:
        if len(data) >= 4 and cur.take("I") != GGUF_MAGIC:
            raise LlamaspecError(
                f"{name} is not a GGUF file (it does not start with the GGUF magic bytes). "
                "Check the file name in models.yaml, or re-download it."
            )
        version = cur.take("I")
        if version not in READER_SUPPORTED_VERSIONS:
            raise LlamaspecError(
                f"{name} is GGUF version {version}, which this `gguf` package cannot read. "
                "Upgrade it with `pip install -U gguf`."
            )
        n_tensors = int(cur.take("Q"))  # type: ignore[call-overload]
        n_kv = int(cur.take("Q"))  # type: ignore[call-overload]
        kv: dict[str, object] = {}
        for _ in range(n_kv):
            key = cur.string()
            vtype = int(cur.take("I"))  # type: ignore[call-overload]
            keep = (
                key in _WANTED
                or str(key).endswith(MTP_LAYERS_SUFFIX)
                or str(key).partition(".")[2] in SHAPE_KEYS
            )
            kv[key] = cur.value(vtype, keep)  # type: ignore[index]
        nextn = params = 0
        for _ in range(n_tensors):  # tensor infos: name, n_dims, dims, type, offset
            tensor = cur.string() or ""
            n_dims = int(cur.take("I"))  # type: ignore[call-overload]
            if n_dims > 16:
                raise ValueError(f"tensor {tensor!r} claims {n_dims} dimensions")
            elements = 1
            for _ in range(n_dims):
                elements *= int(cur.take("Q"))  # type: ignore[call-overload]
            params += elements
            cur.take("I")
            cur.take("Q")
            nextn += "nextn" in tensor
    except (ValueError, UnicodeDecodeError) as exc:
        raise LlamaspecError(f"{name} has a corrupt GGUF header: {exc}.") from None
    layers = [v for k, v in kv.items() if k.endswith(MTP_LAYERS_SUFFIX) and v is not None]
    arch = str(kv.get(Keys.General.ARCHITECTURE) or "?")
    shape = tuple(
        (k, _int(kv.get(f"{arch}.{k}")))
        for k in SHAPE_KEYS
        if isinstance(kv.get(f"{arch}.{k}"), int)
    )
    return TokenizerInfo(
        name=name,
        arch=str(kv.get(Keys.General.ARCHITECTURE) or "?"),
        vocab_type=kv.get(Keys.Tokenizer.MODEL),  # type: ignore[arg-type]
        tokens=tuple(kv.get(Keys.Tokenizer.LIST) or ()),  # type: ignore[arg-type]
        bos_id=_int(kv.get(Keys.Tokenizer.BOS_ID)),
        eos_id=_int(kv.get(Keys.Tokenizer.EOS_ID)),
        add_bos=_bool(kv.get(Keys.Tokenizer.ADD_BOS)),
        add_eos=_bool(kv.get(Keys.Tokenizer.ADD_EOS)),
        mtp_layers=_int(layers[0]) if layers else None,
        nextn_tensors=nextn,
        params=params,
        basename=str(kv.get(Keys.General.BASENAME) or ""),
        size_label=str(kv.get(Keys.General.SIZE_LABEL) or ""),
        shape=shape,  # type: ignore[arg-type]
    )


def _int(v: object) -> int | None:
    return None if v is None else int(v)  # type: ignore[call-overload]


def _bool(v: object) -> bool | None:
    return None if v is None else bool(v)


def read_local(path: Path) -> TokenizerInfo:
    """Tokenizer metadata of a local GGUF (only its header is parsed)."""
    if not path.is_file():
        raise LlamaspecError(f"{path} does not exist.")
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, path.name)  # type: ignore[arg-type]
    except ValueError:  # mmap of an empty file
        raise LlamaspecError(f"{path} is empty, not a GGUF file; download it again.") from None
    except _Truncated:
        raise LlamaspecError(
            f"{path} is a truncated or corrupt GGUF: its header ends before the metadata "
            f"does ({path.stat().st_size} bytes). Delete it and download it again."
        ) from None


def read_header(fetch: Callable[[int], bytes], size: int | None, name: str) -> TokenizerInfo:
    """Tokenizer metadata from the first bytes of a file, fetching more until it parses."""
    want = FIRST_READ
    while True:
        data = fetch(want if size is None else min(want, size))
        try:
            return _parse(data, name)
        except _Truncated:
            pass
        complete = len(data) < want or (size is not None and len(data) >= size)
        if complete or want >= MAX_HEADER:
            raise LlamaspecError(
                f"{name} is a truncated or corrupt GGUF: its metadata does not end within "
                f"{len(data)} bytes. Check the file on the hub, or re-download it."
            )
        want *= 4


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


def _same(name: str, what: str, t: object, d: object) -> Rule:
    return Rule(name, t == d, f"{what}: target {t!r} vs draft {d!r}")


def check(target: TokenizerInfo, draft: TokenizerInfo, kind: str = "draft") -> Verdict:
    """Apply the engine's draft/target rules (see FACTS: common_speculative_are_compatible)."""
    rules = [_same("vocab type", "tokenizer.ggml.model", target.vocab_type, draft.vocab_type)]
    rules.append(_same("add BOS", "add_bos_token", target.add_bos, draft.add_bos))
    if target.add_bos:
        rules.append(_same("BOS id", "bos_token_id", target.bos_id, draft.bos_id))
    rules.append(_same("add EOS", "add_eos_token", target.add_eos, draft.add_eos))
    if target.add_eos:
        rules.append(_same("EOS id", "eos_token_id", target.eos_id, draft.eos_id))
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
