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
`gguf` package's numpy quantizer) or Q4_K_M (the pinned `llama-quantize`) copies, and
`study()` compares plain and draft-mtp greedy output on them (reports/mtp-quantized-oracle).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import procs
from llamaspec.errors import LlamaspecError
from llamaspec.proof.refmodels import RefPair, Say, cached

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

# SentencePiece token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6

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


def vocabulary() -> tuple[list[str], list[int]]:
    """<unk> <s> </s>, newline and tab as byte tokens, `▁` for space, printable ASCII."""
    tokens = ["<unk>", "<s>", "</s>", "<0x0A>", "<0x09>", "\u2581"]
    types = [UNKNOWN, CONTROL, CONTROL, BYTE, BYTE, NORMAL]
    for code in range(0x21, 0x7F):
        tokens.append(chr(code))
        types.append(NORMAL)
    return tokens, types


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
    tokens, types = vocabulary()
    n_vocab = len(tokens)
    n_all = N_TRUNK + N_NEXTN

    def dense(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        """(rows, cols) = GGUF shape [cols, rows]: `cols` inputs, unit-variance outputs."""
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32)

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
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)

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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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


# --- the greedy comparison on quantized copies (upstream #25618) -------------------------

STUDY_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little house by the river.",
    "It is a truth universally acknowledged, that",
    "Speculative decoding drafts tokens that the target model verifies.",
)
STUDY_N_PREDICT = (64, 128)
SERVER_FLAGS = ("-c", "16384", "-np", "4", "--no-kv-unified", "-fa", "off", "--no-warmup")
SPEC_N_MAX = 3  # the pinned server's default draft length


def spec_flags() -> list[str]:
    """draft-mtp in the pinned upstream server's spelling (no draft file)."""
    from llamaspec.models.dialects import SpecSettings, spec_args

    return spec_args("upstream", SpecSettings("mtp", n_max=SPEC_N_MAX))


@dataclass(frozen=True)
class Run:
    """One greedy request: its tokens and the server's draft counters."""

    mode: str  # "sequential" | "parallel" (4 requests at once on 4 slots)
    prompt: str
    n_predict: int
    tokens: tuple[int, ...]
    draft_n: int
    accepted: int


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def greedy_runs(
    server_bin: Path, model: Path, extra: Sequence[str], log: Path, threads: int = 2
) -> list[Run]:
    """Every study prompt × n_predict, one request at a time, then four at a time, on one
    server (`SERVER_FLAGS` + `extra`)."""
    from concurrent.futures import ThreadPoolExecutor

    from llamaspec.runtime.client import request, running

    args = ["-m", str(model), *SERVER_FLAGS, "-t", str(threads), *extra]
    jobs = [(p, n) for n in STUDY_N_PREDICT for p in STUDY_PROMPTS]
    runs: list[Run] = []

    def one(srv, mode: str, prompt: str, n: int) -> Run:
        reply = srv.post("/completion", request(prompt, n_predict=n))
        t = reply.get("timings", {})
        return Run(
            mode,
            prompt,
            n,
            tuple(int(x) for x in reply["tokens"]),
            int(t.get("draft_n") or 0),
            int(t.get("draft_n_accepted") or 0),
        )

    with running(server_bin, args, log, ready_timeout=300) as srv:
        runs += [one(srv, "sequential", p, n) for p, n in jobs]
        with ThreadPoolExecutor(4) as pool:
            for n in STUDY_N_PREDICT:
                batch = [pool.submit(one, srv, "parallel", p, n) for p in STUDY_PROMPTS]
                runs += [f.result() for f in batch]
    return runs


def matched(plain: list[Run], spec: list[Run]) -> list[tuple[Run, Run]]:
    """Each speculative run with the plain run of the same mode, prompt and n_predict."""
    base = {(r.mode, r.prompt, r.n_predict): r for r in plain}
    return [(base[(r.mode, r.prompt, r.n_predict)], r) for r in spec]


def divergences(
    server_bin: Path, model: Path, plain: list[Run], spec: list[Run], log: Path
) -> list[dict]:
    """For each speculative run that differs from the plain run of the same mode, prompt and
    n_predict: the first differing index, both tokens, and a plain one-slot server's
    log-probabilities of both after exactly prompt + the common prefix (whole vocabulary)."""
    from llamaspec.runtime.client import request, running

    found: list[dict] = []
    pending = [
        (p, s, i)
        for p, s in matched(plain, spec)
        if (i := first_difference(p.tokens, s.tokens)) is not None
    ]
    if not pending:
        return found
    n_vocab = len(vocabulary()[0])
    args = ["-m", str(model), "-c", "4096", "-np", "1", "-fa", "off", "--no-warmup", "-t", "2"]
    with running(server_bin, args, log, ready_timeout=300) as srv:
        for p, s, i in pending:
            ids = srv.tokenize(p.prompt)
            reply = srv.post(
                "/completion",
                request([*ids, *p.tokens[:i]], n_predict=1, n_probs=n_vocab),
            )
            entry = (reply.get("completion_probabilities") or [{}])[0]
            top = {int(t["id"]): float(t["logprob"]) for t in entry.get("top_logprobs", [])}
            a = p.tokens[i] if i < len(p.tokens) else None
            b = s.tokens[i] if i < len(s.tokens) else None
            found.append(
                {
                    "mode": s.mode,
                    "prompt": s.prompt,
                    "n_predict": s.n_predict,
                    "index": i,
                    "plain_token": a,
                    "plain_piece": srv.detokenize([a]) if a is not None else None,
                    "spec_token": b,
                    "spec_piece": srv.detokenize([b]) if b is not None else None,
                    "reference_choice": int(entry["id"]) if "id" in entry else None,
                    "logprob_plain_token": top.get(a) if a is not None else None,
                    "logprob_spec_token": top.get(b) if b is not None else None,
                }
            )
    return found


