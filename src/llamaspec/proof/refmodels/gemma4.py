"""A random Gemma 4 target and its assistant drafter (draft-mtp with a separate file).

Upstream serves Gemma 4 with its `-assistant` drafter as `--spec-type draft-mtp -md
ASSISTANT.gguf`. The pinned loaders are `src/models/gemma4.cpp` (arch `gemma4`) and
`src/models/gemma4-assistant.cpp` (arch `gemma4-assistant`); the hparams they share are read in
`src/llama-model.cpp` (`load_hparams`), the shared KV cache is set up there too
(`create_memory`: the assistant's sliding-window layers read the target's layer n-2, its
full-attention layers the target's layer n-1), `src/llama-context.cpp` refuses an assistant
context without the target's (`ctx_other`), and `common/speculative.cpp`
(`common_speculative_impl_draft_mtp`, `is_mem_shared`) drives it. The assistant has no K/V
projections and no input embedding of its own: it embeds the last token with the TARGET's
`token_embd` (scaled by sqrt(target width)), concatenates the target's post-norm hidden state
(`h_nextn`), projects that with `nextn.pre_projection` to its own width, runs its layers
(queries only, attending the target's cache), and reads logits through its own `token_embd`
(tied output head); `nextn.post_projection` maps its state back to the target width for the
next draft step. The type is not inferred from the file (no `blk.N.nextn.eh_proj`), so
`--spec-type draft-mtp` must be given; under draft-simple the assistant's first decode fails
(its cache mirrors the target's cells), and draft-mtp on the target alone is refused (the
gemma4 loader reads no nextn layers).

How acceptance is made non-trivial: the target is nearly a bigram model. Its token embeddings
lie in a subspace as wide as the assistant (an orthonormal basis U), every residual branch
ends in an RMS post-norm whose weight (the branch gain) is small, so the residual stream is
the token's embedding plus small context-dependent attention terms; the output head is built
from a bigram preference table (each token has a first and a close second successor), so
the small attention terms flip the near ties in some contexts. The assistant's pre-projection
reads the target embedding through U^T (the hidden-state half only a little), its own layers'
post-norm gains are smaller still, and its tied head is the target's head seen through U
(scaled for the RMS norm's width), so it predicts the target's bigram choice: most drafts are
accepted, the context-dependent flips are not. Weights are drawn from numpy's PCG64 with
the seed. The vocabulary is character level (printable ASCII), as `hybrid_gguf`'s.
"""

from __future__ import annotations

import functools
from pathlib import Path

from llamaspec.proof.refmodels import RefPair, Say, cached, common

VERSION = 1  # bump when the layout or the weights change: the cache directory follows it
FAMILY = "gemma4"

# target: 4 layers, sliding-window attention on all but the last (which must be full: the
# assistant's full layers share its cache, and its sliding ones share layer n-2's)
N_EMBD, N_FF = 128, 256
N_HEAD, N_HEAD_KV = 4, 2
HEAD_DIM, HEAD_DIM_SWA = 64, 32  # full-attention and sliding-window head sizes (as Gemma 4)
SWA_PATTERN = (True, True, True, False)
N_SWA = 32  # the sliding window, in tokens
ROPE_BASE, ROPE_BASE_SWA = 1_000_000.0, 10_000.0
ROTARY_FRACTION = 0.25  # "proportional" rope of the full layers: the rest is left unrotated
SOFTCAP = 30.0
CONTEXT = 16384

# assistant: narrower than the target (its width must differ from the target's)
A_EMBD, A_FF = 64, 128
A_SWA_PATTERN = (True, False)

# gains of the residual branches (post-norm weights): the target's attention carries the
# context that makes the drafts partly wrong; the other branches stay quiet
GAIN_ATTN, GAIN_FFN, GAIN_DRAFT = 0.6, 0.05, 0.02
LOGIT_SCALE = 12.0  # the bigram's preferred successor scores about this
SECOND_BEST = (0.55, 0.98)  # the runner-up successor's score, as a fraction of the first's

TARGET_FILE, DRAFT_FILE = "gemma4-target.gguf", "gemma4-assistant.gguf"


def pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The target and its assistant for `seed`, written once into the llamaspec cache."""
    target = cached(FAMILY, VERSION, seed, TARGET_FILE, lambda p: write(p, seed, "target"), say)
    draft = cached(FAMILY, VERSION, seed, DRAFT_FILE, lambda p: write(p, seed, "assistant"), say)
    return RefPair(
        name="gemma4",
        target=target,
        draft=draft,
        spec_types=("mtp",),
        how=(
            "Random F32 Gemma 4 target (arch gemma4, 4 layers, sliding-window attention on "
            f"layers 0-2 with a {N_SWA}-token window, full attention on layer 3) and its "
            "assistant drafter (arch gemma4-assistant, 2 query-only layers reading the "
            "target's KV cache of layers 2 and 3), run with --spec-type draft-mtp -md. The "
            "target is nearly a bigram model: token embeddings in a subspace as wide as the "
            "assistant, small post-norm gains on the residual branches, an output head built "
            "from a bigram table with close runners-up that the target's attention flips in "
            "some contexts. The assistant embeds the last token with the target's embedding, "
            "projects it onto that subspace and reads the target's head through it, so it "
            "predicts the bigram choice: drafts are partly accepted."
        ),
    )


@functools.lru_cache(maxsize=2)
def _arrays(seed: int) -> dict[str, dict]:
    """Every tensor of both files, from one generator (the assistant's head is derived from
    the target's); cached, so writing the pair draws them once. Read-only to callers."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, types = common.vocabulary()
    n_vocab = len(tokens)
    dense = functools.partial(common.dense, rng)
    norm = functools.partial(common.norm, rng, spread=0.1)

    def rope_freqs(head_dim: int) -> np.ndarray:
        n_rot = int(head_dim * ROTARY_FRACTION / 2)
        return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)

    # embeddings: unit RMS after the graph's sqrt(n_embd) scale, inside span(U)
    basis, _ = np.linalg.qr(rng.standard_normal((N_EMBD, A_EMBD)))  # (N_EMBD, A_EMBD)
    coords = rng.standard_normal((n_vocab, A_EMBD))
    coords *= np.sqrt(N_EMBD) / np.linalg.norm(coords, axis=1, keepdims=True)
    x = coords @ basis.T  # (n_vocab, N_EMBD): the scaled embedding of each token, rms 1
    token_embd = (x / np.sqrt(N_EMBD)).astype(np.float32)

    # bigram table: a first and a close second successor for each token, among the
    # printable tokens only (no control or byte tokens: generation never stops early)
    normal = [i for i, t in enumerate(types) if t == common.NORMAL]
    prefer = np.zeros((n_vocab, n_vocab))  # prefer[j, i]: how much j follows i
    picks = np.array(normal)[rng.random((n_vocab, len(normal))).argsort(axis=1)[:, :2]]
    rows = np.arange(n_vocab)
    prefer[picks[:, 0], rows] = 1.0
    prefer[picks[:, 1], rows] = rng.uniform(*SECOND_BEST, size=n_vocab)
    out_norm = norm(N_EMBD)
    # logits_j(token i) = output[j] . (out_norm * x_i) ~ LOGIT_SCALE * prefer[j, i] (+ crosstalk)
    output = (LOGIT_SCALE * prefer @ x / N_EMBD) / out_norm
    output = output.astype(np.float32)

    t: dict[str, np.ndarray] = {
        "token_embd.weight": token_embd,
        "output.weight": output,
        "output_norm.weight": out_norm,
        "rope_freqs.weight": rope_freqs(HEAD_DIM),
    }
    for i, swa in enumerate(SWA_PATTERN):
        hd = HEAD_DIM_SWA if swa else HEAD_DIM
        b = f"blk.{i}"
        t[f"{b}.attn_norm.weight"] = norm(N_EMBD)
        t[f"{b}.attn_q.weight"] = dense(N_HEAD * hd, N_EMBD)
        t[f"{b}.attn_k.weight"] = dense(N_HEAD_KV * hd, N_EMBD)
        t[f"{b}.attn_v.weight"] = dense(N_HEAD_KV * hd, N_EMBD)
        t[f"{b}.attn_output.weight"] = dense(N_EMBD, N_HEAD * hd)
        t[f"{b}.attn_q_norm.weight"] = norm(hd, 0.5)  # softer attention (scale 1.0 in gemma4)
        t[f"{b}.attn_k_norm.weight"] = norm(hd, 0.5)
        t[f"{b}.post_attention_norm.weight"] = norm(N_EMBD, GAIN_ATTN)
        t[f"{b}.ffn_norm.weight"] = norm(N_EMBD)
        t[f"{b}.ffn_gate.weight"] = dense(N_FF, N_EMBD)
        t[f"{b}.ffn_up.weight"] = dense(N_FF, N_EMBD)
        t[f"{b}.ffn_down.weight"] = dense(N_EMBD, N_FF)
        t[f"{b}.post_ffw_norm.weight"] = norm(N_EMBD, GAIN_FFN)

    # the assistant: pre-projection reads the target embedding through U^T (rms 1 over
    # N_EMBD becomes rms sqrt(N_EMBD / A_EMBD) over A_EMBD), the hidden half barely
    h_part = dense(A_EMBD, N_EMBD, GAIN_DRAFT)
    pre = np.concatenate([basis.T, h_part], axis=1).astype(np.float32)  # (A_EMBD, 2 N_EMBD)
    widen = np.sqrt(N_EMBD / A_EMBD)
    a_out_norm = np.ones(A_EMBD, dtype=np.float32)
    # logits = head . norm(U^T x) = head . U^T x / widen  ==  output . (out_norm * x)
    head = ((output * out_norm) @ basis * widen).astype(np.float32)  # (n_vocab, A_EMBD)
    a: dict[str, np.ndarray] = {
        "token_embd.weight": head,
        "output_norm.weight": a_out_norm,
        "nextn.pre_projection.weight": pre,
        "nextn.post_projection.weight": (basis * widen).astype(np.float32),  # back to h
        "rope_freqs.weight": rope_freqs(HEAD_DIM),
    }
    for i, swa in enumerate(A_SWA_PATTERN):
        hd = HEAD_DIM_SWA if swa else HEAD_DIM
        b = f"blk.{i}"
        a[f"{b}.attn_norm.weight"] = norm(A_EMBD)
        a[f"{b}.attn_q.weight"] = dense(N_HEAD * hd, A_EMBD)
        a[f"{b}.attn_output.weight"] = dense(A_EMBD, N_HEAD * hd)
        a[f"{b}.attn_q_norm.weight"] = norm(hd, 0.5)
        a[f"{b}.post_attention_norm.weight"] = norm(A_EMBD, GAIN_DRAFT)
        a[f"{b}.layer_output_scale.weight"] = np.ones(1, dtype=np.float32)
        a[f"{b}.ffn_norm.weight"] = norm(A_EMBD)
        a[f"{b}.ffn_gate.weight"] = dense(A_FF, A_EMBD)
        a[f"{b}.ffn_up.weight"] = dense(A_FF, A_EMBD)
        a[f"{b}.ffn_down.weight"] = dense(A_EMBD, A_FF)
        a[f"{b}.post_ffw_norm.weight"] = norm(A_EMBD, GAIN_DRAFT)
    return {"target": t, "assistant": a}


