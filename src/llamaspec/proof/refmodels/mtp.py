"""A random dense target with one built-in MTP (NextN) layer, for `--spec-type draft-mtp`.

Architecture: upstream's `hy_v3` (loader `src/models/hy-v3.cpp` of the pinned llama.cpp),
chosen because it is the simplest arch whose MTP graph the pinned engine really runs on a
dense, non-recurrent model: its blocks take a dense SwiGLU FFN when `ffn_gate_inp` is
absent (no experts), it uses a plain KV cache (no sliding window, no recurrent state), and
`graph_mtp` runs the NextN block as a draft head (`LLM_GRAPH_TYPE_DECODER_MTP`). The
`glm4` and `exaone4` loaders also read `nextn_predict_layers` but skip those tensors
(`TENSOR_SKIP`) and have no MTP graph; the other MTP archs need experts, MLA, a sliding
window, recurrent layers or (gemma4) an assistant file. `src/llama-model.cpp` reads
`hy_v3.nextn_predict_layers` (the last block is the NextN one) and gives the MTP context
(`LLAMA_CONTEXT_TYPE_MTP`, made in `common/common.cpp` when draft-mtp is on) a KV cache
that holds only that layer; `common/speculative.cpp` (`common_speculative_impl_draft_mtp`)
feeds the target's post-norm hidden state `h_p` with the next token to the head.

How acceptance is made non-trivial: the target is nearly a bigram model. Its residual
branches (attention output, FFN down projection) have small gains, so the stream is
dominated by the token embedding, and a well-separated output head (gain 3) picks the next
token mostly from the current one; attention adds a little context. The MTP head computes
nearly the same function of its input token: `eh_proj` passes the normed token embedding
through (identity) and mixes in the normed hidden state with a small random matrix, its
block's branches are small too, and it shares the target's output norm and head. Drafts
then agree with the target often but not always, so both acceptance and rollback run
(measured at the pin, 16 requests: 51% of drafts accepted on F32, outputs identical). The
head's rows for <unk> <s> </s> are zero, so greedy outputs never stop early.

Weights are F32 from numpy's PCG64 with a fixed seed; the vocabulary is character level
(printable ASCII, SentencePiece-style `llama` tokenizer). `quantized()` writes Q8_0 (the
`gguf` package's numpy quantizer) or Q4_K_M (the pinned `llama-quantize`) copies;
`llamaspec.proof.refmodels.mtp_study` compares plain and draft-mtp greedy output on them
(reports/mtp-quantized-oracle).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from llamaspec import procs
from llamaspec.errors import LlamaspecError
from llamaspec.proof.refmodels import RefPair, Say, cached, common

VERSION = 1  # bump when the layout or the weights change: the cache key follows it
ARCH = "hy_v3"
# n_embd and n_ff are multiples of 256 so that Q4_K (256-element super-blocks) applies to
# every matrix instead of falling back to another type.
N_EMBD, N_FF, N_HEAD, HEAD_DIM = 256, 256, 2, 128
N_TRUNK, N_NEXTN = 2, 1  # blocks 0-1: the trunk; block 2: the NextN (MTP) block
CONTEXT = 4096
HEAD_GAIN = 3.0  # output head: logits a few units apart, greedy choices are clear
BRANCH_GAIN = 0.2  # trunk residual branches: the embedding dominates the stream
MTP_H_GAIN = 0.15  # how much of the target's hidden state the MTP head mixes in
MTP_BRANCH_GAIN = 0.1

HOW = (
    "A random-weight F32 `hy_v3` model (upstream's loader src/models/hy-v3.cpp) with two "
    "dense trunk blocks and one NextN block (`hy_v3.nextn_predict_layers = 1`), written "
    "with the gguf package from numpy's PCG64 (seed {seed}); character-level vocabulary. "
    "The trunk is nearly a bigram model (small residual-branch gains, a well-separated "
    "output head); the MTP block's eh_proj passes the normed token embedding through and "
    "mixes in the target's hidden state with a small random matrix, and it shares the "
    "output head, so its drafts agree with the target often but not always. Served with "
    "`--spec-type draft-mtp` and no draft file: the pinned engine makes an MTP context "
    "on the target's own weights (common/common.cpp, common/speculative.cpp)."
)


def pair(seed: int = 1, say: Say | None = None) -> RefPair:
    """The MTP reference target for `seed`, written once into the llamaspec cache."""
    target = cached("mtp", VERSION, seed, "hy-v3-mtp-f32.gguf", lambda p: write(p, seed), say)
    return RefPair(
        name="mtp",
        target=target,
        draft=None,
        spec_types=("mtp",),
        how=HOW.format(seed=seed),
    )


def write(path: Path, seed: int) -> None:
    """The F32 model for `seed` at `path` (same seed, same bytes)."""
    import numpy as np
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    tokens, types = common.vocabulary()
    n_vocab = len(tokens)
    n_all = N_TRUNK + N_NEXTN
    dense = functools.partial(common.dense, rng)
    norm = functools.partial(common.norm, rng, spread=0.05)

    w = GGUFWriter(str(path), arch=ARCH)
    w.add_name(f"llamaspec random hy_v3 with MTP (seed {seed})")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_all)
    w.add_uint32(f"{ARCH}.nextn_predict_layers", N_NEXTN)
    w.add_feed_forward_length(N_FF)
    w.add_uint32(f"{ARCH}.expert_feed_forward_length", N_FF)  # read always; no experts
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    common.add_tokenizer(w, tokens, types)

    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(N_EMBD))
    head = dense(n_vocab, N_EMBD, gain=HEAD_GAIN)
    head[:3] = 0.0  # <unk> <s> </s>: logit 0, never the greedy choice; outputs run full length
    w.add_tensor("output.weight", head)
    for i in range(n_all):
        blk = f"blk.{i}"
        gain = BRANCH_GAIN if i < N_TRUNK else MTP_BRANCH_GAIN
        w.add_tensor(f"{blk}.attn_norm.weight", norm(N_EMBD))
        w.add_tensor(f"{blk}.attn_q.weight", dense(N_HEAD * HEAD_DIM, N_EMBD))
        w.add_tensor(f"{blk}.attn_k.weight", dense(N_HEAD * HEAD_DIM, N_EMBD))
        w.add_tensor(f"{blk}.attn_v.weight", dense(N_HEAD * HEAD_DIM, N_EMBD))
        w.add_tensor(f"{blk}.attn_output.weight", dense(N_EMBD, N_HEAD * HEAD_DIM, gain))
        w.add_tensor(f"{blk}.attn_q_norm.weight", norm(HEAD_DIM))
        w.add_tensor(f"{blk}.attn_k_norm.weight", norm(HEAD_DIM))
        w.add_tensor(f"{blk}.ffn_norm.weight", norm(N_EMBD))
        w.add_tensor(f"{blk}.ffn_gate.weight", dense(N_FF, N_EMBD))
        w.add_tensor(f"{blk}.ffn_up.weight", dense(N_FF, N_EMBD))
        w.add_tensor(f"{blk}.ffn_down.weight", dense(N_EMBD, N_FF, gain))
        if i >= N_TRUNK:
            # concat(enorm(embedding), hnorm(h)) -> n_embd: the token passes through, the
            # hidden state is mixed in a little
            mix = dense(N_EMBD, N_EMBD, MTP_H_GAIN)
            eye = np.eye(N_EMBD, dtype=np.float32)
            w.add_tensor(f"{blk}.nextn.eh_proj.weight", np.concatenate([eye, mix], axis=1))
            w.add_tensor(f"{blk}.nextn.enorm.weight", np.ones(N_EMBD, dtype=np.float32))
            w.add_tensor(f"{blk}.nextn.hnorm.weight", np.ones(N_EMBD, dtype=np.float32))
            w.add_tensor(f"{blk}.nextn.shared_head_norm.weight", norm(N_EMBD))
    common.finish(w)


# --- quantized copies (issue 43 item 4: the oracle tier on quantized targets) -----------

QTYPES = ("Q8_0", "Q4_K_M")


def quantized(
    ref: RefPair,
    qtype: str,
    quantize_bin: Path | None = None,
    say: Say | None = None,
) -> Path:
    """A `qtype` copy of `ref.target` beside it in the cache, written once, atomically.

    Q8_0: every 2-D weight through the `gguf` package's numpy quantizer (norms stay F32).
    Q4_K_M: the pinned `llama-quantize` (`quantize_bin`; the gguf package has no Q4_K
    quantizer); its usual mix (Q6_K for the output head and some attn_v/ffn_down)."""
    if qtype not in QTYPES:
        raise LlamaspecError(f"No quantized copy of type {qtype!r}; choose one of {QTYPES}.")
    src = ref.target
    path = src.with_name(src.name.replace("-f32.gguf", f"-{qtype.lower()}.gguf"))
    if path == src:
        path = src.with_name(f"{src.stem}-{qtype.lower()}.gguf")
    if path.is_file():
        return path
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        if qtype == "Q8_0":
            _write_q8_0(src, tmp)
        else:
            _run_llama_quantize(quantize_bin, src, tmp, qtype)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if say:
        say(f"reference: wrote {path.name} ({path.stat().st_size / 1e6:.1f} MB, {qtype})")
    return path


def _write_q8_0(src: Path, dst: Path) -> None:
    """Copy `src` with its 2-D F32 weights quantized to Q8_0 (the same keys, same order)."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import quantize

    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch=arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.add_file_type(GGMLQuantizationType.Q8_0)
    for t in r.tensors:
        data = np.asarray(t.data)
        if data.ndim == 2:
            w.add_tensor(
                t.name,
                quantize(data, GGMLQuantizationType.Q8_0),
                raw_dtype=GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(t.name, data)
    common.finish(w)


def _run_llama_quantize(binary: Path | None, src: Path, dst: Path, qtype: str) -> None:
    if binary is None or not Path(binary).is_file():
        raise LlamaspecError(
            f"A {qtype} copy needs the pinned llama-quantize (not found: {binary}).",
            details="Build only that target in the pinned build tree: "
            "cmake --build BUILD_DIR --target llama-quantize",
        )
    procs.run([str(binary), str(src), str(dst), qtype, "1"], timeout=600, what="llama-quantize")
    if not dst.is_file():
        raise LlamaspecError(f"llama-quantize {qtype} wrote no file at {dst}")
