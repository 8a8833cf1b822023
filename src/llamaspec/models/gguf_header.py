"""Reading a GGUF header: the key/values and tensor infos llamaspec judges a model by,
without loading its weights.

The tokenizer metadata sits in the header (key/value section), before the tensor infos and
the weights, so a remote file is read from its first megabytes: `read_header` takes any
`fetch(n)` that returns the file's first n bytes (a local read or an HTTP range). The tensor
infos (names, shapes) follow the key/values; their names tell whether a file carries MTP
heads (`nextn` tensors), which an MTP recipe needs. A split GGUF (`…-00001-of-0000N.gguf`,
`split.count` in its header) is measured over all its parts. What the header means for a
pair is models/compat.py's (and models/heads.py's) to judge.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGUF_MAGIC, READER_SUPPORTED_VERSIONS, GGUFValueType, Keys

from llamaspec.errors import LlamaspecError

FIRST_READ = 4 << 20  # the first range read of a file's header
PART_READ = 256 << 10  # of a split GGUF's later parts (a few key/values and tensor infos)
MAX_HEADER = 256 << 20  # no header is read past this many bytes
# a part of a split GGUF, as llama.cpp's gguf-split names them
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
MTP_LAYERS_SUFFIX = ".nextn_predict_layers"
# the per-block MTP tensors (src/llama-arch.cpp: `blk.%d.nextn.eh_proj`, `.embed_tokens`,
# `.enorm`, `.hnorm`, `.shared_head_head`, `.shared_head_norm`)
NEXTN_TENSOR = re.compile(r"^blk\.(\d+)\.nextn\.")
# `<arch>.…` keys EAGLE-3 heads and Gemma 4 assistants are judged by (models/heads.py)
HEAD_KEYS = ("target_layers", "target_hidden_size", "embedding_length_out")
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
    vocab_type: str | None  # `tokenizer.ggml.model` as written (see `engine_vocab`)
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
    pre: str | None = None  # `tokenizer.ggml.pre`, the BPE pre-tokenizer
    split_count: int = 1  # `split.count`: the parts of a split GGUF (params counts them all)
    nextn_blocks: tuple[int, ...] = ()  # blocks with `blk.N.nextn.*` tensors
    target_layers: tuple[int, ...] = ()  # eagle3: `<arch>.target_layers` (extract layers)
    target_hidden: int | None = None  # eagle3: `<arch>.target_hidden_size`
    embd_out: int | None = None  # `<arch>.embedding_length_out` (assistant: the target's width)
    d2t: int | None = None  # eagle3: entries of its `d2t` tensor (draft → target vocab map)
    nbytes: int | None = None  # this file's tensor bytes (None: a type gguf does not know)

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


class _Truncated(Exception): ...


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
    Keys.Tokenizer.PRE,
    Keys.Split.LLM_KV_SPLIT_COUNT,
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


MAGIC = GGUF_MAGIC.to_bytes(4, "little")  # the first four bytes of every GGUF file


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
                or str(key).partition(".")[2] in HEAD_KEYS
            )
            kv[key] = cur.value(vtype, keep)  # type: ignore[index]
        nextn = params = nbytes = 0  # nbytes -1: a tensor type the gguf package lacks
        blocks: set[int] = set()
        d2t: int | None = None
        for _ in range(n_tensors):  # tensor infos: name, n_dims, dims, type, offset
            tensor = cur.string() or ""
            n_dims = int(cur.take("I"))  # type: ignore[call-overload]
            if n_dims > 16:
                raise ValueError(f"tensor {tensor!r} claims {n_dims} dimensions")
            dims = [int(cur.take("Q")) for _ in range(n_dims)]  # type: ignore[call-overload]
            params += (n := math.prod(dims))
            size = GGML_QUANT_SIZES.get(int(cur.take("I")))  # type: ignore[call-overload]
            cur.take("Q")
            nbytes = -1 if nbytes < 0 or size is None else nbytes + n // size[0] * size[1]
            nextn += "nextn" in tensor
            if m := NEXTN_TENSOR.match(tensor):
                blocks.add(int(m[1]))
            if tensor == "d2t" and dims:
                d2t = dims[0]
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
        pre=_str(kv.get(Keys.Tokenizer.PRE)),
        split_count=max(_int(kv.get(Keys.Split.LLM_KV_SPLIT_COUNT)) or 1, 1),
        nextn_blocks=tuple(sorted(blocks)),
        target_layers=tuple(int(x) for x in (kv.get(f"{arch}.target_layers") or ())),  # type: ignore[attr-defined]
        target_hidden=_int(kv.get(f"{arch}.target_hidden_size")),
        embd_out=_int(kv.get(f"{arch}.embedding_length_out")),
        d2t=d2t,
        nbytes=None if nbytes < 0 else nbytes,
    )


def _int(v: object) -> int | None:
    return None if v is None else int(v)  # type: ignore[call-overload]


def _bool(v: object) -> bool | None:
    return None if v is None else bool(v)


def _str(v: object) -> str | None:
    return None if v is None else str(v)


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


# `fetch(start, end)`: the file's bytes start..end-1 (fewer where the file ends there)
Fetch = Callable[[int, int], bytes]


def read_header(
    fetch: Fetch, size: int | None, name: str, first: int | None = None
) -> TokenizerInfo:
    """Tokenizer metadata from the first bytes of a file (`first`, FIRST_READ by default).

    While the metadata runs on past what was read, the read grows 4x, fetching only the
    bytes after those already read (each byte once), up to MAX_HEADER."""
    data = bytearray()
    want = first or FIRST_READ
    while True:
        end = want if size is None else min(want, size)
        ended = False
        if end > len(data):
            got = fetch(len(data), end)[: end - len(data)]
            ended = len(got) < end - len(data)
            data += got
        try:
            return _parse(bytes(data), name)
        except _Truncated:
            pass
        complete = ended or (size is not None and len(data) >= size)
        if complete or want >= MAX_HEADER:
            raise LlamaspecError(
                f"{name} is a truncated or corrupt GGUF: its metadata does not end within "
                f"{len(data)} bytes. Check the file on the hub, or re-download it."
            )
        want = min(want * 4, MAX_HEADER)


def part_names(file: str, count: int, name: str) -> tuple[str, ...]:
    """Every part of a split GGUF whose header says `split.count` = count, named as
    llama.cpp's gguf-split names them (`PREFIX-00001-of-0000N.gguf`); `file` is one of them."""
    m = SPLIT_NAME.match(file)
    if not m or int(m["count"]) != count:
        raise LlamaspecError(
            f"{name} is one of {count} parts of a split GGUF (split.count in its header), but "
            f"its name does not end in -0000i-of-{count:05d}.gguf, so the other parts cannot "
            "be found. Keep the names gguf-split gave the parts."
        )
    return tuple(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1))