def write(path: Path, seed: int, which: str) -> None:
    """Write the target (`which="target"`) or the assistant (`"assistant"`) for `seed`."""
    from gguf import GGUFWriter

    tensors = _arrays(seed)[which]
    tokens, types = common.vocabulary()
    target = which == "target"
    arch = "gemma4" if target else "gemma4-assistant"
    pattern = SWA_PATTERN if target else A_SWA_PATTERN
    w = GGUFWriter(str(path), arch=arch)
    w.add_name(f"llamaspec random {arch} (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD if target else A_EMBD)
    w.add_block_count(len(pattern))
    w.add_feed_forward_length(N_FF if target else A_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_uint32(f"{arch}.attention.key_length_swa", HEAD_DIM_SWA)
    w.add_uint32(f"{arch}.attention.value_length_swa", HEAD_DIM_SWA)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_uint32(f"{arch}.rope.dimension_count_swa", HEAD_DIM_SWA)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_float32(f"{arch}.rope.freq_base_swa", ROPE_BASE_SWA)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.attention.sliding_window", N_SWA)
    w.add_array(f"{arch}.attention.sliding_window_pattern", list(pattern))
    w.add_uint32(f"{arch}.attention.shared_kv_layers", 0)
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", 0)
    if target:
        w.add_float32(f"{arch}.final_logit_softcapping", SOFTCAP)
    else:
        w.add_uint32(f"{arch}.embedding_length_out", N_EMBD)  # the target's width
        w.add_uint32(f"{arch}.nextn_predict_layers", len(pattern))  # every layer is a head
    common.add_tokenizer(w, tokens, types, add_bos=True)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    common.finish(w)
