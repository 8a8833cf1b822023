"""A random Qwen3.5-style hybrid model written with the `gguf` package, for ik_llama.cpp.

Upstream's `test-llama-archs` model does not load in ik_llama.cpp: it uses a tokenizer
type (`test`) and per-tensor scale tensors ik does not know, and marks its recurrent layers
with a list where ik reads `full_attention_interval`. This writes the same kind of model in
the layout ik's `qwen35` loader reads: gated delta-net (recurrent) layers and full
attention layers, F32 weights, a character-level SentencePiece-style vocabulary of
printable ASCII. Weights are drawn from numpy's PCG64 with a fixed seed, so a seed gives
the same file on every machine; another seed gives a model with other weights (a draft
whose tokens are mostly rejected).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

from llamaspec.paths import cache_dir
from llamaspec.proof.refmodels import common

VERSION = 1  # bump when the layout or the weights change: the cache directory follows it
N_EMBD, N_LAYER, N_FF, ATTN_EVERY = 256, 4, 384, 2  # layers 1 and 3 attend; 0 and 2 recur
N_HEAD, HEAD_DIM = 2, 128
SSM_STATE, SSM_GROUPS, SSM_V_HEADS, SSM_CONV = 128, 2, 2, 4
CONTEXT = 4096


def hybrid_gguf(seed: int = 1, say: Callable[[str], None] | None = None) -> Path:
    """The model for `seed`, written once into the llamaspec cache."""
    out = cache_dir() / "models" / f"qwen35-hybrid-gguf-v{VERSION}-seed{seed}"
    path = out / "qwen35-hybrid.gguf"
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tmp-{os.getpid()}-{path.name}"
    write(tmp, seed)
    os.replace(tmp, path)
    if say:
        say(f"hybrid: wrote {path} ({path.stat().st_size / 1e6:.1f} MB, seed {seed}, gguf)")
    return path


def write(path: Path, seed: int) -> None:
    import numpy as np
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    tokens, types = common.vocabulary()
    n_vocab = len(tokens)
    dense = functools.partial(common.dense, rng)
    norm = functools.partial(common.norm, rng, spread=0.1)

    w = GGUFWriter(str(path), arch="qwen35")
    w.add_name(f"llamaspec random qwen35 hybrid (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_array("qwen35.rope.dimension_sections", [32, 32, 32, 32])
    w.add_ssm_conv_kernel(SSM_CONV)
    w.add_ssm_inner_size(SSM_STATE * SSM_V_HEADS)
    w.add_ssm_state_size(SSM_STATE)
    w.add_ssm_time_step_rank(SSM_V_HEADS)
    w.add_ssm_group_count(SSM_GROUPS)
    w.add_uint32("qwen35.full_attention_interval", ATTN_EVERY)
    common.add_tokenizer(w, tokens, types)

    key_dim, value_dim = SSM_STATE * SSM_GROUPS, SSM_STATE * SSM_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    # logits a few units apart: greedy choices are clear, not near-ties
    w.add_tensor("output.weight", dense(n_vocab, N_EMBD, gain=3.0))
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        w.add_tensor(f"{blk}.attn_norm.weight", norm(N_EMBD))
        w.add_tensor(f"{blk}.post_attention_norm.weight", norm(N_EMBD))
        if (i + 1) % ATTN_EVERY != 0:  # gated delta-net layer
            w.add_tensor(f"{blk}.attn_qkv.weight", dense(conv_dim, N_EMBD))
            w.add_tensor(f"{blk}.attn_gate.weight", dense(value_dim, N_EMBD))
            w.add_tensor(f"{blk}.ssm_conv1d.weight", dense(conv_dim, SSM_CONV))
            w.add_tensor(
                f"{blk}.ssm_dt.bias", (0.1 * rng.standard_normal(SSM_V_HEADS)).astype(np.float32)
            )
            w.add_tensor(f"{blk}.ssm_a", -rng.uniform(0.5, 2.0, SSM_V_HEADS).astype(np.float32))
            w.add_tensor(f"{blk}.ssm_beta.weight", dense(SSM_V_HEADS, N_EMBD))
            w.add_tensor(f"{blk}.ssm_alpha.weight", dense(SSM_V_HEADS, N_EMBD))
            w.add_tensor(f"{blk}.ssm_norm.weight", norm(SSM_STATE))
            w.add_tensor(f"{blk}.ssm_out.weight", dense(N_EMBD, value_dim))
        else:  # full attention with an output gate (q and gate share attn_q)
            w.add_tensor(f"{blk}.attn_q.weight", dense(2 * N_HEAD * HEAD_DIM, N_EMBD))
            w.add_tensor(f"{blk}.attn_k.weight", dense(N_HEAD * HEAD_DIM, N_EMBD))
            w.add_tensor(f"{blk}.attn_v.weight", dense(N_HEAD * HEAD_DIM, N_EMBD))
            w.add_tensor(f"{blk}.attn_output.weight", dense(N_EMBD, N_HEAD * HEAD_DIM))
            w.add_tensor(f"{blk}.attn_q_norm.weight", norm(HEAD_DIM))
            w.add_tensor(f"{blk}.attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(f"{blk}.ffn_gate.weight", dense(N_FF, N_EMBD))
        w.add_tensor(f"{blk}.ffn_up.weight", dense(N_FF, N_EMBD))
        w.add_tensor(f"{blk}.ffn_down.weight", dense(N_EMBD, N_FF))
    common.finish(w)
