"""The random-weight DFlash and DSpark reference drafters and their llama target."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from gguf import GGUFReader

from llamaspec.proof.refmodels import dflash as df

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    fields = {k: f.contents() for k, f in r.fields.items()}
    tensors = {t.name: t for t in r.tensors}
    return fields, tensors


def test_pairs_name_their_types_and_share_one_target() -> None:
    one, spark = df.pair(1), df.dspark_pair(1)
    assert (one.name, one.spec_types, one.engine) == ("dflash", ("dflash",), "llama.cpp")
    assert (spark.name, spark.spec_types) == ("dspark", ("dspark",))
    assert one.target == spark.target and one.draft != spark.draft
    assert one.target.parent.name == f"ref-dflash-v{df.VERSION}-seed1"
    assert "dflash.target_layers" in one.how and "Markov" in spark.how
    assert not [p for p in one.target.parent.iterdir() if p.name.startswith(".tmp")]


def test_target_is_a_llama_with_a_mask_token() -> None:
    fields, tensors = read(df.pair(1).target)
    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == df.N_LAYER
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens[fields["tokenizer.ggml.mask_token_id"]] == "<mask>"
    assert [int(n) for n in tensors["output.weight"].shape] == [df.N_EMBD, len(tokens)]
    assert tensors["token_embd.weight"].tensor_type == 0  # F32


def test_drafters_have_the_keys_and_tensors_the_dflash_loader_reads() -> None:
    fields, tensors = read(df.pair(1).draft)
    assert fields["general.architecture"] == "dflash"
    assert list(fields["dflash.target_layers"]) == list(df.TARGET_LAYERS)
    assert fields["dflash.block_size"] == df.BLOCK_SIZE
    assert fields["tokenizer.ggml.mask_token_id"] == df.MASK_ID
    n_enc = len(df.TARGET_LAYERS) * df.N_EMBD
    assert [int(n) for n in tensors["fc.weight"].shape] == [n_enc, df.N_EMBD]
    for name in ("enc.output_norm.weight", "blk.0.attn_q_norm.weight", "output.weight"):
        assert name in tensors
    assert not [n for n in tensors if n.startswith(("markov", "conf"))]  # a DFlash draft

    fields, tensors = read(df.dspark_pair(1).draft)
    assert fields["dflash.sample_from_anchor"] is True
    n_vocab = len(df.vocabulary()[0])
    assert [int(n) for n in tensors["markov_w1.weight"].shape] == [df.MARKOV_RANK, n_vocab]
    assert [int(n) for n in tensors["markov_w2.weight"].shape] == [df.MARKOV_RANK, n_vocab]
    assert [int(n) for n in tensors["conf_proj.weight"].shape] == [df.N_EMBD + df.MARKOV_RANK, 1]


def test_the_drafter_copies_the_target_head_and_the_markov_head_mostly_agrees() -> None:
    _, tgt = read(df.pair(1).target)
    _, dft = read(df.pair(1).draft)
    for name in ("output.weight", "output_norm.weight"):
        assert np.array_equal(tgt[name].data, dft[name].data)
    _, spark = read(df.dspark_pair(1).draft)
    bias = np.asarray(spark["markov_w1.weight"].data) @ np.asarray(spark["markov_w2.weight"].data).T
    agree = (bias.argmax(1) == df.bigram_logits(1).argmax(1)).mean()
    assert 0.2 < agree < 0.95  # a useful draft, not a perfect one


def test_a_seed_gives_the_same_bytes_and_another_seed_other_weights(tmp_path) -> None:
    one = df.pair(1)
    df.write_target(tmp_path / "t.gguf", 1)
    df.write_draft(tmp_path / "d.gguf", 1, dspark=False)
    assert digest(tmp_path / "t.gguf") == digest(one.target)
    assert digest(tmp_path / "d.gguf") == digest(one.draft)
    df.write_draft(tmp_path / "s.gguf", 1, dspark=True)
    assert digest(tmp_path / "s.gguf") == digest(df.dspark_pair(1).draft)
    two = df.pair(2)
    assert digest(two.target) != digest(one.target)
    assert digest(two.draft) != digest(one.draft)
    assert df.pair(1) == one  # cached: written once
