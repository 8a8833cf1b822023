"""Small GGUF files written with the real `gguf` package, for compatibility edge cases."""

from __future__ import annotations

import functools
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
    bos: int | None = 1,
    eos: int | None = 2,
    add_bos: bool | None = True,
    add_eos: bool | None = False,
    payload_bytes: int = 4096,
    arch: str = "llama",
    basename: str | None = None,
    pre: str | None = None,
    split: tuple[int, int] | None = None,
) -> Path:
    """A GGUF with tokenizer metadata and one filler tensor of `payload_bytes` (as many
    parameters, int8). A special-token key given as None is left out of the header (the
    engine then uses its default); `pre` writes `tokenizer.ggml.pre`; `split` = (index,
    count) writes the `split.*` keys of that part of a split GGUF (0-based index)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch=arch)
    w.add_name(path.stem)
    if basename:
        w.add_basename(basename)
    if split is not None:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[1])
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    rng = np.random.default_rng(len(tokens) + payload_bytes)
    filler = "filler" if split is None else f"filler.{split[0]}"
    w.add_tensor(filler, rng.integers(0, 255, payload_bytes, dtype=np.uint8).view(np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@functools.cache
def _reader(source: Path):  # parsing a 262k vocabulary takes seconds: once per file
    from gguf import GGUFReader

    return GGUFReader(source)


def tiny_gemma(
    source: Path,
    path: Path,
    *,
    embd: int = 64,
    ff: int = 128,
    layers: int = 1,
    head_dim: int = 64,
    bos: int | None = None,
    seed: int = 0,
) -> Path:
    """A Gemma 3 model that llama-server runs, with `source`'s tokenizer (every
    `tokenizer.*` key copied) and tiny random weights: a draft the engine accepts for
    `source` (acceptance is low: it was never trained). `bos` overrides the BOS id."""
    from gguf import GGUFValueType

    path.parent.mkdir(parents=True, exist_ok=True)
    reader = _reader(source)
    w = GGUFWriter(str(path), arch="gemma3")
    w.add_name(path.stem)
    w.add_basename("gemma-3")
    w.add_context_length(32768)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_sliding_window(512)
    for key, f in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = GGUFValueType(f.types[0])
        sub = GGUFValueType(f.types[-1]) if vtype == GGUFValueType.ARRAY else None
        value = f.contents()
        if key == "tokenizer.ggml.bos_token_id" and bos is not None:
            value = bos
        w.add_key_value(key, value, vtype, sub_type=sub)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(n_vocab, embd).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(embd, np.float32))
    for i in range(layers):
        b = f"blk.{i}."
        for name, shape in (
            ("attn_q.weight", (head_dim, embd)),
            ("attn_k.weight", (head_dim, embd)),
            ("attn_v.weight", (head_dim, embd)),
            ("attn_output.weight", (embd, head_dim)),
            ("ffn_gate.weight", (ff, embd)),
            ("ffn_up.weight", (ff, embd)),
            ("ffn_down.weight", (embd, ff)),
        ):
            w.add_tensor(b + name, rand(*shape))
        for name, n in (
            ("attn_norm.weight", embd),
            ("attn_q_norm.weight", head_dim),
            ("attn_k_norm.weight", head_dim),
            ("post_attention_norm.weight", embd),
            ("ffn_norm.weight", embd),
            ("post_ffw_norm.weight", embd),
        ):
            w.add_tensor(b + name, np.ones(n, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
