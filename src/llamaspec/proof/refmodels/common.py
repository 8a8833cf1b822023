"""What the random-weight reference models (and `hybrid_gguf`) share: the character-level
vocabulary and the tokenizer keys that describe it, the weight draws from a numpy
generator, and the last steps of a GGUFWriter.

Every family draws its tensors in its own fixed order from its own generator, so these
helpers take the generator as their first argument and draw exactly what the families'
own copies drew: the files' bytes do not depend on which module holds the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# SentencePiece token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


def vocabulary() -> tuple[list[str], list[int]]:
    """<unk> <s> </s>, newline and tab as byte tokens, `▁` for space, printable ASCII."""
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0x09>", "\u2581"]
    types = [UNKNOWN, CONTROL, CONTROL, BYTE, BYTE, NORMAL]
    for code in range(0x21, 0x7F):
        tokens.append(chr(code))
        types.append(NORMAL)
    return tokens, types


def add_tokenizer(
    w: Any,
    tokens: list[str],
    types: list[int],
    *,
    add_bos: bool = False,
    mask_id: int | None = None,
) -> None:
    """The tokenizer keys of a character-level vocabulary (SentencePiece-style `llama`
    model, zero scores, <s> </s> <unk> at 1 2 0, optionally a mask token) into the
    GGUFWriter `w`, in this order."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    if mask_id is not None:
        w.add_mask_token_id(mask_id)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)


def dense(rng: Any, rows: int, cols: int, gain: float = 1.0) -> Any:
    """(rows, cols) = GGUF shape [cols, rows]: `cols` inputs, unit-variance outputs (times
    `gain`), F32, drawn from `rng`."""
    import numpy as np

    return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)


def norm(rng: Any, n: int, gain: float = 1.0, *, spread: float) -> Any:
    """A norm weight near `gain`: gain * (1 + spread * N(0, 1)), F32, drawn from `rng`."""
    import numpy as np

    return (gain * (1.0 + spread * rng.standard_normal(n))).astype(np.float32)


def finish(w: Any) -> None:
    """Write the header, the keys and the tensors of the GGUFWriter `w`, and close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_layer(
    dense: Callable[..., Any],
    norm: Callable[..., Any],
    blk: str,
    n_embd: int,
    n_ff: int,
    gain: float,
) -> dict[str, Any]:
    """One llama decoder layer `blk` (`blk.N`) with square attention projections (heads
    times head size = `n_embd`), drawn in this order from `dense` and `norm` (a family's
    draws bound to its generator); `gain` on the attention output and FFN down projections."""
    return {
        f"{blk}.attn_norm.weight": norm(n_embd),
        f"{blk}.attn_q.weight": dense(n_embd, n_embd),
        f"{blk}.attn_k.weight": dense(n_embd, n_embd),
        f"{blk}.attn_v.weight": dense(n_embd, n_embd),
        f"{blk}.attn_output.weight": dense(n_embd, n_embd, gain),
        f"{blk}.ffn_norm.weight": norm(n_embd),
        f"{blk}.ffn_gate.weight": dense(n_ff, n_embd),
        f"{blk}.ffn_up.weight": dense(n_ff, n_embd),
        f"{blk}.ffn_down.weight": dense(n_embd, n_ff, gain),
    }
