"""Random-weight DFlash and DSpark drafters and the small Llama target they draft for.

The pinned upstream loader takes a DFlash drafter as its own architecture, `dflash`
(`src/models/dflash.cpp`, speculative side in `common/speculative.cpp`,
`common_speculative_impl_draft_dflash`, one class for both types). The drafter reads no
target architecture by name: it asks the target context for the *inputs* of the layers
listed in its `dflash.target_layers` key, which every target graph that records its layer
inputs gives (`src/models/llama.cpp` among them), so the simplest target works: a 2-layer
`llama` model. A DSpark drafter is the same file plus a Markov head (`markov_w1`,
`markov_w2`, optionally `conf_proj`); the server reads the type off that tensor
(`common_speculative_types_from_gguf`). Upstream's other DSpark form, a DeepSeek-V4 backbone
(hyper-connections, MLA, MoE: keys `dflash.hyper_connection_count` ...), is not needed: the
legacy DFlash backbone with a Markov head is a DSpark draft the pinned code loads.

How the drafter works (what the weights below are built around): the target's layer
inputs at each committed position are fused by `fc` and `enc_output_norm` and written into
the drafter's K/V cache; then the drafter decodes one block `[last token, <mask> ...]`
with non-causal attention over that cache and the block. DFlash drafts the tokens at the
mask positions (at most `dflash.block_size` - 1); DSpark, anchor first, drafts from the
anchor's own position on and adds the Markov bias `markov_w2 . markov_w1[previous token]`
to each position's logits, the previous token being the anchor and then each position's
argmax. The vocabulary needs a mask token (`tokenizer.ggml.mask_token_id`).

The weights: the target is nearly a bigram model. Its token embeddings carry a constant
"real token" coordinate (dimension 0) the output head ignores, its residual branches have
small gains, and its output head is a clear random projection, so the next token is a
function of the current one. The DFlash drafter copies the target's embeddings, final norm
and head, maps the mask token to minus that coordinate, and has one layer whose attention
(queries and keys read only that coordinate, on dimensions rope leaves alone) sends every
mask position to the block's anchor and copies the anchor's embedding there: each mask
position predicts the target's next token after the anchor, right at the first position
and mostly wrong further on, so drafts are partly accepted and partly rolled back. The
DSpark drafter is the same backbone with a weak copy and a Markov head that factors the
target's bigram logits (normed embeddings times the output head, the head with noise added),
so the chain anchor -> next -> next drafts several tokens, many of them right. No linear
algebra routine is used to make weights: the bytes do not depend on the BLAS.
"""

from __future__ import annotations

from functools import cache, partial
from pathlib import Path

from llamaspec.proof.refmodels import RefPair, Say, cached, common

VERSION = 1  # bump when the layout or the weights change: the cache directory follows it
FAMILY = "dflash"
CONTEXT = 16384

# the target: a 2-layer llama
N_EMBD, N_LAYER, N_FF, N_HEAD = 128, 2, 256, 2
HEAD_DIM = N_EMBD // N_HEAD
REAL = 3.0  # dimension 0 of every real token's embedding (the mask token's is -REAL)
BRANCH_GAIN = 0.05  # the target's attention and FFN output projections: small
HEAD_GAIN = 6.0  # output head: logits a few units apart, clear greedy choices

# the drafters: one DFlash layer reading the inputs of both target layers
TARGET_LAYERS = (0, 1)
BLOCK_SIZE = 4  # DFlash drafts at most 3 tokens a step, DSpark (anchor first) 4
DRAFT_FF = 64
DRAFT_ROT = 4  # rope turns head dimensions 0-3 only; the attention reads dimension 10
KEY_DIM = 10
ATTN_SCALE = 0.5  # normed q, k: q.k = +-64, scores +-32, the anchor wins outright
COPY_DFLASH = 4.0  # how strongly a mask position takes the anchor's embedding
COPY_DSPARK = 0.05  # weak: the Markov bias leads DSpark's chain
MARKOV_RANK = N_EMBD - 1
MARKOV_GAIN = 1.0
MARKOV_NOISE = 0.2  # relative to the head's weights: ~77% of the bigram choices kept


def vocabulary() -> tuple[list[str], list[int]]:
    """<unk> <s> </s>, newline and tab as byte tokens, `▁` for space, printable ASCII, and
    last a `<mask>` control token (the drafters' noise token)."""
    tokens, types = common.vocabulary()
    return [*tokens, "<mask>"], [*types, common.CONTROL]


