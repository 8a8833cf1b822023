"""An F32 llama target and an EAGLE-3 draft for it, random weights built to agree often.

Target (arch `llama`, read by the pinned `src/models/llama.cpp`): N_LAYER layers of width
N_EMBD over a character-level SentencePiece-style vocabulary of printable ASCII. Its
residual branches (attention output and FFN down projections) have a small gain, so the
residual stream is dominated by the token embedding and the model is nearly a bigram
model: next token ~ argmax(output . rmsnorm(token_embd[t])). The output head has a large
gain, so greedy choices are clear. llama.cpp's llama graph records each layer's input
(`t_layer_inp`), which is what EAGLE-3 extracts.

Draft (arch `eagle3`, read by `src/models/eagle3.cpp`; hparams keys from
`src/llama-arch.cpp`: `eagle3.target_layers` (3 layer ids), `eagle3.target_hidden_size`,
`eagle3.norm_before_residual`): one decoder layer. It has no `token_embd` (the engine
takes the target's through the draft context's `ctx_other`), its own `output_norm` (a copy
of the target's) and a reduced draft vocabulary as real EAGLE-3 drafts have: `output.weight`
holds the target head's rows for every token but the first N_SPECIAL (<unk> <s> </s>), in a
random order, and the I64 tensor `d2t` maps each draft row to its target token id (absolute
ids, as the pinned converter writes them); the engine scatters the draft logits into the
target vocabulary with it (other tokens get -inf). The decoder at position P reads the pair
(token[P+1], g[P]); g is `fc` applied to the target's three extracted hidden states (and,
while drafting, the draft's own pre-norm output of the step before). With
`norm_before_residual` the residual carries rmsnorm(g) times a small `attn_norm_2`, so g
contributes little. Attention is a content match: q and k read the normed token embedding
and leave the first ROPE_DIMS dimensions of each head (the only rotated ones) at zero, so
the current position and earlier positions holding the same token win; v copies the
normed embedding and `attn_output` is the identity. The residual is then ~ the normed
embedding of token[P+1], and the shared head predicts the target's bigram choice; the
target's context terms, the g mix, the draft's FFN and attention to similar tokens make
it disagree now and then (partial acceptance, so rollback runs too). The speculative side
is `common_speculative_impl_draft_eagle3` in `common/speculative.cpp`.
"""

from __future__ import annotations

import functools
from pathlib import Path

from llamaspec.proof.refmodels import RefPair, Say, cached, common

VERSION = 1  # bump when the layout or the weights change: the cache key follows it
N_EMBD, N_LAYER, N_FF, N_HEAD = 64, 4, 128, 2
HEAD_DIM = N_EMBD // N_HEAD
CONTEXT = 16384
TARGET_FILE, DRAFT_FILE = "target-llama.gguf", "draft-eagle3.gguf"
TARGET_LAYERS = (1, 2, 3)  # inputs of these target layers feed the draft's fc
TARGET_GAIN = 0.2  # target: attn_output / ffn_down gain (0: an exact bigram model)
HEAD_GAIN = 3.0  # output head: logits a few units apart
DRAFT_FF = 128
N_SPECIAL = 3  # draft vocabulary: every token but <unk> <s> </s> (mapped back by d2t)
ROPE_DIMS = 4  # draft: rotated dims per head; q/k are zero there
QK_SCALE = 3.0  # draft: q = k = QK_SCALE * normed embedding (content match)
G_MIX = 0.15  # draft: attn_norm_2, the weight of rmsnorm(g) in the residual
DRAFT_FFN_GAIN = 0.1  # draft: ffn_down gain
NOISE = 0.02  # draft: random part of the structured matrices


