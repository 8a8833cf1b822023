"""Compatibility before download for the drafts that read the target's hidden states (issue
43): MTP heads in the target's own file (`<arch>.nextn_predict_layers` and `blk.N.nextn.*`
tensors), EAGLE-3 heads and Gemma 4 assistants judged against their target, all from GGUF
headers (local, or by range reads through the local hub server), and the refusals a recipe
meets when it is rendered for files whose headers say it cannot run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from llamaspec import config
from llamaspec.config import ModelsFile
from llamaspec.errors import LlamaspecError
from llamaspec.models import drafts, gguf_header, heads, recipes

from ggufs import vocab

ROOT = Path(__file__).resolve().parents[2]


def _gguf(
    path: Path,
    arch: str,
    *,
    keys: dict[str, object] | None = None,
    tensors: tuple[str, ...] = ("output.weight",),
    n_vocab: int = 64,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Path:
    """A header-only-sized GGUF of `arch` with the llama tokenizer of `n_vocab` tokens, the
    given `<arch>.…` keys (int: uint32, list: int32 array) and small float tensors."""
    w = GGUFWriter(str(path), arch=arch)
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab(n_vocab))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for key, value in (keys or {}).items():
        if isinstance(value, list):
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_uint32(f"{arch}.{key}", int(value))  # type: ignore[call-overload]
    for name in tensors:
        shape = (shapes or {}).get(name, (2, 2))
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


NEXTN = tuple(
    f"blk.2.nextn.{t}.weight"
    for t in ("eh_proj", "embed_tokens", "enorm", "hnorm", "shared_head_head", "shared_head_norm")
)


def _qwen(path: Path, *, layers: int | None = 1, nextn: bool = True, arch: str = "qwen35") -> Path:
    keys: dict[str, object] = {"block_count": 3, "embedding_length": 8}
    if layers is not None:
        keys["nextn_predict_layers"] = layers
    tensors = ("blk.0.attn_q.weight", *(NEXTN if nextn else ()), "output.weight")
    return _gguf(path, arch, keys=keys, tensors=tensors)


def _target(path: Path, *, width: int = 8, blocks: int = 4, arch: str = "llama") -> Path:
    return _gguf(path, arch, keys={"block_count": blocks, "embedding_length": width})


def _eagle3(
    path: Path, *, hidden: int = 8, layers: tuple[int, ...] = (1, 2, 3), d2t: int | None = None
) -> Path:
    keys: dict[str, object] = {
        "block_count": 1,
        "embedding_length": 4,
        "target_hidden_size": hidden,
        "target_layers": list(layers),
    }
    tensors = ("fc.weight", *(("d2t",) if d2t else ()))
    return _gguf(path, "eagle3", keys=keys, tensors=tensors, shapes={"d2t": (d2t or 1,)})


def _assistant(path: Path, *, out: int = 8) -> Path:
    keys = {"block_count": 4, "embedding_length": 4, "embedding_length_out": out}
    return _gguf(
        path, "gemma4-assistant", keys=keys, tensors=("nextn.pre_projection.weight", "token_embd")
    )


# --- MTP heads: the key and the tensors, both --------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "nextn", "ready"),
    [
        (1, True, True),
        (1, False, False),
        (None, True, False),
        (0, True, False),
        (None, False, False),
    ],
)
def test_mtp_heads_need_the_key_and_the_blk_nextn_tensors(
    tmp_path: Path, layers: int | None, nextn: bool, ready: bool
) -> None:
    """Plain conversions of MTP models keep `nextn_predict_layers` but drop the tensors
    (llama.cpp issue #28196): the engine's loader needs both, so does `mtp_ready`."""
    path = _qwen(tmp_path / "q.gguf", layers=layers, nextn=nextn)
    info = gguf_header.read_local(path)
    assert heads.mtp_ready(info) is ready
    assert info.nextn_blocks == ((2,) if nextn else ())
    data = path.read_bytes()
    # a remote read in small steps reaches the tensor infos after the key/values all the same
    remote = gguf_header.read_header(lambda a, b: data[a:b], len(data), "org/q.gguf", first=64)
    assert heads.mtp_ready(remote) is ready and remote.nextn_blocks == info.nextn_blocks
    why = heads.mtp_heads_refusal(info, "Recipe 'x'", "org/q.gguf")
    assert (why is None) is ready
    if why:
        assert "#28196" in why and "nextn_predict_layers" in why and "\n" not in why


def test_only_blk_n_nextn_tensors_count_as_mtp_blocks(tmp_path: Path) -> None:
    """`nextn.pre_projection` (a Gemma 4 assistant's own tensor) is no MTP head of a target."""
    info = gguf_header.read_local(_assistant(tmp_path / "a.gguf"))
    assert info.nextn_tensors == 1 and info.nextn_blocks == () and not heads.mtp_ready(info)


def test_a_split_target_counts_nextn_blocks_in_every_part(tmp_path: Path) -> None:
    first = gguf_header.read_local(_qwen(tmp_path / "a.gguf", nextn=False))
    rest = gguf_header.read_local(_qwen(tmp_path / "b.gguf"))
    split = dataclasses.replace(first, split_count=2)
    merged = gguf_header.read_split(split, "m-00001-of-00002.gguf", lambda _name: rest)
    assert merged.nextn_blocks == (2,) and heads.mtp_ready(merged)


def test_models_check_reads_the_mtp_pair_for_the_new_qwen36_entry(tmp_path: Path) -> None:
    from rich.console import Console

    from llamaspec.models import catalog

    models = config.load_models(ROOT)
    plain = _qwen(tmp_path / "plain.gguf", nextn=False)
    with pytest.raises(LlamaspecError, match=r"has none: no tensor named \*nextn\*") as err:
        catalog.check_pair(models, "qwen3.6-27b-mtp", ROOT, Console(), plain)
    assert "qwen35.nextn_predict_layers = 1, 0 nextn tensors" in err.value.message
    heads = _qwen(tmp_path / "heads.gguf")
    assert catalog.check_pair(models, "qwen3.6-27b-mtp", ROOT, Console(), heads) is None


# --- EAGLE-3 heads ------------------------------------------------------------------------------


def test_an_eagle3_head_for_this_target_passes_every_rule(tmp_path: Path) -> None:
    t = gguf_header.read_local(_target(tmp_path / "t.gguf"))
    d = gguf_header.read_local(_eagle3(tmp_path / "e.gguf"))
    assert d.target_layers == (1, 2, 3) and d.target_hidden == 8
    assert heads.draft_kind(d) == "eagle3"
    verdict = heads.check(t, d)
    assert verdict.ok, verdict.failed
    assert {"eagle3 layers", "eagle3 hidden size"} <= {r.name for r in verdict.rules}


@pytest.mark.parametrize(
    ("kw", "rule", "text"),
    [
        (
            {"hidden": 16},
            "eagle3 hidden size",
            "target_hidden_size 16 vs target embedding_length 8",
        ),
        ({"layers": (1, 2)}, "eagle3 layers", "[1, 2]"),
        ({"layers": (1, 2, 9)}, "eagle3 layers", "vs target block_count 4"),
        ({"d2t": 100}, "eagle3 d2t", "d2t maps 100 draft tokens into the target's 64"),
    ],
)
def test_an_eagle3_head_for_another_target_is_refused(
    tmp_path: Path, kw: dict, rule: str, text: str
) -> None:
    t = gguf_header.read_local(_target(tmp_path / "t.gguf"))
    d = gguf_header.read_local(_eagle3(tmp_path / "e.gguf", **kw))
    verdict = heads.check(t, d)
    assert [r.name for r in verdict.failed] == [rule]
    assert text in verdict.failed[0].detail
    msg = heads.explain(verdict)
    assert "made for another target" in msg and "\n" not in msg


def test_an_eagle3_head_with_a_small_d2t_map_is_fine(tmp_path: Path) -> None:
    t = gguf_header.read_local(_target(tmp_path / "t.gguf"))
    d = gguf_header.read_local(_eagle3(tmp_path / "e.gguf", d2t=32))
    assert d.d2t == 32 and heads.check(t, d).ok


# --- Gemma 4 assistants -------------------------------------------------------------------------


def test_a_gemma4_assistant_needs_a_gemma4_target_of_its_width(tmp_path: Path) -> None:
    a = gguf_header.read_local(_assistant(tmp_path / "a.gguf", out=8))
    assert heads.draft_kind(a) == "assistant" and a.embd_out == 8
    good = gguf_header.read_local(_target(tmp_path / "g.gguf", arch="gemma4"))
    assert heads.check(good, a).ok
    wide = gguf_header.read_local(_target(tmp_path / "w.gguf", arch="gemma4", width=16))
    failed = heads.check(wide, a).failed
    assert [r.name for r in failed] == ["assistant width"]
    assert "embedding_length_out 8 vs the target's hidden size 16" in failed[0].detail
    llama = gguf_header.read_local(_target(tmp_path / "l.gguf"))
    assert [r.name for r in heads.check(llama, a).failed] == ["assistant target arch"]


def test_draft_find_names_the_spec_type_of_a_head_and_the_targets_mtp_heads(
    tmp_path: Path,
) -> None:
    e = gguf_header.read_local(_eagle3(tmp_path / "e.gguf"))
    t = gguf_header.read_local(_target(tmp_path / "t.gguf"))
    cand = drafts.Candidate(
        drafts.Source("org/e-GGUF", "e.gguf", 1), ("F16",), e, heads.check(t, e)
    )
    assert drafts.verdict_text(cand) == "compatible (spec type eagle3)"
    assert "no MTP heads" in drafts.mtp_line(t)
    own = gguf_header.read_local(_qwen(tmp_path / "q.gguf"))
    assert "spec type mtp drafts without a draft file" in drafts.mtp_line(own)


# --- rendering reads the headers of files on disk ------------------------------------------------


def _recipe(name: str) -> config.Recipe:
    return config.load_recipes(ROOT)[name]


def test_rendering_an_mtp_recipe_for_a_file_without_heads_is_refused(tmp_path: Path) -> None:
    plain = _qwen(tmp_path / "plain.gguf", nextn=False)
    with pytest.raises(LlamaspecError, match="has none the engine can load") as err:
        recipes.render(_recipe("qwen3.6-27b-mtp"), "llama.cpp", "upstream", plain, None)
    assert "Recipe 'qwen3.6-27b-mtp'" in err.value.message
    heads = _qwen(tmp_path / "heads.gguf")
    cmd = recipes.render(_recipe("qwen3.6-27b-mtp"), "llama.cpp", "upstream", heads, None)
    assert "draft-mtp" in cmd.argv


def test_ik_loads_mtp_heads_for_glm_only(tmp_path: Path) -> None:
    """ik_llama.cpp at 55d3c05 reads nextn_predict_layers for GLM-4.5 and its kin only."""
    qwen = _qwen(tmp_path / "q.gguf")
    with pytest.raises(LlamaspecError, match="does not offer MTP for architecture 'qwen35'"):
        recipes.render(_recipe("qwen3.6-27b-mtp"), "ik_llama.cpp", "ik-legacy", qwen, None)
    glm = _qwen(tmp_path / "glm.gguf", arch="glm4moe")
    cmd = recipes.render(_recipe("glm-4.5-air-mtp"), "ik_llama.cpp", "ik-legacy", glm, None)
    assert "-mtp" in cmd.argv


def test_a_head_needs_its_spec_type_and_the_type_needs_such_a_head(tmp_path: Path) -> None:
    target = _target(tmp_path / "t.gguf")
    head = _eagle3(tmp_path / "e.gguf")
    plain = _target(tmp_path / "d.gguf")
    with pytest.raises(LlamaspecError, match="is an EAGLE-3 head, which only spec type eagle3"):
        recipes.render(_recipe("llama-3.1-8b"), "llama.cpp", "upstream", target, head)
    with pytest.raises(LlamaspecError, match="is not an EAGLE-3 head"):
        recipes.render(_recipe("llama-3.1-8b-eagle3"), "llama.cpp", "upstream", target, plain)
    cmd = recipes.render(_recipe("llama-3.1-8b-eagle3"), "llama.cpp", "upstream", target, head)
    assert cmd.argv[cmd.argv.index("--spec-type") + 1] == "draft-eagle3"
    assistant = _assistant(tmp_path / "a.gguf")
    gemma = _target(tmp_path / "g.gguf", arch="gemma4")
    cmd = recipes.render(
        _recipe("gemma-4-31b-assistant"), "llama.cpp", "upstream", gemma, assistant
    )
    argv = cmd.argv
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-model") + 1] == str(assistant)


def test_mtp_and_assistant_are_one_engine_method() -> None:
    with pytest.raises(ValueError, match="one engine method"):
        config.SpecSettings(types=("mtp", "assistant"))


# --- the catalog --------------------------------------------------------------------------------


def test_the_new_pairs_are_in_the_catalog_with_recipes_and_quoted_figures() -> None:
    models = config.load_models(ROOT)
    all_recipes = config.load_recipes(ROOT, models)
    mtp = models.models[models.pairs["qwen3.6-27b-mtp"].target]
    assert mtp.repo.endswith("-MTP-GGUF") and mtp.mtp  # type: ignore[union-attr]
    for pair, spec in (
        ("qwen3.6-27b-mtp", "mtp"),
        ("gemma-4-31b-assistant", "assistant"),
        ("llama-3.1-8b-eagle3", "eagle3"),
    ):
        (recipe,) = [r for r in all_recipes.values() if r.pair == pair]
        assert recipe.spec.types == (spec,)
        # published figures are quoted with their source; nothing is claimed as measured here
        assert recipe.measured is None
        assert recipe.reported is not None and "not measured here" in recipe.reported.setup
        for handle in (models.pairs[pair].target, models.pairs[pair].draft):
            if handle:  # no invented SHAs: the revision is resolved and locked on first pull
                assert models.models[handle].revision is None
    assert isinstance(models, ModelsFile)


# --- through the local hub server: range reads only, nothing downloaded -------------------------


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    from hubserver import Hub

    with Hub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def test_remote_heads_are_judged_from_range_reads(
    tmp_path: Path, hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`models check` of an MTP pair whose file lacks the tensors, and of an EAGLE-3 pair made
    for another target, reads the headers by range requests and downloads nothing."""
    from rich.console import Console

    from llamaspec.models import catalog

    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LLAMASPEC_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    hub.add("org/q-GGUF", "q.gguf", _qwen(tmp_path / "q.gguf", nextn=False))
    hub.add("org/q-MTP-GGUF", "q.gguf", _qwen(tmp_path / "qm.gguf"))
    hub.add("org/t-GGUF", "t.gguf", _target(tmp_path / "t.gguf", width=4096, blocks=32))
    hub.add("org/e-GGUF", "e.gguf", _eagle3(tmp_path / "e.gguf", hidden=5120))
    model = {"tokenizer": "x", "license": "x"}
    models = config.ModelsFile.model_validate(
        {
            "models": {
                "plain": {"repo": "org/q-GGUF", "file": "q.gguf", "mtp": True, **model},
                "heads": {"repo": "org/q-MTP-GGUF", "file": "q.gguf", "mtp": True, **model},
                "t": {"repo": "org/t-GGUF", "file": "t.gguf", **model},
                "e": {"repo": "org/e-GGUF", "file": "e.gguf", **model},
            },
            "pairs": {
                "plain-mtp": {"target": "plain", "spec": "mtp"},
                "heads-mtp": {"target": "heads", "spec": "mtp"},
                "t-eagle3": {"target": "t", "draft": "e"},
            },
        }
    )
    console = Console(width=200)
    with pytest.raises(LlamaspecError, match="Nothing was downloaded") as err:
        catalog.check_pair(models, "plain-mtp", tmp_path, console)
    assert "org/q-GGUF/q.gguf has none" in err.value.message
    assert catalog.check_pair(models, "heads-mtp", tmp_path, console) is None
    verdict = catalog.check_pair(models, "t-eagle3", tmp_path, console)
    assert verdict is not None and [r.name for r in verdict.failed] == ["eagle3 hidden size"]
    assert "5120 vs target embedding_length 4096" in verdict.failed[0].detail
    gets = hub.content_gets()
    assert gets and all(g.range and g.range.startswith("bytes=0-") for g in gets)
    assert not list((tmp_path / "hf").rglob("*.gguf"))  # nothing in the cache