def read_split(
    info: TokenizerInfo, file: str, read_part: Callable[[str], TokenizerInfo]
) -> TokenizerInfo:
    """`info` (the header of `file`) with the parameters and nextn tensors of every part of
    its split counted (one header read per other part, by `read_part(name)`)."""
    if info.split_count <= 1:
        return info
    names = part_names(file, info.split_count, info.name)
    if names[0] != file:
        raise LlamaspecError(
            f"{info.name} is part {names.index(file) + 1} of {len(names)} of a split GGUF; "
            f"give its first part, {names[0]} (the tokenizer is in that part's header)."
        )
    rest = [read_part(part) for part in names[1:]]
    return replace(
        info,
        params=info.params + sum(r.params for r in rest),
        nextn_tensors=info.nextn_tensors + sum(r.nextn_tensors for r in rest),
        nextn_blocks=tuple(sorted({b for r in (info, *rest) for b in r.nextn_blocks})),
    )


def read_local_split(path: Path) -> TokenizerInfo:
    """`read_local`, with every part of a split GGUF counted (the parts side by side)."""

    def part(name: str) -> TokenizerInfo:
        other = path.with_name(name)
        if not other.is_file():
            raise LlamaspecError(
                f"{path.name} is the first of a split GGUF, but its part {other} is missing. "
                "Put every part in the same directory."
            )
        return read_local(other)

    return read_split(read_local(path), path.name, part)
