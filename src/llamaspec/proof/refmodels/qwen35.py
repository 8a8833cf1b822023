"""Tiny random Qwen3.5/3.6-style hybrids with one NextN (MTP) block: dense `qwen35` (the
layout of Qwen3.6-27B) and `qwen35moe` (Qwen3.5/3.6 MoE), for `--spec-type draft-mtp`.

These are the architectures most users run speculation on, and the only reference families
whose target is recurrent: every rejected MTP draft makes the engine roll the gated delta
net state back to the last accepted token (`llm_arch_supports_rs_rollback`, `n_rs_seq`
snapshots per sequence), a path no attention-only family reaches.

Layout, as the pinned loaders read it (`src/models/qwen35.cpp`, `src/models/qwen35moe.cpp`):
`block_count` counts 4 trunk blocks and the NextN block, `nextn_predict_layers` = 1 marks the
last one. With `full_attention_interval` = 4 (as Qwen3.6-27B's 64 layers) blocks 0-2 are
gated delta net layers (`attn_qkv`, `attn_gate`, `ssm_conv1d`, `ssm_dt`, `ssm_a`,
`ssm_beta`, `ssm_alpha`, `ssm_norm`, `ssm_out`; 2 key heads and 4 value heads of 16, a
4-tap convolution) and block 3 is gated full attention (`attn_q` holds query and gate,
q/k norms, 2 query heads of 32 over 1 KV head, interleaved M-RoPE on 16 of 32 dims). Every
block has `post_attention_norm`; its FFN is a dense SwiGLU (qwen35) or 4 routed experts with
2 used (softmax) plus a sigmoid-gated shared expert (qwen35moe). The NextN block is a
full-attention block of the same kind with `nextn.eh_proj`, `enorm`, `hnorm` and
`shared_head_norm`; like a converted Qwen3.5 checkpoint it has no `embed_tokens` or
`shared_head_head`, so it reads the target's embedding and output head. Character-level
SentencePiece-style vocabulary of printable ASCII; F32 weights from numpy's PCG64 with the
seed.

Acceptance: the target is nearly a bigram model. Its residual branches (the delta net's
`ssm_out`, attention output, FFN down projections) carry small gains, so the stream is
dominated by the token embedding and a well-separated output head picks the next token
mostly from the current one; the recurrent and attention branches tip close calls with
context. The NextN block passes the normalised embedding of the token it is fed through
`eh_proj` (identity on the embedding half, a faint copy of the hidden-state half), its own
branches carry tiny gains, and it shares the target's head: it drafts the target's bigram
choice, accepted where the target follows it and rejected where context tipped it, so
acceptance is partial and rollback runs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from llamaspec.proof.refmodels import RefPair, Say, cached, common

VERSION = 1  # bump when the layout or the weights change: the cache key follows it
DENSE, MOE = "qwen35", "qwen35moe"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 2, 1, 32
N_ROT, ROPE_SECTIONS = 16, (3, 3, 2, 0)  # interleaved M-RoPE; text positions: one for all
N_TRUNK, N_NEXTN, ATTN_EVERY = 4, 1, 4  # blocks 0-2 delta net, 3 attention, 4 NextN
SSM_STATE, SSM_GROUPS, SSM_V_HEADS, SSM_CONV = 16, 2, 4, 4
N_FF = 128  # qwen35: the dense SwiGLU
N_FF_EXP, N_FF_SHEXP, N_EXPERT, N_EXPERT_USED = 32, 32, 4, 2  # qwen35moe
CONTEXT = 16384
# gains: the residual branches' output projections in the trunk and in the NextN block,
# the hidden-state half of eh_proj, and the output head (logits in units)
TRUNK_GAIN, NEXTN_GAIN, HIDDEN_GAIN, HEAD_GAIN = 0.2, 0.02, 0.05, 3.0
N_SPECIAL = 3  # <unk> <s> </s>: never predicted (zero rows in the output head)

HOW = (
    "{name}: a tiny random-weight Qwen3.5/3.6-style hybrid (arch {arch}, width 64; blocks "
    "0-2 gated delta net (recurrent), block 3 gated full attention "
    "(full_attention_interval = 4), each with {ffn}; block 4 the NextN block, "
    "nextn_predict_layers = 1, sharing the target's embedding and output head as a converted "
    "Qwen3.5 checkpoint does), F32, written with the gguf package from numpy's PCG64 (seed "
    "{seed}), a character-level vocabulary. The trunk's branch outputs carry small gains, "
    "so the target is nearly a bigram model with a clear random output head, now and then "
    "tipped by context; the NextN block passes the normalised embedding of the token it is "
    "fed through eh_proj, so it drafts the target's bigram choice: some drafts are "
    "accepted and the rest rejected, and every rejection rolls the recurrent state back. "
    "Read by upstream's src/models/{arch}.cpp (draft-mtp on the target's own NextN block)."
)
FFN_WHAT = {DENSE: "a dense SwiGLU FFN", MOE: "4 routed experts (2 used) and a shared expert"}


def pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The dense `qwen35` target with its NextN head (MTP drafts with the target's block)."""
    return _pair("qwen35-mtp", DENSE, seed, say)


