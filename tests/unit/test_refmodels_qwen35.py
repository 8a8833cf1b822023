"""The random Qwen3.5/3.6-style hybrids (qwen35, qwen35moe) with a NextN (MTP) block."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from llamaspec.proof.refmodels import qwen35 as q
from llamaspec.proof.refmodels import registry

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items()}
    return fields, {t.name: t for t in r.tensors}


@pytest.mark.parametrize(
    ("make", "name", "arch"),
    [(q.pair, "qwen35-mtp", "qwen35"), (q.moe_pair, "qwen35moe-mtp", "qwen35moe")],
)
def test_each_pair_is_the_target_alone_with_its_mtp_head(make, name, arch) -> None:
    ref = make(1)
    assert (ref.name, ref.draft, ref.spec_types, ref.engine) == (name, None, ("mtp",), "llama.cpp")
    assert ref.target.parent.name == f"ref-{name}-v{q.VERSION}-seed1"
    assert f"arch {arch}" in ref.how and "seed 1" in ref.how and "rolls the recurrent" in ref.how
    assert ref.target.stat().st_size < 3_000_000  # a few MB at most: loads in a blink
    assert [p.name for p in ref.target.parent.iterdir()] == [f"{name}.gguf"]  # no temp file
    family = registry.BY_NAME[name]
    assert family.arch == arch and arch in family.what and family.types == ("mtp",)


def test_a_seed_gives_the_same_bytes_and_another_seed_or_arch_other_ones(tmp_path) -> None:
    one = q.pair(1).target
    q.write(tmp_path / "again.gguf", 1)
    assert digest(tmp_path / "again.gguf") == digest(one)
    assert digest(q.pair(2).target) != digest(one)
    assert digest(q.moe_pair(1).target) != digest(one)
    assert q.pair(1).target == one  # cached: written once
    with pytest.raises(ValueError, match="qwen3next"):
        q.write(tmp_path / "x.gguf", 1, "qwen3next")


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_layout_is_what_the_pinned_qwen35_loaders_read(arch) -> None:
    fields, tensors = read((q.pair if arch == "qwen35" else q.moe_pair)(1).target)
    assert fields["general.architecture"] == arch
    n_all = q.N_TRUNK + q.N_NEXTN
    assert fields[f"{arch}.block_count"] == n_all == 5
    assert fields[f"{arch}.nextn_predict_layers"] == 1
    assert fields[f"{arch}.full_attention_interval"] == q.ATTN_EVERY == 4
    assert fields[f"{arch}.rope.dimension_sections"] == list(q.ROPE_SECTIONS)
    assert fields[f"{arch}.ssm.inner_size"] == q.SSM_STATE * q.SSM_V_HEADS
    for key, want in (
        ("conv_kernel", 4),
        ("state_size", 16),
        ("time_step_rank", 4),
        ("group_count", 2),
    ):
        assert fields[f"{arch}.ssm.{key}"] == want
    assert fields[f"{arch}.attention.head_count_kv"] == q.N_HEAD_KV
    assert fields["tokenizer.ggml.model"] == "llama"
    n_vocab, n_embd = len(fields["tokenizer.ggml.tokens"]), q.N_EMBD
    shapes = {n: [int(x) for x in t.shape] for n, t in tensors.items()}
    assert {t.tensor_type for t in tensors.values()} == {GGMLQuantizationType.F32}
    # blocks 0-2: gated delta net (recurrent); block 3 full attention; block 4 NextN
    key_dim, value_dim = 16 * 2, 16 * 4
    for i in range(3):
        assert shapes[f"blk.{i}.attn_qkv.weight"] == [n_embd, 2 * key_dim + value_dim]
        assert shapes[f"blk.{i}.attn_gate.weight"] == [n_embd, value_dim]
        assert shapes[f"blk.{i}.ssm_conv1d.weight"] == [4, 2 * key_dim + value_dim]
        assert shapes[f"blk.{i}.ssm_a"] == shapes[f"blk.{i}.ssm_dt.bias"] == [4]
        assert shapes[f"blk.{i}.ssm_out.weight"] == [value_dim, n_embd]
        assert f"blk.{i}.attn_q.weight" not in shapes
        assert (np.asarray(tensors[f"blk.{i}.ssm_a"].data) < 0).all()  # decays
    for i in (3, 4):
        assert shapes[f"blk.{i}.attn_q.weight"] == [n_embd, 2 * q.N_HEAD * q.HEAD_DIM]  # + gate
        assert shapes[f"blk.{i}.attn_k.weight"] == [n_embd, q.N_HEAD_KV * q.HEAD_DIM]
        assert f"blk.{i}.ssm_a" not in shapes
    assert all(f"blk.{i}.post_attention_norm.weight" in shapes for i in range(n_all))
    if arch == "qwen35":
        assert fields["qwen35.feed_forward_length"] == q.N_FF
        assert not [n for n in shapes if "exps" in n or "gate_inp" in n]
        assert shapes["blk.4.ffn_down.weight"] == [q.N_FF, n_embd]
    else:
        assert fields["qwen35moe.expert_count"] == q.N_EXPERT
        assert fields["qwen35moe.expert_used_count"] == q.N_EXPERT_USED
        assert fields["qwen35moe.expert_feed_forward_length"] == q.N_FF_EXP
        assert fields["qwen35moe.expert_shared_feed_forward_length"] == q.N_FF_SHEXP
        for i in range(n_all):
            assert shapes[f"blk.{i}.ffn_up_exps.weight"] == [n_embd, q.N_FF_EXP, q.N_EXPERT]
            assert shapes[f"blk.{i}.ffn_down_exps.weight"] == [q.N_FF_EXP, n_embd, q.N_EXPERT]
            assert shapes[f"blk.{i}.ffn_gate_inp_shexp.weight"] == [n_embd]
        assert not [n for n in shapes if n.endswith(".ffn_gate.weight")]
    # the NextN tensors on the last block alone, as a converted Qwen3.5 checkpoint has them
    nextn = sorted(n for n in shapes if ".nextn." in n)
    names = ("eh_proj", "enorm", "hnorm", "shared_head_norm")
    assert nextn == [f"blk.4.nextn.{x}.weight" for x in names]
    eh = np.asarray(tensors["blk.4.nextn.eh_proj.weight"].data).reshape(n_embd, 2 * n_embd)
    assert np.array_equal(eh[:, :n_embd], np.eye(n_embd, dtype=np.float32))
    assert 0 < np.abs(eh[:, n_embd:]).max() < 0.5  # the hidden state mixed in faintly
    shared = np.asarray(tensors["blk.4.nextn.shared_head_norm.weight"].data)
    assert np.array_equal(shared, np.asarray(tensors["output_norm.weight"].data))
    head = np.asarray(tensors["output.weight"].data).reshape(n_vocab, n_embd)
    assert not head[: q.N_SPECIAL].any() and head[q.N_SPECIAL :].any()
