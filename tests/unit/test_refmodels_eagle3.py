"""The EAGLE-3 reference pair: an F32 llama target and an `eagle3` draft written with `gguf`."""

from __future__ import annotations

import hashlib

import pytest
from gguf import GGUFReader

from llamaspec.proof.refmodels import eagle3 as e3

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fields(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    kv = {k: f.contents() for k, f in r.fields.items()}
    shapes = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    return kv, shapes


def test_pair_names_both_files_and_the_eagle3_type() -> None:
    p = e3.pair(1)
    assert p.name == "eagle3" and p.spec_types == ("eagle3",) and p.engine == "llama.cpp"
    assert p.target.name == e3.TARGET_FILE and p.draft.name == e3.DRAFT_FILE
    assert p.target.parent.name == f"ref-eagle3-v{e3.VERSION}-seed1"
    assert "eagle3" in p.how and "target_layers" in p.how
    assert not [f for f in p.target.parent.iterdir() if f.name.startswith(".tmp")]


def test_target_is_a_llama_model_with_a_character_vocabulary() -> None:
    kv, shapes = fields(e3.pair(1).target)
    assert kv["general.architecture"] == "llama"
    assert kv["llama.embedding_length"] == e3.N_EMBD
    assert kv["llama.block_count"] == e3.N_LAYER
    assert kv["llama.rope.dimension_count"] == e3.HEAD_DIM  # the llama loader insists
    assert kv["tokenizer.ggml.model"] == "llama"
    n_vocab = len(kv["tokenizer.ggml.tokens"])
    assert shapes["token_embd.weight"] == [e3.N_EMBD, n_vocab]
    assert shapes["output.weight"] == [e3.N_EMBD, n_vocab]
    assert shapes[f"blk.{e3.N_LAYER - 1}.ffn_down.weight"] == [e3.N_FF, e3.N_EMBD]


def test_draft_has_the_keys_and_tensors_the_eagle3_loader_reads() -> None:
    p = e3.pair(1)
    kv, shapes = fields(p.draft)
    tkv, _ = fields(p.target)
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(p.draft)).tensors}
    assert kv["general.architecture"] == "eagle3"
    assert kv["eagle3.target_layers"] == list(e3.TARGET_LAYERS)
    assert len(kv["eagle3.target_layers"]) == 3
    assert max(e3.TARGET_LAYERS) <= e3.N_LAYER
    assert kv["eagle3.target_hidden_size"] == tkv["llama.embedding_length"]
    assert kv["eagle3.norm_before_residual"] is True
    assert kv["eagle3.block_count"] == 1
    assert kv["eagle3.embedding_length"] == e3.N_EMBD  # == target's: it reads its token_embd
    assert kv["tokenizer.ggml.tokens"] == tkv["tokenizer.ggml.tokens"]
    n_vocab = len(kv["tokenizer.ggml.tokens"])
    assert "token_embd.weight" not in shapes  # the engine takes the target's
    assert shapes["fc.weight"] == [3 * e3.N_EMBD, e3.N_EMBD]
    n_draft = n_vocab - e3.N_SPECIAL
    assert shapes["output.weight"] == [e3.N_EMBD, n_draft] and shapes["d2t"] == [n_draft]
    assert types["d2t"] == "I64" and types["output.weight"] == "F32"
    assert shapes["blk.0.attn_q.weight"] == [2 * e3.N_EMBD, e3.N_EMBD]
    assert shapes["blk.0.attn_norm_2.weight"] == [e3.N_EMBD]
    assert not [n for n in shapes if n.startswith("blk.1.")]


def test_draft_head_is_the_targets_head_through_d2t() -> None:
    w = e3.weights(1)
    d2t = w["draft"]["d2t"]
    n_vocab = w["target"]["output.weight"].shape[0]
    # absolute target ids, each once, none of <unk> <s> </s>, not in order
    assert sorted(d2t.tolist()) == list(range(e3.N_SPECIAL, n_vocab))
    assert d2t.tolist() != sorted(d2t.tolist())
    assert (w["draft"]["output.weight"] == w["target"]["output.weight"][d2t]).all()
    assert (w["draft"]["output_norm.weight"] == w["target"]["output_norm.weight"]).all()


def test_a_seed_gives_the_same_bytes_and_another_seed_other_weights(tmp_path) -> None:
    one = e3.pair(1)
    e3.write_target(tmp_path / "t.gguf", 1)
    e3.write_draft(tmp_path / "d.gguf", 1)
    assert digest(tmp_path / "t.gguf") == digest(one.target)
    assert digest(tmp_path / "d.gguf") == digest(one.draft)
    two = e3.pair(2)
    assert digest(two.target) != digest(one.target)
    assert digest(two.draft) != digest(one.draft)
    assert e3.pair(1) == one  # cached: written once