def moe_pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The `qwen35moe` target with its NextN head."""
    return _pair("qwen35moe-mtp", MOE, seed, say)


def _pair(name: str, arch: str, seed: int, say: Say | None) -> RefPair:
    target = cached(name, VERSION, seed, f"{name}.gguf", lambda p: write(p, seed, arch), say)
    how = HOW.format(name=name, arch=arch, ffn=FFN_WHAT[arch], seed=seed)
    return RefPair(name=name, target=target, draft=None, spec_types=("mtp",), how=how)


def write(path: Path, seed: int, arch: str = DENSE) -> None:
    """The F32 model of `arch` (qwen35 or qwen35moe) for `seed` at `path` (same seed and
    arch, same bytes)."""
    import numpy as np
    from gguf import GGUFWriter

    if arch not in FFN_WHAT:
        raise ValueError(f"no Qwen3.5 reference of arch {arch!r}")
    rng = np.random.default_rng(seed)
    tokens, types = common.vocabulary()
    n_vocab = len(tokens)
    f32 = np.float32
    dense = functools.partial(common.dense, rng)
    norm = functools.partial(common.norm, rng, spread=0.05)
    n_all = N_TRUNK + N_NEXTN

    w = GGUFWriter(str(path), arch=arch)
    w.add_name(f"llamaspec random {arch} with MTP (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_all)
    w.add_uint32(f"{arch}.nextn_predict_layers", N_NEXTN)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(N_ROT)
    w.add_array(f"{arch}.rope.dimension_sections", list(ROPE_SECTIONS))
    w.add_rope_freq_base(10000.0)
    w.add_ssm_conv_kernel(SSM_CONV)
    w.add_ssm_inner_size(SSM_STATE * SSM_V_HEADS)
    w.add_ssm_state_size(SSM_STATE)
    w.add_ssm_time_step_rank(SSM_V_HEADS)
    w.add_ssm_group_count(SSM_GROUPS)
    w.add_uint32(f"{arch}.full_attention_interval", ATTN_EVERY)
    if arch == DENSE:
        w.add_feed_forward_length(N_FF)
    else:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_expert_feed_forward_length(N_FF_EXP)
        w.add_expert_shared_feed_forward_length(N_FF_SHEXP)
    common.add_tokenizer(w, tokens, types)

    embd = rng.standard_normal((n_vocab, N_EMBD)).astype(f32)
    out_norm = norm(N_EMBD)
    head = dense(n_vocab, N_EMBD, gain=HEAD_GAIN)
    head[:N_SPECIAL] = 0.0  # logit 0 for <unk> <s> </s>: greedy outputs run full length
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", out_norm)
    w.add_tensor("output.weight", head)
    for i in range(n_all):
        blk = f"blk.{i}"
        nextn = i >= N_TRUNK
        gain = NEXTN_GAIN if nextn else TRUNK_GAIN
        tensors = {
            f"{blk}.attn_norm.weight": norm(N_EMBD),
            f"{blk}.post_attention_norm.weight": norm(N_EMBD),
        }
        if not nextn and (i + 1) % ATTN_EVERY != 0:
            tensors |= _delta_net(rng, dense, norm, blk, gain)
        else:
            tensors |= _attention(dense, norm, blk, gain)
        if arch == DENSE:
            tensors |= {
                f"{blk}.ffn_gate.weight": dense(N_FF, N_EMBD),
                f"{blk}.ffn_up.weight": dense(N_FF, N_EMBD),
                f"{blk}.ffn_down.weight": dense(N_EMBD, N_FF, gain),
            }
        else:
            tensors |= _experts(rng, dense, blk, gain)
        if nextn:
            # [embedding half | hidden-state half] -> width: the token's embedding passes
            # through, the target's hidden state is mixed in faintly
            eye = np.eye(N_EMBD, dtype=f32)
            tensors |= {
                f"{blk}.nextn.eh_proj.weight": np.concatenate(
                    [eye, dense(N_EMBD, N_EMBD, HIDDEN_GAIN)], axis=1
                ),
                f"{blk}.nextn.enorm.weight": np.ones(N_EMBD, dtype=f32),
                f"{blk}.nextn.hnorm.weight": np.ones(N_EMBD, dtype=f32),
                f"{blk}.nextn.shared_head_norm.weight": out_norm.copy(),
            }
        for name, data in tensors.items():
            w.add_tensor(name, data)
    common.finish(w)


def _delta_net(rng: Any, dense: Any, norm: Any, blk: str, gain: float) -> dict[str, Any]:
    """A gated delta net (linear attention) layer: the fused q/k/v and the z gate in, the
    causal convolution, decay (`ssm_a`, `ssm_dt`, `ssm_alpha`), write strength (`ssm_beta`),
    the gated norm and the output projection (`gain`)."""
    import numpy as np

    key_dim, value_dim = SSM_STATE * SSM_GROUPS, SSM_STATE * SSM_V_HEADS
    conv_dim = 2 * key_dim + value_dim
    return {
        f"{blk}.attn_qkv.weight": dense(conv_dim, N_EMBD),
        f"{blk}.attn_gate.weight": dense(value_dim, N_EMBD),
        f"{blk}.ssm_conv1d.weight": dense(conv_dim, SSM_CONV),
        f"{blk}.ssm_dt.bias": (0.1 * rng.standard_normal(SSM_V_HEADS)).astype(np.float32),
        f"{blk}.ssm_a": -rng.uniform(0.5, 2.0, SSM_V_HEADS).astype(np.float32),  # -exp(A_log)
        f"{blk}.ssm_beta.weight": dense(SSM_V_HEADS, N_EMBD),
        f"{blk}.ssm_alpha.weight": dense(SSM_V_HEADS, N_EMBD),
        f"{blk}.ssm_norm.weight": norm(SSM_STATE),
        f"{blk}.ssm_out.weight": dense(N_EMBD, value_dim, gain),
    }


def _attention(dense: Any, norm: Any, blk: str, gain: float) -> dict[str, Any]:
    """Gated full attention: `attn_q` yields query and output gate per head."""
    return {
        f"{blk}.attn_q.weight": dense(2 * N_HEAD * HEAD_DIM, N_EMBD),
        f"{blk}.attn_k.weight": dense(N_HEAD_KV * HEAD_DIM, N_EMBD),
        f"{blk}.attn_v.weight": dense(N_HEAD_KV * HEAD_DIM, N_EMBD),
        f"{blk}.attn_output.weight": dense(N_EMBD, N_HEAD * HEAD_DIM, gain),
        f"{blk}.attn_q_norm.weight": norm(HEAD_DIM),
        f"{blk}.attn_k_norm.weight": norm(HEAD_DIM),
    }


def _experts(rng: Any, dense: Any, blk: str, gain: float) -> dict[str, Any]:
    """Routed experts (softmax router, `N_EXPERT_USED` of `N_EXPERT`) and the shared
    expert with its sigmoid gate; down projections carry `gain`."""
    import numpy as np

    def experts(rows: int, cols: int, g: float = 1.0) -> Any:
        draw = rng.standard_normal((N_EXPERT, rows, cols)) * g / np.sqrt(cols)
        return draw.astype(np.float32)

    return {
        f"{blk}.ffn_gate_inp.weight": dense(N_EXPERT, N_EMBD),
        f"{blk}.ffn_gate_exps.weight": experts(N_FF_EXP, N_EMBD),
        f"{blk}.ffn_up_exps.weight": experts(N_FF_EXP, N_EMBD),
        f"{blk}.ffn_down_exps.weight": experts(N_EMBD, N_FF_EXP, gain),
        f"{blk}.ffn_gate_inp_shexp.weight": dense(1, N_EMBD)[0],
        f"{blk}.ffn_gate_shexp.weight": dense(N_FF_SHEXP, N_EMBD),
        f"{blk}.ffn_up_shexp.weight": dense(N_FF_SHEXP, N_EMBD),
        f"{blk}.ffn_down_shexp.weight": dense(N_EMBD, N_FF_SHEXP, gain),
    }