def study(
    server_bin: Path,
    models: dict[str, Path],
    workdir: Path,
    threads: int = 2,
    say: Say | None = None,
) -> dict:
    """Plain vs draft-mtp greedy outputs for each model (label -> GGUF): per mode the
    identical count, drafted/accepted, and every divergence with its log-probabilities."""
    out: dict = {"prompts": list(STUDY_PROMPTS), "n_predict": list(STUDY_N_PREDICT)}
    out["server_flags"] = [*SERVER_FLAGS, "-t", str(threads)]
    out["spec_flags"] = spec_flags()
    out["models"] = {}
    for label, model in models.items():
        if say:
            say(f"study: {label} plain")
        plain = greedy_runs(server_bin, model, [], workdir / f"{label}-plain.log", threads)
        if say:
            say(f"study: {label} draft-mtp")
        spec = greedy_runs(server_bin, model, spec_flags(), workdir / f"{label}-mtp.log", threads)
        seq = {(r.prompt, r.n_predict): r.tokens for r in plain if r.mode == "sequential"}
        modes = {}
        for mode in ("sequential", "parallel"):
            ours = [(p, r) for p, r in matched(plain, spec) if r.mode == mode]
            same = [r for p, r in ours if first_difference(p.tokens, r.tokens) is None]
            ours = [r for _, r in ours]
            drafted, accepted = sum(r.draft_n for r in ours), sum(r.accepted for r in ours)
            modes[mode] = {
                "requests": len(ours),
                "identical_to_plain": len(same),
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": round(accepted / drafted, 3) if drafted else None,
            }
        plain_par_same = sum(
            1 for r in plain if r.mode == "parallel" and r.tokens == seq[(r.prompt, r.n_predict)]
        )
        out["models"][label] = {
            "file": model.name,
            "bytes": model.stat().st_size,
            "plain_parallel_identical_to_plain_sequential": plain_par_same,
            "modes": modes,
            "divergences": divergences(
                server_bin, model, plain, spec, workdir / f"{label}-oracle.log"
            ),
        }
    return out


def study_markdown(result: dict) -> str:
    """The study's JSON as a Markdown table (one row per model and mode) and its divergences."""
    rows = [
        "| copy | file (bytes) | mode | identical / requests | drafted | accepted | acceptance |",
        "|---|---|---|---|---|---|---|",
    ]
    diffs = []
    for label, m in result["models"].items():
        for mode, v in m["modes"].items():
            acc = f"{v['acceptance']:.1%}" if v["acceptance"] is not None else "-"
            rows.append(
                f"| {label} | `{m['file']}` ({m['bytes']}) | {mode} | "
                f"{v['identical_to_plain']} / {v['requests']} | {v['drafted']} | "
                f"{v['accepted']} | {acc} |"
            )
        for d in m["divergences"]:
            diffs.append(
                f"| {label} | {d['mode']} | {d['prompt'][:32]}... | {d['n_predict']} | "
                f"{d['index']} | {d['plain_token']} {d['plain_piece']!r} | "
                f"{d['spec_token']} {d['spec_piece']!r} | {d['logprob_plain_token']} | "
                f"{d['logprob_spec_token']} |"
            )
    out = "\n".join(rows) + "\n"
    if diffs:
        head = [
            "| copy | mode | prompt | n_predict | first differing index | plain token | "
            "draft-mtp token | logprob(plain) | logprob(draft-mtp) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        out += "\nDivergences (log-probabilities from a plain one-slot server after the "
        out += "prompt and the common prefix):\n\n" + "\n".join(head + diffs) + "\n"
    else:
        out += "\nNo divergence: every draft-mtp output equals the plain output.\n"
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m llamaspec.proof.refmodels.mtp SERVER QUANTIZE OUT.json`: the study on
    the F32, Q8_0 and Q4_K_M copies of `pair(seed)`, written as JSON."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m llamaspec.proof.refmodels.mtp")
    ap.add_argument("server", type=Path, help="the pinned llama-server")
    ap.add_argument("quantize", type=Path, help="the pinned llama-quantize")
    ap.add_argument("out", type=Path, help="the JSON report to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--copies", default="F32,Q8_0,Q4_K_M", help="which copies, in order")
    a = ap.parse_args(argv)
    ref = pair(a.seed, say=print)
    models = {
        c: ref.target if c == "F32" else quantized(ref, c, a.quantize, say=print)
        for c in a.copies.split(",")
    }
    work = a.out.with_suffix(".logs")
    work.mkdir(parents=True, exist_ok=True)
    result = study(a.server, models, work, a.threads, say=print)
    result["generator"] = f"llamaspec.proof.refmodels.mtp.pair(seed={a.seed}), VERSION {VERSION}"
    result["quantized_with"] = {"Q8_0": "gguf.quants.quantize", "Q4_K_M": "llama-quantize"}
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    a.out.with_suffix(".table.md").write_text(study_markdown(result))


if __name__ == "__main__":
    main()
