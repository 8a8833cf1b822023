"""The random GLM-4.5-style target with a NextN (MTP) block, for ik_llama.cpp's -mtp."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGUFReader

from llamaspec.proof.refmodels import glm4moe as gm

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_pair_is_the_target_alone_with_its_mtp_head() -> None:
    pair = gm.pair(1)
    assert pair.name == "glm4moe-mtp" and pair.draft is None
    assert pair.spec_types == ("mtp",) and pair.engine == "ik_llama.cpp"
    assert pair.target.name == "glm4moe-mtp.gguf"
    assert pair.target.parent.name == f"ref-glm4moe-mtp-v{gm.VERSION}-seed1"
    assert "nextn" in pair.how.lower() and "ik_llama.cpp" in pair.how
    assert pair.target.stat().st_size < 4_000_000
    assert [p.name for p in pair.target.parent.iterdir()] == ["glm4moe-mtp.gguf"]  # no temp


def test_a_seed_gives_the_same_file_and_another_seed_other_weights(tmp_path) -> None:
    one = gm.pair(1).target
    gm.write(tmp_path / "again.gguf", 1)
    assert digest(tmp_path / "again.gguf") == digest(one)
    assert digest(gm.pair(2).target) != digest(one)
    assert gm.pair(1).target == one  # cached: written once


def test_layout_is_what_the_glm4moe_loaders_read() -> None:
    r = GGUFReader(str(gm.pair(1).target))
    fields = {k: f.contents() for k, f in r.fields.items()}
    assert fields["general.architecture"] == "glm4moe"
    assert fields["glm4moe.block_count"] == gm.N_LAYER == 3
    assert fields["glm4moe.nextn_predict_layers"] == gm.N_NEXTN == 1
    assert fields["glm4moe.leading_dense_block_count"] == 1
    assert fields["glm4moe.expert_count"] == gm.N_EXPERT
    assert fields["glm4moe.expert_used_count"] == gm.N_EXPERT_USED
    assert fields["glm4moe.expert_shared_count"] == gm.N_EXPERT_SHARED
    assert fields["glm4moe.expert_feed_forward_length"] == gm.N_FF_EXP
    assert fields["glm4moe.expert_gating_func"] == 2  # sigmoid
    assert fields["tokenizer.ggml.model"] == "llama"
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and "\u2581" in tokens
    tensors = {t.name: t for t in r.tensors}
    shapes = {n: [int(x) for x in t.shape] for n, t in tensors.items()}
    assert all(t.tensor_type.name == "F32" for t in r.tensors)
    n_vocab, n_embd = len(tokens), gm.N_EMBD
    # block 0 dense, blocks 1 and 2 MoE; every block has GLM's q/k/v biases
    assert "blk.0.ffn_gate.weight" in shapes and "blk.0.ffn_gate_inp.weight" not in shapes
    for i in (1, 2):
        assert shapes[f"blk.{i}.ffn_up_exps.weight"] == [n_embd, gm.N_FF_EXP, gm.N_EXPERT]
        assert shapes[f"blk.{i}.exp_probs_b.bias"] == [gm.N_EXPERT]
        assert f"blk.{i}.ffn_down_shexp.weight" in shapes
    assert all(f"blk.{i}.attn_{x}.bias" in shapes for i in range(3) for x in "qkv")
    # the NextN tensors on the last block alone
    nextn = sorted(n for n in shapes if ".nextn." in n)
    names = ("eh_proj", "embed_tokens", "enorm", "hnorm", "shared_head_head", "shared_head_norm")
    assert nextn == [f"blk.2.nextn.{x}.weight" for x in names]
    assert shapes["blk.2.nextn.eh_proj.weight"] == [2 * n_embd, n_embd]
    assert shapes["blk.2.nextn.shared_head_head.weight"] == [n_embd, n_vocab]
    # the head drafts the target's bigram: the embedding passes through, the matrices are shared
    eh = np.asarray(tensors["blk.2.nextn.eh_proj.weight"].data).reshape(n_embd, 2 * n_embd)
    assert np.array_equal(eh[:, :n_embd], np.eye(n_embd, dtype=np.float32))
    assert np.abs(eh[:, n_embd:]).max() < 0.2
    for mine, target in (("embed_tokens", "token_embd"), ("shared_head_head", "output")):
        a = np.asarray(tensors[f"blk.2.nextn.{mine}.weight"].data)
        assert np.array_equal(a, np.asarray(tensors[f"{target}.weight"].data))
    head = np.asarray(tensors["output.weight"].data).reshape(n_vocab, n_embd)
    assert not head[: gm.N_SPECIAL].any()  # <unk> <s> </s> are never predicted