def weights(seed: int) -> dict[str, dict]:
    """Every tensor of both files, (rows, cols) numpy arrays (GGUF shape [cols, rows])."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n_vocab = len(common.vocabulary()[0])
    dense = functools.partial(common.dense, rng)
    norm = functools.partial(common.norm, rng, spread=0.05)

    target: dict = {
        "token_embd.weight": rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32),
        "output_norm.weight": norm(N_EMBD),
        "output.weight": dense(n_vocab, N_EMBD, HEAD_GAIN),
    }
    for i in range(N_LAYER):
        target |= common.llama_layer(dense, norm, f"blk.{i}", N_EMBD, N_FF, TARGET_GAIN)

    # draft: the decoder's attention input is [rmsnorm(embd) * attn_norm ; g_norm] (2 * N_EMBD)
    eye = np.eye(N_EMBD, dtype=np.float32)
    qk = np.zeros((N_EMBD, 2 * N_EMBD), dtype=np.float32)
    for h in range(N_HEAD):
        rows = np.arange(h * HEAD_DIM + ROPE_DIMS, (h + 1) * HEAD_DIM)
        qk[rows, rows] = QK_SCALE  # head h matches on its own unrotated dims
    v = np.concatenate([eye, np.zeros_like(eye)], axis=1)
    d2t = (N_SPECIAL + rng.permutation(n_vocab - N_SPECIAL)).astype(np.int64)
    draft: dict = {
        "fc.weight": dense(N_EMBD, len(TARGET_LAYERS) * N_EMBD),
        "output_norm.weight": target["output_norm.weight"].copy(),
        "output.weight": target["output.weight"][d2t].copy(),
        "d2t": d2t,
        "blk.0.attn_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        "blk.0.attn_norm_2.weight": norm(N_EMBD, G_MIX),
        "blk.0.attn_q.weight": qk + dense(N_EMBD, 2 * N_EMBD, NOISE),
        "blk.0.attn_k.weight": qk + dense(N_EMBD, 2 * N_EMBD, NOISE),
        "blk.0.attn_v.weight": v + dense(N_EMBD, 2 * N_EMBD, NOISE),
        "blk.0.attn_output.weight": eye + dense(N_EMBD, N_EMBD, NOISE),
        "blk.0.ffn_norm.weight": norm(N_EMBD),
        "blk.0.ffn_gate.weight": dense(DRAFT_FF, N_EMBD),
        "blk.0.ffn_up.weight": dense(DRAFT_FF, N_EMBD),
        "blk.0.ffn_down.weight": dense(N_EMBD, DRAFT_FF, DRAFT_FFN_GAIN),
    }
    return {"target": target, "draft": draft}


def write_target(path: Path, seed: int) -> None:
    from gguf import GGUFWriter

    tokens, types = common.vocabulary()
    w = GGUFWriter(str(path), arch="llama")
    w.add_name(f"llamaspec reference eagle3 target (llama, seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    common.add_tokenizer(w, tokens, types)
    for name, data in weights(seed)["target"].items():
        w.add_tensor(name, data)
    common.finish(w)


def write_draft(path: Path, seed: int) -> None:
    from gguf import GGUFWriter

    tokens, types = common.vocabulary()
    w = GGUFWriter(str(path), arch="eagle3")
    w.add_name(f"llamaspec reference eagle3 draft (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(DRAFT_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(ROPE_DIMS)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_array("eagle3.target_layers", list(TARGET_LAYERS))
    w.add_uint32("eagle3.target_hidden_size", N_EMBD)
    w.add_bool("eagle3.norm_before_residual", True)
    common.add_tokenizer(w, tokens, types)
    for name, data in weights(seed)["draft"].items():
        w.add_tensor(name, data)
    common.finish(w)


HOW = (
    "Target: an F32 llama ({n} layers, width {e}, character vocabulary) whose residual "
    "branches have gain {tg}, so it is nearly a bigram model with a clear output head. "
    "Draft: an eagle3 file (src/models/eagle3.cpp) with target_layers {tl}, "
    "target_hidden_size {e}, norm_before_residual, no token_embd (the target's is used), "
    "the target's output norm, and an output head of the target's rows for every token "
    "but <unk> <s> </s>, shuffled, with an I64 d2t tensor mapping them back. Its one "
    "decoder layer attends by content match on the normed token embedding (rotated dims "
    "zeroed) and copies it into the residual, while the fc/g path enters at weight {g}: "
    "it predicts the target's bigram choice most of the time but not always."
)


def pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The llama target and its EAGLE-3 draft for `seed`, written once into the cache."""
    target = cached("eagle3", VERSION, seed, TARGET_FILE, lambda p: write_target(p, seed), say)
    draft = cached("eagle3", VERSION, seed, DRAFT_FILE, lambda p: write_draft(p, seed), say)
    how = HOW.format(n=N_LAYER, e=N_EMBD, tg=TARGET_GAIN, tl=list(TARGET_LAYERS), g=G_MIX)
    return RefPair(name="eagle3", target=target, draft=draft, spec_types=("eagle3",), how=how)
