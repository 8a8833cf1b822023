"""Small GGUF files written with the real `gguf` package, for compatibility edge cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter


def vocab(n: int, *, change: dict[int, str] | None = None) -> list[str]:
    tokens = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] + [f"tok{i}" for i in range(5, n)]
    for i, text in (change or {}).items():
        tokens[i] = text
    return tokens


def write_gguf(
    path: Path,
    tokens: list[str],
    *,
    model: str = "llama",
    bos: int = 1,
    eos: int = 2,
    add_bos: bool = True,
    add_eos: bool = False,
    payload_bytes: int = 4096,
    arch: str = "llama",
    basename: str | None = None,
) -> Path:
    """A GGUF with tokenizer metadata and one filler tensor of `payload_bytes` (as many
    parameters, int8)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch=arch)
    w.add_name(path.stem)
    if basename:
        w.add_basename(basename)
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    rng = np.random.default_rng(len(tokens) + payload_bytes)
    w.add_tensor("filler", rng.integers(0, 255, payload_bytes, dtype=np.uint8).view(np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
