"""The random Qwen3.5-style hybrid model written with `gguf` for ik_llama.cpp."""

from __future__ import annotations

import hashlib

import pytest
from gguf import GGUFReader

from llamaspec.proof import hybrid_gguf as hg

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_seed_gives_the_same_file_and_another_seed_other_weights(tmp_path) -> None:
    one = hg.hybrid_gguf(1)
    assert one.parent.name == f"qwen35-hybrid-gguf-v{hg.VERSION}-seed1"
    hg.write(tmp_path / "again.gguf", 1)
    assert digest(tmp_path / "again.gguf") == digest(one)
    assert digest(hg.hybrid_gguf(2)) != digest(one)
    assert hg.hybrid_gguf(1) == one  # cached: written once


def test_layout_is_what_ik_qwen35_loader_reads() -> None:
    r = GGUFReader(str(hg.hybrid_gguf(1)))
    fields = {k: f.contents() for k, f in r.fields.items()}
    assert fields["general.architecture"] == "qwen35"
    assert fields["qwen35.full_attention_interval"] == hg.ATTN_EVERY
    assert fields["tokenizer.ggml.model"] == "llama"
    tokens = fields["tokenizer.ggml.tokens"]
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and "\u2581" in tokens and "{" in tokens
    names = {t.name: [int(n) for n in t.shape] for t in r.tensors}
    recurrent = [i for i in range(hg.N_LAYER) if f"blk.{i}.ssm_a" in names]
    attention = [i for i in range(hg.N_LAYER) if f"blk.{i}.attn_q.weight" in names]
    assert recurrent == [0, 2] and attention == [1, 3]  # both kinds: a hybrid
    conv_dim = 2 * hg.SSM_STATE * hg.SSM_GROUPS + hg.SSM_STATE * hg.SSM_V_HEADS
    assert names["blk.0.ssm_conv1d.weight"] == [hg.SSM_CONV, conv_dim]
    assert names["blk.1.attn_q.weight"] == [hg.N_EMBD, 2 * hg.N_HEAD * hg.HEAD_DIM]
    assert names["output.weight"] == [hg.N_EMBD, len(tokens)]
    assert not [n for n in names if n.endswith("scale")]  # upstream-only tensors


def test_the_hybrid_tool_is_built_for_the_cpu_alone() -> None:
    from llamaspec.engine import profiles as flags
    from llamaspec.proof import hybrid

    cuda = [
        flags.Define("GGML_CUDA", "ON", "profile"),
        flags.Define("CMAKE_CUDA_ARCHITECTURES", "90", "user"),
        flags.Define("GGML_NATIVE", "OFF", "profile"),
        flags.Define("GGML_VULKAN", "OFF", "profile"),
    ]
    got = {d.name: d.value for d in hybrid.tool_defines(cuda)}
    assert got["GGML_CUDA"] == "OFF" and got["LLAMA_BUILD_TESTS"] == "ON"
    assert got["CMAKE_BUILD_WITH_INSTALL_RPATH"] == "OFF"
    assert got["GGML_VULKAN"] == "OFF" and got["GGML_NATIVE"] == "OFF"  # as they were
    dl = [flags.Define("GGML_BACKEND_DL", "ON", "variant"), flags.Define("GGML_VULKAN", "ON", "p")]
    got = {d.name: d.value for d in hybrid.tool_defines(dl)}
    assert got["GGML_BACKEND_DL"] == "OFF" and got["GGML_CPU_ALL_VARIANTS"] == "OFF"
    assert got["GGML_VULKAN"] == "OFF"
    cpu = [flags.Define("GGML_NATIVE", "ON", "profile")]
    assert {d.name: d.value for d in hybrid.tool_defines(cpu)}["GGML_NATIVE"] == "ON"
