"""Full-precision copies of a GGUF, made here from a verified file and verified in turn.

One mechanism serves two users. The strict tier's reference model (proof/reference.py) is
the F32 copy of the model under test: a quantized model's matrix kernels depend on the batch
shape, so verifying a draft batch can flip a near-tie that decoding one token at a time
would not; dequantized to F32, the same model gives the same greedy tokens whatever the
batch. And a catalog model with `source: derived` (models.yaml) is the same copy, made on
first use, whose sha256 models.yaml records: the embedded Gemma 3 270M in F32 is the target
of a real draft pair, drafted for by its own Q4_K_M.

The copy is made with the `gguf` package (every tensor dequantized, every metadata key
copied except `general.file_type`), written to a temporary file, hashed, and recorded next
to it; it is re-hashed on every use and rebuilt when missing or changed. It is named by
`config.derived_name` (source stem, the source's sha256, the dtype).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llamaspec.config import derived_name
from llamaspec.engine.sources import sha256_file
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

Say = Callable[[str], None]
# (tensors done, tensors in all): called as each tensor is converted
Tick = Callable[[int, int], None]
DISK_MARGIN = 1 << 30
DTYPE_BYTES = 4  # bytes per weight in a copy (F32, the one dtype made)
# Keys the writer sets itself, or that would describe the source's quantization.
SKIP_KEYS = ("GGUF.", "general.architecture", "general.file_type")


@dataclass(frozen=True)
class Reference:
    """An F32 copy of `source` and the digests that tie the two together."""

    path: Path
    source_name: str
    source_sha256: str
    sha256: str
    size: int


def f32_bytes(source: Path) -> int:
    """The size of the F32 copy of `source` (tensor data; the header adds little)."""
    from gguf import GGUFReader

    reader = _reader(source, GGUFReader)
    total = 0
    for t in reader.tensors:
        n = int(t.n_elements)
        total += n * 4 if _is_float(t.tensor_type) else int(t.n_bytes)
    return total


def _reader(source: Path, cls):
    try:
        return cls(source, "r")
    except (ValueError, OSError) as exc:
        raise LlamaspecError(
            f"{source} cannot be read as a GGUF file ({exc}); a reference copy needs a valid "
            "model file. Check the path, or download the model again."
        ) from None


def _is_float(qtype: object) -> bool:
    from gguf import GGMLQuantizationType as Q

    return qtype not in (Q.I8, Q.I16, Q.I32, Q.I64)


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(source: Path, where: Path, need: int | None = None) -> int:
    """Refuse, before writing anything, a copy that does not fit on disk or in memory."""
    need = f32_bytes(source) if need is None else need
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    gib = 1 << 30
    if need + DISK_MARGIN > free:
        raise LlamaspecError(
            f"An F32 reference copy of {source.name} needs {need / gib:.2f} GiB (plus "
            f"{DISK_MARGIN / gib:.0f} GiB headroom) but {where} has {free / gib:.2f} GiB free. "
            "Free some space or set LLAMASPEC_CACHE to a larger disk; run the oracle tier "
            "(without --strict) to verify without a reference copy."
        )
    mem = _mem_available()
    if mem is not None and need > mem:
        raise LlamaspecError(
            f"An F32 reference copy of {source.name} needs {need / gib:.2f} GiB of memory to "
            f"serve, but only {mem / gib:.2f} GiB is available. The strict tier needs the whole "
            "model in F32; verify this model with the oracle tier (without --strict) instead."
        )
    return need


def is_f32(source: Path) -> bool:
    """Whether every float tensor of `source` is already F32 (then it is its own reference)."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = _reader(source, GGUFReader)
    return all(
        t.tensor_type == GGMLQuantizationType.F32
        for t in reader.tensors
        if _is_float(t.tensor_type)
    )


def copies_dir() -> Path:
    """Where copies are kept (in the cache; a model's copy is `derived_name` there)."""
    return cache_dir() / "models" / "reference"


def copy_path(source: Path, source_sha256: str) -> Path:
    """Where the F32 copy of `source` (whose sha256 is `source_sha256`) is kept."""
    return copies_dir() / derived_name(source.name, source_sha256)


def recorded_sha256(path: Path) -> str | None:
    """The sha256 recorded next to a copy when it was made (None: no readable record)."""
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    digest = meta.get("sha256") if isinstance(meta, dict) else None
    return digest if isinstance(digest, str) else None


def reference_copy(
    source: Path, source_sha256: str, say: Say = lambda _m: None, tick: Tick | None = None
) -> Reference:
    """The verified F32 copy of `source` (made once, checked on every use); a model that is
    F32 already is its own reference. `tick` follows the conversion tensor by tensor."""
    if is_f32(source):
        say(f"reference: {source.name} is F32 already; it is its own reference")
        return Reference(source, source.name, source_sha256, source_sha256, source.stat().st_size)
    dest = copy_path(source, source_sha256)
    record = dest.with_suffix(".json")
    if dest.is_file() and record.is_file():
        try:  # a truncated or unreadable record is a mismatch: the copy is made again
            meta = json.loads(record.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            meta = {}
        meta = meta if isinstance(meta, dict) else {}
        if meta.get("source_sha256") == source_sha256 and sha256_file(dest) == meta.get("sha256"):
            return Reference(dest, source.name, source_sha256, meta["sha256"], meta["size"])
        say(f"reference: {dest.name} does not match its record; making it again")
    need = check_fits(source, dest.parent)
    say(f"reference: writing an F32 copy of {source.name} ({need / (1 << 30):.2f} GiB)")
    tmp = dest.with_name(f".tmp-{os.getpid()}-{dest.name}")
    try:
        write_f32(source, tmp, tick)
        digest = sha256_file(tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    size = dest.stat().st_size
    meta = {"source": source.name, "source_sha256": source_sha256, "sha256": digest, "size": size}
    tmp_record = record.with_name(f".tmp-{os.getpid()}-{record.name}")
    tmp_record.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp_record, record)
    say(f"reference: {dest.name} sha256 {digest[:16]}… ({size / 1e9:.2f} GB)")
    return Reference(dest, source.name, source_sha256, digest, size)


def write_f32(source: Path, dest: Path, tick: Tick | None = None) -> None:
    """Dequantize every float tensor of `source` to F32 and write a GGUF with its metadata."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = _reader(source, GGUFReader)
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise LlamaspecError(f"{source} has no general.architecture; it is not a model GGUF.")
    writer = GGUFWriter(dest, str(arch_field.contents()))
    for name, field in reader.fields.items():
        if name.startswith(SKIP_KEYS):
            continue
        vtype = GGUFValueType(field.types[0])
        sub = None
        if vtype == GGUFValueType.ARRAY:
            if len(field.types) < 2:
                continue  # an empty array: the gguf writer cannot write one, and it says nothing
            sub = GGUFValueType(field.types[1])
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(0)  # all F32
    for i, t in enumerate(reader.tensors):
        if _is_float(t.tensor_type):
            data = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            writer.add_tensor(t.name, np.ascontiguousarray(data))
        else:
            writer.add_tensor(
                t.name, np.asarray(t.data), raw_dtype=GGMLQuantizationType(t.tensor_type)
            )
        if tick is not None:
            tick(i + 1, len(reader.tensors))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
