"""A GGUF's weight precision, read from its header alone: which verify tier can judge it.

A model whose float tensors are all F32 is its own strict-tier reference; F16 and BF16 widen
to F32 without loss, so their F32 copy is the same model; any quantized tensor makes the
file one the strict tier can only judge through a dequantized copy (models/derived.py).
The header is walked here rather than with gguf's reader, which parses every vocabulary
entry through numpy (about 10 s for Gemma 3's 262k tokens on 2 cores).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from llamaspec.errors import LlamaspecError

FULL = ("F32", "F16", "BF16")  # float types a strict-tier reference can be made of exactly
INTS = ("I8", "I16", "I32", "I64")  # tensors a copy keeps as they are
# GGUF metadata value types (gguf's GGUFValueType): fixed sizes, 8 string, 9 array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Precision:
    """The float tensor types of a GGUF, and the tensor bytes of its F32 copy."""

    types: tuple[str, ...]  # distinct float tensor types, by gguf's names (F32, Q4_K, ...)
    f32_bytes: int

    @property
    def kind(self) -> str:
        """`f32` (its own reference), `half` (F16/BF16: a lossless F32 copy) or `quantized`."""
        if set(self.types) <= {"F32"}:
            return "f32"
        return "half" if set(self.types) <= set(FULL) else "quantized"

    @property
    def quantized(self) -> bool:
        return self.kind == "quantized"

    def describe(self) -> str:
        """E.g. `quantized (F32, Q4_K, Q6_K)`, `F32`, `F16 (F16, F32)`."""
        if self.kind == "f32":
            return "F32"
        half = "/".join(t for t in ("F16", "BF16") if t in self.types)
        name = half if self.kind == "half" else "quantized"
        return f"{name} ({', '.join(self.types)})"


class _Header:
    def __init__(self, data: bytes | mmap.mmap) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> int:
        (v,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def skip_string(self) -> None:
        n = self.take("Q")
        self.pos += n

    def skip_value(self, vtype: int) -> None:
        if vtype == _STRING:
            self.skip_string()
        elif vtype == _ARRAY:
            item, n = self.take("I"), self.take("Q")
            if item in _SIZES:
                n *= _SIZES[item]
                self.pos += n
            else:
                for _ in range(n):
                    self.skip_value(item)
        elif vtype in _SIZES:
            self.pos += _SIZES[vtype]
        else:
            raise ValueError(f"unknown metadata value type {vtype}")


def read_precision(path: Path) -> Precision:
    """The float tensor types of `path` (the first part of a split GGUF: its tensors) and the
    size of its F32 copy, from the header; refused in one paragraph when it cannot be read."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            h = _Header(mm)
            h.pos = 8  # magic, version
            n_tensors, n_kv = h.take("Q"), h.take("Q")
            for _ in range(n_kv):
                h.skip_string()
                h.skip_value(h.take("I"))
            types: set[str] = set()
            total = 0
            for _ in range(n_tensors):
                h.skip_string()
                dims = [h.take("Q") for _ in range(h.take("I"))]
                qtype, _offset = h.take("I"), h.take("Q")
                n = 1
                for d in dims:
                    n *= d
                name = GGMLQuantizationType(qtype).name
                if name in INTS:
                    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
                    total += n // block * size
                else:
                    types.add(name)
                    total += 4 * n
    except (OSError, ValueError, struct.error) as exc:
        raise LlamaspecError(
            f"{path} has a truncated or corrupt GGUF header ({exc}); its tensor types cannot "
            "be read. Download or convert the model again."
        ) from None
    return Precision(tuple(sorted(types)), total)
