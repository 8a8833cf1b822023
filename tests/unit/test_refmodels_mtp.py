"""The random hy_v3 target with a built-in MTP (NextN) block, and its quantized copies."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from llamaspec.errors import LlamaspecError
from llamaspec.proof.refmodels import mtp, mtp_study

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_pair_is_the_target_alone_with_the_mtp_spec_type() -> None:
    ref = mtp.pair(1)
    assert (ref.name, ref.draft, ref.spec_types) == ("mtp", None, ("mtp",))
    assert ref.target.parent.name == f"ref-mtp-v{mtp.VERSION}-seed1"
    assert "hy_v3" in ref.how and "seed 1" in ref.how
    assert not [p for p in ref.target.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_seed_gives_the_same_bytes_and_another_seed_other_weights(tmp_path) -> None:
    one = mtp.pair(1).target
    mtp.write(tmp_path / "again.gguf", 1)
    assert digest(tmp_path / "again.gguf") == digest(one)
    assert digest(mtp.pair(2).target) != digest(one)
    assert mtp.pair(1).target == one  # cached: written once


def test_layout_is_what_the_pinned_hy_v3_loader_reads() -> None:
    r = GGUFReader(str(mtp.pair(1).target))
    fields = {k: f.contents() for k, f in r.fields.items()}
    assert fields["general.architecture"] == "hy_v3"
    assert fields["hy_v3.block_count"] == mtp.N_TRUNK + mtp.N_NEXTN
    assert fields["hy_v3.nextn_predict_layers"] == mtp.N_NEXTN
    assert fields["hy_v3.expert_feed_forward_length"] == mtp.N_FF
    assert "hy_v3.expert_count" not in fields  # dense: no experts anywhere
    assert fields["tokenizer.ggml.model"] == "llama"
    names = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    n_vocab = len(fields["tokenizer.ggml.tokens"])
    assert names["output.weight"] == [mtp.N_EMBD, n_vocab]
    nextn = f"blk.{mtp.N_TRUNK}"
    assert names[f"{nextn}.nextn.eh_proj.weight"] == [2 * mtp.N_EMBD, mtp.N_EMBD]
    for t in ("enorm", "hnorm", "shared_head_norm"):
        assert names[f"{nextn}.nextn.{t}.weight"] == [mtp.N_EMBD]
    assert not [n for n in names if n.startswith("blk.0.nextn")]  # trunk blocks: no heads
    assert not [n for n in names if "exps" in n or "gate_inp" in n]
    for i in range(mtp.N_TRUNK + mtp.N_NEXTN):  # every block is a full dense decoder block
        assert names[f"blk.{i}.ffn_down.weight"] == [mtp.N_FF, mtp.N_EMBD]
        assert names[f"blk.{i}.attn_q_norm.weight"] == [mtp.HEAD_DIM]
    assert {t.tensor_type for t in r.tensors} == {GGMLQuantizationType.F32}
    head = next(t for t in r.tensors if t.name == "output.weight").data
    assert not np.any(head[:3])  # control tokens are never the greedy choice


def test_the_q8_0_copy_keeps_the_keys_and_quantizes_the_matrices() -> None:
    ref = mtp.pair(1)
    q8 = mtp.quantized(ref, "Q8_0")
    assert q8.parent == ref.target.parent and q8.name == "hy-v3-mtp-q8_0.gguf"
    assert mtp.quantized(ref, "Q8_0") == q8  # written once
    assert not [p for p in q8.parent.iterdir() if p.name.startswith(".tmp-")]
    src, got = GGUFReader(str(ref.target)), GGUFReader(str(q8))
    keys = lambda r: {k for k in r.fields if not k.startswith("GGUF.")}  # noqa: E731
    assert keys(got) - keys(src) == {"general.file_type"} and keys(src) <= keys(got)
    assert (
        got.fields["tokenizer.ggml.tokens"].contents()
        == src.fields["tokenizer.ggml.tokens"].contents()
    )
    types = {t.name: t.tensor_type for t in got.tensors}
    assert types["blk.2.nextn.eh_proj.weight"] == GGMLQuantizationType.Q8_0
    assert types["output.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32
    assert [t.name for t in got.tensors] == [t.name for t in src.tensors]


def test_q4_k_needs_the_pinned_llama_quantize(tmp_path) -> None:
    with pytest.raises(LlamaspecError, match="llama-quantize"):
        mtp.quantized(mtp.pair(1), "Q4_K_M", quantize_bin=tmp_path / "absent")
    with pytest.raises(LlamaspecError, match="Q8_0"):
        mtp.quantized(mtp.pair(1), "Q5_1")


def test_first_difference_counts_a_length_difference() -> None:
    assert mtp_study.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert mtp_study.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert mtp_study.first_difference([1, 2], [1, 2, 3]) == 2


def test_the_study_table_names_each_divergence() -> None:
    mode = {"requests": 8, "identical_to_plain": 7, "drafted": 10, "accepted": 4}
    diff = {
        "mode": "parallel",
        "prompt": "The quick brown fox",
        "n_predict": 64,
        "index": 17,
        "plain_token": 40,
        "plain_piece": "N",
        "spec_token": 41,
        "spec_piece": "O",
        "logprob_plain_token": -0.01,
        "logprob_spec_token": -4.6,
    }
    result = {
        "models": {
            "Q4_K_M": {
                "file": "m.gguf",
                "bytes": 1,
                "modes": {"parallel": {**mode, "acceptance": 0.4}},
                "divergences": [diff],
            }
        }
    }
    md = mtp_study.study_markdown(result)
    assert "| Q4_K_M | `m.gguf` (1) | parallel | 7 / 8 | 10 | 4 | 40.0% |" in md
    assert "| 17 | 40 'N' | 41 'O' | -0.01 | -4.6 |" in md
    result["models"]["Q4_K_M"]["divergences"] = []
    assert "No divergence" in mtp_study.study_markdown(result)


def test_the_quantized_near_tie_is_catalogued_for_the_default_upstream_pin() -> None:
    from llamaspec.proof.defects import defects_for

    manifest = {"engine": "llama.cpp", "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}
    found = defects_for(manifest, "quantized-divergence")
    assert [d.id for d in found] == ["quantized-spec-near-tie"]
    assert found[0].targets == "quantized" and "25618" in found[0].issue
    assert defects_for(manifest, "short-output") == []  # verify's excuse is unchanged
