"""draft find's pieces that need no hub: quantization names, search terms, ranking, targets."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaspec.config import ModelsFile
from llamaspec.errors import LlamaspecError
from llamaspec.models import compat, drafts, gguf_header

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


def _info(tmp: Path, name: str, params: int, **kw: object) -> gguf_header.TokenizerInfo:
    tokens = kw.pop("tokens", None) or vocab(64)
    return gguf_header.read_local(write_gguf(tmp / name, tokens, payload_bytes=params, **kw))  # type: ignore[arg-type]


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

    info = gguf_header.TokenizerInfo(
        "t", "gemma3", "llama", (), None, None, None, None,
        shape=(("block_count", 18), ("attention.head_count", 4),
               ("attention.head_count_kv", 1), ("attention.key_length", 256)),
    )  # fmt: skip
    assert dm.kv_cache(info, 2048) == 2 * 18 * 1 * (256 + 256) * 2048
    bare = gguf_header.TokenizerInfo("d", "x", "llama", (), None, None, None, None)
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


# --- against the local hub server (loopback only) -----------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hubserver import Hub

    with Hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def _split(tmp: Path, stem: str, count: int, payload: int, **kw: object) -> list[Path]:
    return [
        write_gguf(
            tmp / f"{stem}-{i + 1:05d}-of-{count:05d}.gguf",
            vocab(64),
            payload_bytes=payload,
            split=(i, count),
            **kw,  # type: ignore[arg-type]
        )
        for i in range(count)
    ]


def test_a_split_target_is_measured_over_all_its_parts(tmp_path: Path, hub) -> None:
    """An 8-part target read from part 1 alone showed 1/8 of its parameters and size, so a
    draft larger than part 1 was skipped as "as large as the target". Every part counts."""
    parts = _split(tmp_path / "big", "big-Q8_0", 4, 1 << 18, basename="big")
    names = [f"Q8_0/{p.name}" for p in parts]
    for name, path in zip(names, parts, strict=True):
        hub.add("org/big-GGUF", name, path)
    draft = write_gguf(tmp_path / "d.gguf", vocab(64), payload_bytes=300_000, basename="big")
    hub.add("org/big-draft-GGUF", "big-draft-Q8_0.gguf", draft)
    assert draft.stat().st_size > parts[0].stat().st_size  # larger than part 1 alone
    target = drafts.resolve_target("org/big-GGUF", ModelsFile())
    assert target.file == names[0]
    assert target.size == sum(p.stat().st_size for p in parts)
    found = drafts.find(target, ModelsFile(), {})
    assert found.info.params == 4 << 18 and found.info.split_count == 4
    assert found.skipped == ()
    (cand,) = found.candidates
    assert cand.source.repo == "org/big-draft-GGUF" and cand.ok
    assert cand.ratio(found.info) == pytest.approx(300_000 / (4 << 18))
    # the later parts: one small range read each, never the whole file
    later = [e for e in hub.content_gets() if "-00001-" not in e.path and "big-GGUF" in e.path]
    assert len(later) == 3 and all(e.range == f"bytes=0-{gguf_header.PART_READ - 1}" for e in later)


def test_a_local_split_target_counts_the_parts_beside_it(tmp_path: Path) -> None:
    parts = _split(tmp_path, "m-Q4_0", 3, 4096)
    src = drafts.resolve_target(str(parts[0]), ModelsFile())
    assert src.size == sum(p.stat().st_size for p in parts)
    info = drafts.read(src)
    assert info.params == 3 * 4096 and info.split_count == 3
    with pytest.raises(LlamaspecError, match="give its first part, m-Q4_0-00001-of-00003.gguf"):
        drafts.read(drafts.resolve_target(str(parts[1]), ModelsFile()))
    parts[2].unlink()
    with pytest.raises(LlamaspecError, match=r"its part .*m-Q4_0-00003-of-00003.gguf is missing"):
        drafts.read(src)


def test_a_header_read_through_the_hub_asks_each_byte_once(
    tmp_path: Path, hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The range reader's second request starts where the first ended."""
    f = write_gguf(tmp_path / "t.gguf", vocab(20000), payload_bytes=1 << 20)
    hub.add("org/t-GGUF", "t.gguf", f)
    monkeypatch.setattr(gguf_header, "FIRST_READ", 128 << 10)
    info = drafts.read(drafts.Source("org/t-GGUF", "t.gguf", f.stat().st_size))
    assert info.n_vocab == 20000
    gets = hub.content_gets()
    assert [g.range for g in gets] == ["bytes=0-131071", "bytes=131072-524287"]
    assert sum(g.sent for g in gets) == 512 << 10


@pytest.mark.parametrize("bad", ["../x", "a--b/c", "owner/-name", "x/y z", "owner/.name"])
def test_a_malformed_repo_id_is_one_paragraph_before_the_hub_is_asked(
    bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_hub(*_a: object, **_k: object) -> None:
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(drafts, "gguf_files", no_hub)
    with pytest.raises(LlamaspecError, match=r"owner/name") as err:
        drafts.resolve_target(bad, ModelsFile())
    assert repr(bad) in err.value.message and "\n" not in err.value.message


def test_draft_find_of_a_malformed_repo_exits_2_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamaspec.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert main(["draft", "find", "../x"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "'../x' is neither a file here nor a Hub repo id" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
