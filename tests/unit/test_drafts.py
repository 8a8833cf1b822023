"""draft find's pieces that need no hub: quantization names, search terms, ranking, targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaspec.config import ModelsFile
from llamaspec.errors import LlamaspecError
from llamaspec.models import compat, drafts

from ggufs import vocab, write_gguf


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("qwen2.5-coder-0.5b-q8_0.gguf", "Q8_0"),
        ("Qwen3-32B-Q4_K_M.gguf", "Q4_K_M"),
        ("DeepSeek-R1-DRAFT-0.6B-64k-Q4_0.gguf", "Q4_0"),
        ("model-IQ3_XXS-00001-of-00003.gguf", "IQ3_XXS"),
        ("gemma-3-270m-f16.gguf", "F16"),
        ("plain.gguf", "?"),
    ],
)
def test_quant_of_file_names(name: str, quant: str) -> None:
    assert drafts.quant_of(name) == quant


def _info(tmp: Path, name: str, params: int, **kw: object) -> compat.TokenizerInfo:
    tokens = kw.pop("tokens", None) or vocab(64)
    return compat.read_local(write_gguf(tmp / name, tokens, payload_bytes=params, **kw))  # type: ignore[arg-type]


def test_header_gives_params_and_family(tmp_path: Path) -> None:
    info = _info(tmp_path, "t.gguf", 4096, basename="fam")
    assert info.params == 4096 and info.basename == "fam"
    assert drafts.family_terms(info, ["DRAFT"]) == ("DRAFT", "fam", "llama")


def test_rank_puts_compatible_near_a_sixteenth_first_then_refusals(tmp_path: Path) -> None:
    target = _info(tmp_path, "t.gguf", 1 << 16)

    def cand(name: str, params: int, **kw: object) -> drafts.Candidate:
        info = _info(tmp_path, f"{name}.gguf", params, **kw)
        src = drafts.Source("o/" + name, f"{name}.gguf", params)
        return drafts.Candidate(src, (), info, compat.check(target, info))

    tiny, good, big = cand("tiny", 1 << 8), cand("good", 1 << 12), cand("big", 1 << 17)
    refused = cand("vocab", 1 << 12, tokens=vocab(400))
    twice = cand("twice", 1 << 12, tokens=vocab(400), bos=3)
    broken = drafts.Candidate(drafts.Source("o/x", "x.gguf", 1), error="corrupt")
    ranked = drafts.rank([broken, twice, big, refused, tiny, good], target)
    assert [c.source.repo for c in ranked] == [
        "o/good",
        "o/tiny",
        "o/big",
        "o/vocab",
        "o/twice",
        "o/x",
    ]
    assert drafts.verdict_text(ranked[3]).startswith("refused: vocab size")
    assert drafts.verdict_text(ranked[-1]) == "unreadable: corrupt"


def test_local_and_malformed_targets(tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "m.gguf", vocab(16))
    src = drafts.resolve_target(str(f), ModelsFile())
    assert src.path == f.resolve() and src.repo is None
    for bad, says in (
        (str(tmp_path / "gone.gguf"), "is not a file here"),
        ("no-slash", "neither a file here nor a Hub repo"),
    ):
        with pytest.raises(LlamaspecError, match=says):
            drafts.resolve_target(bad, ModelsFile())


def test_memory_estimate_reads_the_kv_shape_from_the_header(tmp_path: Path) -> None:
    from llamaspec.perf import draft_measure as dm

    info = compat.TokenizerInfo(
        "t", "gemma3", "llama", (), None, None, None, None,
        shape=(("block_count", 18), ("attention.head_count", 4),
               ("attention.head_count_kv", 1), ("attention.key_length", 256)),
    )  # fmt: skip
    assert dm.kv_cache(info, 2048) == 2 * 18 * 1 * (256 + 256) * 2048
    bare = compat.TokenizerInfo("d", "x", "llama", (), None, None, None, None)
    assert dm.kv_cache(bare, 2048) is None
    target = drafts.Source(None, "t.gguf", 1000)
    c = drafts.Candidate(drafts.Source("o/d", "d.gguf", 100), info=bare)
    n = dm.need(target, info, c, 2048)
    # the draft without shape keys: its cache is assumed as large as its weights
    assert n.total == 1000 + dm.kv_cache(info, 2048) + 100 + 100 + 2 * dm.COMPUTE_ALLOWANCE
    assert "draft 100B + KV 100B" in n.detail
    assert dm.handle("Gemma-3 270M/Q4") == "gemma-3-270m-q4"


def test_measure_options_need_measure() -> None:
    from llamaspec.cli.main import main

    assert main(["draft", "find", "x.gguf", "--memory", "4"]) == 2
