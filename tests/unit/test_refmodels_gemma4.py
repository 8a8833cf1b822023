"""The random Gemma 4 target and its assistant drafter (draft-mtp with a separate file)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGUFReader

from llamaspec.proof.refmodels import gemma4 as g4

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items()}
    shapes = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    return fields, shapes


def test_pair_names_the_files_and_the_mtp_type() -> None:
    pair = g4.pair(1)
    assert pair.name == "gemma4" and pair.spec_types == ("mtp",)
    assert pair.engine == "llama.cpp" and "draft-mtp" in pair.how
    assert pair.target.name == g4.TARGET_FILE and pair.draft is not None
    assert pair.draft.name == g4.DRAFT_FILE
    assert pair.target.parent.name == f"ref-gemma4-v{g4.VERSION}-seed1"
    assert pair.draft.parent == pair.target.parent
    assert not [p for p in pair.target.parent.iterdir() if p.name.startswith(".tmp")]
    assert g4.pair(1) == pair  # cached: written once


def test_the_target_is_what_the_gemma4_loader_reads() -> None:
    fields, shapes = read(g4.pair(1).target)
    assert fields["general.architecture"] == "gemma4"
    assert fields["gemma4.embedding_length"] == g4.N_EMBD
    assert fields["gemma4.block_count"] == len(g4.SWA_PATTERN)
    assert fields["gemma4.attention.sliding_window_pattern"] == list(g4.SWA_PATTERN)
    assert g4.SWA_PATTERN[-2:] == (True, False)  # the assistant shares layers n-2 and n-1
    assert fields["gemma4.attention.sliding_window"] == g4.N_SWA
    assert fields["gemma4.attention.key_length_swa"] == g4.HEAD_DIM_SWA
    assert fields["gemma4.embedding_length_per_layer_input"] == 0
    assert "gemma4.nextn_predict_layers" not in fields  # the target carries no MTP head
    n_vocab = len(fields["tokenizer.ggml.tokens"])
    assert shapes["token_embd.weight"] == [g4.N_EMBD, n_vocab]
    assert shapes["output.weight"] == [g4.N_EMBD, n_vocab]
    assert shapes["rope_freqs.weight"] == [g4.HEAD_DIM // 2]
    assert shapes["blk.0.attn_q.weight"] == [g4.N_EMBD, g4.N_HEAD * g4.HEAD_DIM_SWA]
    assert shapes["blk.3.attn_k.weight"] == [g4.N_EMBD, g4.N_HEAD_KV * g4.HEAD_DIM]
    assert "blk.3.post_ffw_norm.weight" in shapes


def test_the_assistant_is_what_the_gemma4_assistant_loader_reads() -> None:
    fields, shapes = read(g4.pair(1).draft)
    assert fields["general.architecture"] == "gemma4-assistant"
    arch = "gemma4-assistant"
    assert fields[f"{arch}.embedding_length"] == g4.A_EMBD
    assert fields[f"{arch}.embedding_length_out"] == g4.N_EMBD != g4.A_EMBD
    layers = len(g4.A_SWA_PATTERN)
    assert fields[f"{arch}.block_count"] == fields[f"{arch}.nextn_predict_layers"] == layers
    assert fields[f"{arch}.attention.head_count_kv"] == g4.N_HEAD_KV
    assert shapes["nextn.pre_projection.weight"] == [2 * g4.N_EMBD, g4.A_EMBD]
    assert shapes["nextn.post_projection.weight"] == [g4.A_EMBD, g4.N_EMBD]
    assert shapes["blk.0.layer_output_scale.weight"] == [1]
    assert not [n for n in shapes if ".attn_k." in n or ".attn_v." in n]  # reads the target's
    assert "output.weight" not in shapes  # the head is tied to token_embd
    assert not [n for n in shapes if "eh_proj" in n]  # so the type is not inferred: name it
    target_fields, _ = read(g4.pair(1).target)
    assert fields["tokenizer.ggml.tokens"] == target_fields["tokenizer.ggml.tokens"]


def test_a_seed_gives_the_same_bytes_and_another_seed_other_weights(tmp_path) -> None:
    one = g4.pair(1)
    g4.write(tmp_path / "t.gguf", 1, "target")
    g4.write(tmp_path / "a.gguf", 1, "assistant")
    assert digest(tmp_path / "t.gguf") == digest(one.target)
    assert digest(tmp_path / "a.gguf") == digest(one.draft)
    two = g4.pair(2)
    assert digest(two.target) != digest(one.target)
    assert digest(two.draft) != digest(one.draft)


def test_the_assistant_predicts_the_targets_bigram_choice() -> None:
    """Without the small branches, the assistant's logits for a token equal the target's."""
    arrays = g4._arrays(1)
    t, a = arrays["target"], arrays["assistant"]

    def rms_norm(v: np.ndarray) -> np.ndarray:
        return v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True))

    x = t["token_embd.weight"] * np.sqrt(g4.N_EMBD)  # the target's scaled input rows
    target = rms_norm(x) * t["output_norm.weight"] @ t["output.weight"].T
    pre = a["nextn.pre_projection.weight"][:, : g4.N_EMBD]  # the token half
    draft = rms_norm(x @ pre.T) * a["output_norm.weight"] @ a["token_embd.weight"].T
    np.testing.assert_allclose(draft, target, atol=1e-3)
    top = np.sort(target, axis=1)[:, -2:]
    assert (top[:, 1] - top[:, 0] < 3.0).mean() > 0.2  # close runners-up: some get flipped
