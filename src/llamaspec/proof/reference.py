"""Reference models: an F32 copy of a GGUF, on which speculation must be exactly equal.

A quantized model's matrix kernels depend on the batch shape, so verifying a draft batch
can flip a near-tie that decoding one token at a time would not. Dequantized to F32, the
same model gives the same greedy tokens whatever the batch: measured here, speculation on
the F32 copy of the embedded model is token-identical to plain decoding, sequentially and
on parallel slots. Any difference there is a bug, not numerics.

The copy is made and verified by models/derived.py, which the catalog's derived models
(models.yaml `source: derived`) share: the F32 target of pair `gemma3-270m-f32-q4draft` is
this very file.
"""

from __future__ import annotations

from llamaspec.models.derived import (
    Reference,
    check_fits,
    copy_path,
    f32_bytes,
    is_f32,
    reference_copy,
    write_f32,
)

__all__ = [
    "Reference",
    "check_fits",
    "copy_path",
    "f32_bytes",
    "is_f32",
    "reference_copy",
    "write_f32",
]
