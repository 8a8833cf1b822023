"""A tiny random GLM-4.5-style MoE target (arch `glm4moe`) with one NextN (MTP) block.

ik_llama.cpp at its default pin drafts with MTP (`-mtp`) for this family alone; the pinned
upstream calls the same block `draft-mtp`. Both read the GLM-4.5 layout written here:
`block_count` counts the trunk and the NextN block, `glm4moe.nextn_predict_layers` = 1
marks the last block as the MTP head (ik: `src/llama-hparams.cpp`, `src/llama-load-tensors.cpp`
`create_glm4_moe_tensors`, graph `build_glm4_moe` / `build_mtp_tail` in
`src/llama-build-context.cpp`; upstream: `src/models/glm4-moe.cpp`, `graph_mtp`).

Layout: 3 blocks of width 64, 2 heads of 32 (q/k/v with biases, half the head rotated),
block 0 dense (`leading_dense_block_count` = 1), blocks 1 and 2 MoE with 4 routed experts
(2 used, sigmoid gating; the selection bias `exp_probs_b` settles which two run, so no
routing near-tie can tip on rounding) and 1 shared expert; block 2 also holds the
NextN tensors (`nextn.eh_proj`, `enorm`, `hnorm`, `embed_tokens`, `shared_head_norm`,
`shared_head_head`). Character-level SentencePiece-style vocabulary of printable ASCII.
F32 weights from numpy's PCG64 with the seed.

Acceptance: the target is nearly a bigram model. The residual stream is dominated by the
token embedding (the attention and FFN output projections of the trunk carry small gains),
and the output head is random with logits a few units apart, so the next token is mostly a
fixed function f of the current one, and now and then the context (the attention branch)
tips a close call the other way. The NextN block is made to compute the same f of the
token it is fed: `eh_proj` passes the normalised token embedding through (identity on the
embedding half, a faint copy of the hidden-state half), its own attention and experts
carry tiny gains, and its head (`embed_tokens`, `shared_head_head`) copies the target's
embedding and output matrices. A draft token is accepted where the target follows f, and
rejected where its context tipped the choice: partial acceptance and rollback both run.

Seen at the default pins (seed 1, 4 prompts of 64 tokens, greedy, `-fa off`, one draft
token): ik `-mtp` accepts 107 of 143 drafts and upstream `--spec-type draft-mtp` 106 of 144,
one request at a time both match the plain server (ik up to its catalogued short output:
a strict prefix, 63 of 64 characters, on 2 prompts); on 4 parallel slots upstream still
matches while ik's output departs from the plain one on some prompts (an ik defect).
"""

from __future__ import annotations

import functools
from pathlib import Path

from llamaspec.proof.refmodels import RefPair, Say, cached, common

VERSION = 2  # bump when the layout or the weights change: the cache key follows it
ARCH = "glm4moe"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 2, 2, 32
N_LAYER, N_NEXTN = 3, 1  # block_count counts the NextN block (blocks 0-1 trunk, 2 NextN)
N_FF, N_FF_EXP, N_EXPERT, N_EXPERT_USED, N_EXPERT_SHARED = 128, 32, 4, 2, 1
CONTEXT = 16384
# gains: the residual branches' output projections in the trunk, in the NextN block, and
# the output head (logits in units)
TRUNK_GAIN, NEXTN_GAIN, HEAD_GAIN, HIDDEN_GAIN = 0.3, 0.02, 3.0, 0.02

ROUTE_BIAS = [0.5] * N_EXPERT_USED + [-0.5] * (N_EXPERT - N_EXPERT_USED)
N_SPECIAL = 3  # <unk> <s> </s>: never predicted (zero rows in the output head)


HOW = (
    "glm4moe-mtp: a tiny GLM-4.5-style MoE target (arch glm4moe, width 64, 2 trunk blocks "
    "(dense, then 4 experts with 2 used and a shared one) and 1 NextN block "
    "(nextn_predict_layers = 1)), F32, random weights from the seed, a character-level "
    "vocabulary. The trunk's attention and FFN outputs carry small gains, so the target is "
    "nearly a bigram model with a clear random output head, now and then tipped by context; "
    "the NextN block passes the normalised embedding of the token it is fed through eh_proj "
    "and reuses the target's embedding and output matrices, so it drafts the target's "
    "bigram choice for that token: drafts are accepted where the target follows its bigram "
    "and rejected where context tipped it. Read by ik_llama.cpp's glm4moe loader "
    "(-mtp) and upstream's src/models/glm4-moe.cpp (draft-mtp)."
)


def pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The glm4moe target with its NextN head (MTP drafts with the target's own block)."""
    target = cached("glm4moe-mtp", VERSION, seed, "glm4moe-mtp.gguf", lambda p: write(p, seed), say)
    return RefPair(
        name="glm4moe-mtp",
        target=target,
        draft=None,
        spec_types=("mtp",),
        engine="ik_llama.cpp",
        how=HOW,
    )


def write(path: Path, seed: int) -> None:
    import numpy as np
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    tokens, types = common.vocabulary()
    n_vocab = len(tokens)
    f32 = np.float32
    dense = functools.partial(common.dense, rng)
    norm = functools.partial(common.norm, rng, spread=0.05)

    def experts(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((N_EXPERT, rows, cols)) * gain / np.sqrt(cols)).astype(f32)

    def bias(n: int) -> np.ndarray:
        return (0.1 * rng.standard_normal(n)).astype(f32)

    w = GGUFWriter(str(path), arch=ARCH)
    w.add_name(f"llamaspec random glm4moe with MTP (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM // 2)  # GLM-4.5 rotates half of each head
    w.add_rope_freq_base(10000.0)
    w.add_expert_feed_forward_length(N_FF_EXP)
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(N_EXPERT_USED)
    w.add_expert_shared_count(N_EXPERT_SHARED)
    w.add_leading_dense_block_count(1)
    w.add_expert_weights_scale(1.0)
    w.add_expert_weights_norm(True)
    w.add_uint32(f"{ARCH}.expert_gating_func", 2)  # sigmoid (llama.cpp and ik: 2)
    w.add_uint32(f"{ARCH}.nextn_predict_layers", N_NEXTN)
    common.add_tokenizer(w, tokens, types)

    embd = rng.standard_normal((n_vocab, N_EMBD)).astype(f32)
    head = dense(n_vocab, N_EMBD, gain=HEAD_GAIN)
    head[:N_SPECIAL] = 0.0  # logit 0 for <unk> <s> </s>: below every clear choice
    out_norm = norm(N_EMBD)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", out_norm)
    w.add_tensor("output.weight", head)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        gain = NEXTN_GAIN if i >= N_LAYER - N_NEXTN else TRUNK_GAIN
        w.add_tensor(f"{blk}.attn_norm.weight", norm(N_EMBD))
        w.add_tensor(f"{blk}.attn_q.weight", dense(q_dim, N_EMBD))
        w.add_tensor(f"{blk}.attn_q.bias", bias(q_dim))
        w.add_tensor(f"{blk}.attn_k.weight", dense(kv_dim, N_EMBD))
        w.add_tensor(f"{blk}.attn_k.bias", bias(kv_dim))
        w.add_tensor(f"{blk}.attn_v.weight", dense(kv_dim, N_EMBD))
        w.add_tensor(f"{blk}.attn_v.bias", bias(kv_dim))
        w.add_tensor(f"{blk}.attn_output.weight", dense(N_EMBD, q_dim, gain=gain))
        w.add_tensor(f"{blk}.post_attention_norm.weight", norm(N_EMBD))
        if i == 0:  # the leading dense block
            w.add_tensor(f"{blk}.ffn_gate.weight", dense(N_FF, N_EMBD))
            w.add_tensor(f"{blk}.ffn_up.weight", dense(N_FF, N_EMBD))
            w.add_tensor(f"{blk}.ffn_down.weight", dense(N_EMBD, N_FF, gain=gain))
            continue
        w.add_tensor(f"{blk}.ffn_gate_inp.weight", dense(N_EXPERT, N_EMBD))
        # the selection bias settles which experts run (sigmoid scores differ by < 1): no
        # near-tie in routing to tip on rounding; the scores still weigh the chosen two
        w.add_tensor(f"{blk}.exp_probs_b.bias", rng.permutation(ROUTE_BIAS).astype(f32))
        w.add_tensor(f"{blk}.ffn_gate_exps.weight", experts(N_FF_EXP, N_EMBD))
        w.add_tensor(f"{blk}.ffn_up_exps.weight", experts(N_FF_EXP, N_EMBD))
        w.add_tensor(f"{blk}.ffn_down_exps.weight", experts(N_EMBD, N_FF_EXP, gain=gain))
        n_ff_shexp = N_FF_EXP * N_EXPERT_SHARED
        w.add_tensor(f"{blk}.ffn_gate_shexp.weight", dense(n_ff_shexp, N_EMBD))
        w.add_tensor(f"{blk}.ffn_up_shexp.weight", dense(n_ff_shexp, N_EMBD))
        w.add_tensor(f"{blk}.ffn_down_shexp.weight", dense(N_EMBD, n_ff_shexp, gain=gain))
        if i < N_LAYER - N_NEXTN:
            continue
        # [embedding half | hidden-state half] -> width: the embedding passes through
        eh_proj = np.concatenate(
            [np.eye(N_EMBD, dtype=f32), dense(N_EMBD, N_EMBD, gain=HIDDEN_GAIN)], axis=1
        )
        w.add_tensor(f"{blk}.nextn.eh_proj.weight", eh_proj)
        w.add_tensor(f"{blk}.nextn.enorm.weight", np.ones(N_EMBD, dtype=f32))
        w.add_tensor(f"{blk}.nextn.hnorm.weight", np.ones(N_EMBD, dtype=f32))
        w.add_tensor(f"{blk}.nextn.embed_tokens.weight", embd.copy())
        w.add_tensor(f"{blk}.nextn.shared_head_norm.weight", out_norm.copy())
        w.add_tensor(f"{blk}.nextn.shared_head_head.weight", head.copy())
    common.finish(w)