MASK_ID = len(vocabulary()[0]) - 1


def _tokenizer(w) -> None:
    common.add_tokenizer(w, *vocabulary(), mask_id=MASK_ID)


@cache
def _target_weights(seed: int) -> dict:
    """The target's tensors (numpy, row-major (out, in)), drawn in a fixed order."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n_vocab = len(vocabulary()[0])
    dense = partial(common.dense, rng)
    norm = partial(common.norm, rng, spread=0.1)

    embd = rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32)
    embd[:, 0] = REAL
    out = dense(n_vocab, N_EMBD, HEAD_GAIN)
    out[:, 0] = 0.0  # the head ignores the real-token coordinate
    out[[0, 1, 2, MASK_ID]] = 0.0  # logit 0 for <unk> <s> </s> <mask>: never the argmax
    t = {"token_embd.weight": embd, "output_norm.weight": norm(N_EMBD), "output.weight": out}
    for i in range(N_LAYER):
        t |= common.llama_layer(dense, norm, f"blk.{i}", N_EMBD, N_FF, BRANCH_GAIN)
    for a in t.values():
        a.setflags(write=False)
    return t


def _normed_embeddings(seed: int):
    """The target's final norm applied to each token's embedding (float64)."""
    import numpy as np

    t = _target_weights(seed)
    e = t["token_embd.weight"].astype(np.float64)
    return e / np.sqrt((e * e).mean(axis=1, keepdims=True) + 1e-5) * t["output_norm.weight"]


def bigram_logits(seed: int):
    """(n_vocab, n_vocab): the target's logits after a lone token with its residual
    branches left out, row = current token (what the target nearly computes)."""
    return _normed_embeddings(seed) @ _target_weights(seed)["output.weight"].T


def write_target(path: Path, seed: int) -> None:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch="llama")
    w.add_name(f"llamaspec reference llama target for dflash/dspark (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(vocabulary()[0]))
    _tokenizer(w)
    for name, a in _target_weights(seed).items():
        w.add_tensor(name, a)
    common.finish(w)


def write_draft(path: Path, seed: int, dspark: bool) -> None:
    """The DFlash drafter, or with `dspark` the DSpark one (Markov and confidence heads)."""
    import numpy as np
    from gguf import GGUFWriter

    tgt = _target_weights(seed)
    rng = np.random.default_rng([seed, 2 if dspark else 1])
    n_enc = len(TARGET_LAYERS) * N_EMBD

    def small(rows: int, cols: int, gain: float = 0.02) -> np.ndarray:
        return common.dense(rng, rows, cols, gain)

    w = GGUFWriter(str(path), arch="dflash")
    kind = "dspark" if dspark else "dflash"
    w.add_name(f"llamaspec reference {kind} drafter (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(DRAFT_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(DRAFT_ROT)
    w.add_rope_freq_base(10000.0)
    w.add_float32("dflash.attention.scale", ATTN_SCALE)
    w.add_array("dflash.target_layers", list(TARGET_LAYERS))
    w.add_uint32("dflash.block_size", BLOCK_SIZE)
    if dspark:
        w.add_bool("dflash.sample_from_anchor", True)
        w.add_bool("dflash.has_confidence_head", True)
    _tokenizer(w)

    # the target's embeddings and head, the mask token at minus the real-token coordinate
    embd = tgt["token_embd.weight"].copy()
    embd[MASK_ID] = 0.0
    embd[MASK_ID, 0] = -REAL
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output.weight", tgt["output.weight"])
    w.add_tensor("output_norm.weight", tgt["output_norm.weight"])

    # the encoder: the sum of the target layers' real-token coordinates, negated, plus a
    # little of everything (a committed position's key points away from the queries)
    fc = small(N_EMBD, n_enc)
    for k in range(len(TARGET_LAYERS)):
        fc[0, k * N_EMBD] = -1.0
    w.add_tensor("fc.weight", fc)
    w.add_tensor("enc.output_norm.weight", np.ones(N_EMBD, np.float32))

    # attention: per head, q and k read only dimension 0 (the real-token coordinate) into
    # head dimension KEY_DIM, past the rope-turned ones; a mask's query seeks a real key
    q = np.zeros((N_EMBD, N_EMBD), np.float32)
    k = np.zeros((N_EMBD, N_EMBD), np.float32)
    for h in range(N_HEAD):
        q[h * HEAD_DIM + KEY_DIM, 0] = -1.0
        k[h * HEAD_DIM + KEY_DIM, 0] = 1.0
    copy = COPY_DSPARK if dspark else COPY_DFLASH
    blk = "blk.0"
    w.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, np.float32))
    w.add_tensor(f"{blk}.attn_q.weight", q)
    w.add_tensor(f"{blk}.attn_k.weight", k)
    w.add_tensor(f"{blk}.attn_v.weight", np.eye(N_EMBD, dtype=np.float32))
    w.add_tensor(f"{blk}.attn_output.weight", copy * np.eye(N_EMBD, dtype=np.float32))
    w.add_tensor(f"{blk}.attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
    w.add_tensor(f"{blk}.attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))
    w.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
    w.add_tensor(f"{blk}.ffn_gate.weight", small(DRAFT_FF, N_EMBD, 1.0))
    w.add_tensor(f"{blk}.ffn_up.weight", small(DRAFT_FF, N_EMBD, 1.0))
    w.add_tensor(f"{blk}.ffn_down.weight", small(N_EMBD, DRAFT_FF))

    if dspark:
        # Markov head: bias[prev] = markov_w2 . markov_w1[prev]. The target's logits after a
        # lone token factor as head . normed embedding (the real-token coordinate left out:
        # rank N_EMBD - 1); markov_w1 holds the normed embeddings, markov_w2 the head plus
        # noise, so the bias agrees with the target's choice for most tokens, not all
        h = _normed_embeddings(seed)[:, 1:]
        head = tgt["output.weight"][:, 1:]
        noise = rng.standard_normal(head.shape) * MARKOV_NOISE * HEAD_GAIN / np.sqrt(N_EMBD)
        w.add_tensor("markov_w1.weight", (h * MARKOV_GAIN).astype(np.float32))
        w.add_tensor("markov_w2.weight", (head + noise).astype(np.float32))
        # confidence head: sigmoid(0 + 4) ~ 0.98 everywhere (drafts pass a --spec-draft-p-min)
        w.add_tensor("conf_proj.weight", np.zeros((1, N_EMBD + MARKOV_RANK), np.float32))
        w.add_tensor("conf_proj.bias", np.full(1, 4.0, np.float32))
    common.finish(w)


def _target(seed: int, say: Say | None) -> Path:
    return cached(FAMILY, VERSION, seed, "target.gguf", lambda p: write_target(p, seed), say)


HOW = (
    "A 2-layer F32 llama target (character vocabulary plus a <mask> token) that is nearly a "
    "bigram model: small residual-branch gains, a constant real-token coordinate in every "
    "embedding that the output head ignores. The {kind} drafter (arch dflash, pinned loader "
    "src/models/dflash.cpp, drafting in common/speculative.cpp) copies the target's "
    "embeddings, final norm and head, reads the inputs of target layers 0 and 1 "
    "(dflash.target_layers), block size {block}; its one layer's attention sends every "
    "mask position to the block's anchor token and copies its embedding there.{extra}"
)


def pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The llama target and its DFlash drafter (`draft-dflash`)."""
    target = _target(seed, say)
    draft = cached(
        FAMILY, VERSION, seed, "dflash-draft.gguf", lambda p: write_draft(p, seed, False), say
    )
    how = HOW.format(
        kind="DFlash",
        block=BLOCK_SIZE,
        extra=" Each mask position predicts the target's next token after the anchor: the "
        "first draft is mostly accepted, later ones mostly rolled back.",
    )
    return RefPair("dflash", target, draft, ("dflash",), how=how)


def dspark_pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The same llama target and a DSpark drafter (`draft-dspark`): the DFlash backbone
    plus a Markov head and a confidence head."""
    target = _target(seed, say)
    draft = cached(
        FAMILY, VERSION, seed, "dspark-draft.gguf", lambda p: write_draft(p, seed, True), say
    )
    how = HOW.format(
        kind="DSpark",
        block=BLOCK_SIZE,
        extra=" Its Markov head (markov_w1, markov_w2) holds the target's normed embeddings "
        "and its output head with noise added, so the chained drafts follow the target mostly but "
        "not always; conf_proj gives a constant confidence of about 0.98.",
    )
    return RefPair("dspark", target, draft, ("dspark",), how=how)
