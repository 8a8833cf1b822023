"""Catalog validation, GGUF compatibility rules and recipe rendering (no network, no compiler)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.models import compat, dialects, gguf_header, methods, recipes, server_help

from ggufs import vocab, write_gguf
from runcli import cli

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
DIALECTS = tuple(recipes.CAPABILITIES)


# --- compatibility on GGUFs written with the gguf package ---------------------------------


def _info(tmp: Path, name: str, tokens: list[str], **kw) -> gguf_header.TokenizerInfo:
    return gguf_header.read_local(write_gguf(tmp / f"{name}.gguf", tokens, **kw))


def _failed(v: compat.Verdict) -> dict[str, str]:
    return {r.name: r.detail for r in v.failed}


def test_same_vocab_is_compatible(tmp_path: Path) -> None:
    v = compat.check(_info(tmp_path, "t", vocab(400)), _info(tmp_path, "d", vocab(400)))
    assert v.ok, v
    assert "ids 5..399 identical" in {r.name: r.detail for r in v.rules}["token texts"]


def test_vocab_size_difference_128_is_allowed_129_is_not(tmp_path: Path) -> None:
    target = _info(tmp_path, "t", vocab(400 + 128))
    ok = compat.check(target, _info(tmp_path, "d128", vocab(400)))
    assert ok.ok
    assert "draft vocab 400 vs target 528: difference 128, within 128, ok" in [
        r.detail for r in ok.rules
    ]
    bad = compat.check(_info(tmp_path, "t2", vocab(400 + 129)), _info(tmp_path, "d", vocab(400)))
    assert _failed(bad) == {
        "vocab size": "draft vocab 400 vs target 529: difference 129, over the 128 allowed"
    }


def test_different_bos_is_refused(tmp_path: Path) -> None:
    v = compat.check(_info(tmp_path, "t", vocab(300)), _info(tmp_path, "d", vocab(300), bos=3))
    assert _failed(v) == {"BOS id": "bos_token_id: target 1 vs draft 3"}


def test_different_add_bos_and_vocab_type_are_refused(tmp_path: Path) -> None:
    target = _info(tmp_path, "t", vocab(300))
    v = compat.check(target, _info(tmp_path, "d", vocab(300), add_bos=False, model="gpt2"))
    assert set(_failed(v)) == {"vocab type", "add BOS"}


def test_missing_special_token_keys_take_the_engines_defaults(tmp_path: Path) -> None:
    """A header without add_bos/add_eos or the BOS/EOS ids is loaded with the engine's
    defaults for its vocab type (llama: add BOS 1, no EOS), so it matches a header that
    writes the same values out."""
    silent = _info(tmp_path, "t", vocab(300), bos=None, eos=None, add_bos=None, add_eos=None)
    explicit = _info(tmp_path, "d", vocab(300))  # llama: bos 1, eos 2, add_bos, no add_eos
    v = compat.check(silent, explicit)
    assert v.ok, _failed(v)
    details = {r.name: r.detail for r in v.rules}
    assert details["add BOS"] == "add_bos_token: target True (engine default) vs draft True"
    assert details["BOS id"] == "bos_token_id: target 1 (engine default) vs draft 1"
    # the defaults are the engine's, not "anything goes": a draft that adds no BOS is refused
    no_bos = _info(tmp_path, "n", vocab(300), add_bos=False)
    assert set(_failed(compat.check(silent, no_bos))) == {"add BOS"}
    assert compat.check(no_bos, silent).failed[0].detail == (
        "add_bos_token: target False vs draft True (engine default)"
    )


def test_gpt2_and_whitespace_are_one_vocab_type_for_the_engine(tmp_path: Path) -> None:
    """llama-vocab.cpp maps gpt2, whitespace, hybriddna and gemma4 all to the BPE type,
    and the engine compares types; llama (SPM) against gpt2 (BPE) still differs."""
    gpt2 = _info(tmp_path, "g", vocab(300), model="gpt2", bos=None, eos=None, add_bos=None)
    ws = _info(tmp_path, "w", vocab(300), model="whitespace", add_bos=False)
    v = compat.check(gpt2, ws)
    assert v.ok, _failed(v)
    assert "'gpt2' (BPE) vs draft 'whitespace' (BPE)" in v.rules[0].detail
    spm = compat.check(_info(tmp_path, "l", vocab(300)), gpt2)
    assert "vocab type" in _failed(spm)


def test_bpe_defaults_follow_the_pre_tokenizer(tmp_path: Path) -> None:
    """BPE adds no BOS by default, except after pre-tokenizers such as llama-bpe; the
    default BOS id (11) is dropped when it lies outside the vocab; Gemma 4 always adds BOS."""
    silent = {"bos": None, "eos": None, "add_bos": None, "add_eos": None}
    llama3 = compat.engine_vocab(
        _info(tmp_path, "a", vocab(300), model="gpt2", pre="llama-bpe", **silent)
    )
    assert (llama3.type, llama3.add_bos, llama3.bos, llama3.add_eos) == ("BPE", True, 11, False)
    qwen = compat.engine_vocab(
        _info(tmp_path, "b", vocab(300), model="gpt2", pre="qwen2", **silent)
    )
    assert (qwen.add_bos, qwen.eos) == (False, 11)
    glm = compat.engine_vocab(_info(tmp_path, "c", vocab(300), model="gpt2", pre="glm4", **silent))
    assert glm.bos is None
    tiny = compat.engine_vocab(_info(tmp_path, "d", vocab(8), model="gpt2", **silent))
    assert tiny.bos is None and tiny.eos is None  # 11 is not a token of an 8-token vocab
    gemma4 = compat.engine_vocab(_info(tmp_path, "e", vocab(300), model="gemma4", add_bos=False))
    assert gemma4.type == "BPE" and gemma4.add_bos is True
    t5 = compat.engine_vocab(_info(tmp_path, "f", vocab(300), model="t5", **silent))
    assert (t5.type, t5.add_bos, t5.add_eos, t5.eos) == ("UGM", False, True, 1)


def test_token_text_at_id_7_differs(tmp_path: Path) -> None:
    v = compat.check(
        _info(tmp_path, "t", vocab(300)), _info(tmp_path, "d", vocab(300, change={7: "other"}))
    )
    assert _failed(v) == {
        "token texts": "token 7 differs: 'tok7' vs 'other' (1 of 295 ids from 5 differ)"
    }
    assert "token 7 differs" in compat.explain(v)


def test_tokens_below_5_are_not_compared(tmp_path: Path) -> None:
    v = compat.check(
        _info(tmp_path, "t", vocab(300)), _info(tmp_path, "d", vocab(300, change={4: "x"}))
    )
    assert v.ok


def test_not_a_gguf_and_truncated_header(tmp_path: Path) -> None:
    junk = tmp_path / "model.gguf"
    junk.write_bytes(b"<html>not found</html>" * 10)
    with pytest.raises(LlamaspecError, match="is not a GGUF file"):
        gguf_header.read_local(junk)
    whole = write_gguf(tmp_path / "w.gguf", vocab(3000)).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:5000])
    with pytest.raises(LlamaspecError, match="truncated or corrupt GGUF"):
        gguf_header.read_local(cut)


def test_header_reader_fetches_more_until_the_metadata_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_gguf(tmp_path / "w.gguf", vocab(20000), payload_bytes=1 << 20).read_bytes()
    asked: list[int] = []
    ranges: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        asked.append(end)
        ranges.append((start, end))
        return data[start:end]

    monkeypatch.setattr(gguf_header, "FIRST_READ", 64 << 10)
    info = gguf_header.read_header(fetch, len(data), "remote")
    assert info.n_vocab == 20000
    assert asked == [64 << 10, 256 << 10, 1 << 20]  # 4x more each time the metadata runs on
    assert asked[-1] < len(data)
    # each growth fetches only the bytes after those already read
    assert ranges == [(0, 64 << 10), (64 << 10, 256 << 10), (256 << 10, 1 << 20)]


def test_a_growing_header_read_fetches_each_byte_once_and_stops_at_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 9.2 MB header cost 21 MB when each growth re-read from byte 0 (4 MiB, then 16 MiB);
    now the second read asks only for the missing tail, and nothing is read past the cap."""
    data = write_gguf(tmp_path / "w.gguf", vocab(20000), payload_bytes=1 << 20).read_bytes()
    header = len(data) - (1 << 20)  # the metadata, before the payload
    sent: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        sent.append((start, end))
        return data[start:end]

    first = header // 2 + 1  # as 4 MiB is to a 9.2 MB header: one growth is needed
    monkeypatch.setattr(gguf_header, "FIRST_READ", first)
    assert gguf_header.read_header(fetch, len(data), "remote").n_vocab == 20000
    assert sent == [(0, first), (first, first * 4)]
    assert sum(end - start for start, end in sent) == first * 4  # was first + first * 4
    # a header longer than the cap: the reads stop there, each byte read once
    sent.clear()
    monkeypatch.setattr(gguf_header, "MAX_HEADER", header // 3)
    monkeypatch.setattr(gguf_header, "FIRST_READ", header // 12)
    with pytest.raises(LlamaspecError, match="does not end within"):
        gguf_header.read_header(fetch, len(data), "remote")
    assert sent[-1][1] == header // 3
    assert all(a[1] == b[0] for a, b in itertools.pairwise(sent))


# --- the catalog -------------------------------------------------------------------------


def test_repository_catalog_is_valid() -> None:
    models = config.load_models(ROOT)
    assert len(models.pairs) >= 15
    assert {p.spec for p in models.pairs.values()} == {"draft", "mtp", "ngram"}
    all_recipes = config.load_recipes(ROOT, models)
    assert {r.pair for r in all_recipes.values()} == set(models.pairs)
    split = models.models["deepseek-r1-q4_k_m"].parts
    assert len(split) == 9 and split[-1].endswith("-00009-of-00009.gguf")


def _catalog(tmp: Path, models: dict, pairs: dict | None = None) -> Path:
    (tmp / "models.yaml").write_text(yaml.safe_dump({"models": models, "pairs": pairs or {}}))
    return tmp


GOOD = {"repo": "org/x-GGUF", "file": "x.gguf", "tokenizer": "t", "license": "mit"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"file": "../x.gguf"}, "must be a relative path inside the tree"),
        ({"file": "/abs/x.gguf"}, "must be a relative path inside the tree"),
        ({"file": "x.bin"}, "is not a .gguf file name"),
        ({"repo": "org/bad name"}, "is not a Hugging Face repo id"),
        ({"repo": "org/a--b"}, "is not a Hugging Face repo id"),
        ({"repo": "noslash"}, "is not a Hugging Face repo id"),
        ({"sha256": "abc"}, "not a 64-character"),
        ({"revision": "main"}, "not a full 40-character commit SHA"),
        ({"licence": "mit"}, "Did you mean 'license'"),
    ],
)
def test_bad_model_entries(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(LlamaspecError, match=message):
        config.load_models(_catalog(tmp_path, {"x": {**GOOD, **change}}))


def test_pair_naming_an_unknown_model(tmp_path: Path) -> None:
    root = _catalog(tmp_path, {"qwen-7b": GOOD}, {"p": {"target": "qwen-7", "spec": "ngram"}})
    with pytest.raises(LlamaspecError, match="Did you mean 'qwen-7b'"):
        config.load_models(root)


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "models.yaml").write_text("models:\n  x:\n    repo: [unclosed\n")
    with pytest.raises(LlamaspecError, match=r"models.yaml is not valid YAML at line \d+"):
        config.load_models(tmp_path)


# --- recipes -----------------------------------------------------------------------------


def test_find_names_a_recipe_with_its_catalog() -> None:
    recipe, catalog = recipes.find("gemma3-270m-ngram", ROOT)
    assert recipe == config.load_recipes(ROOT)["gemma3-270m-ngram"]
    assert recipe.pair in catalog.pairs and catalog == config.load_models(ROOT)
    with pytest.raises(LlamaspecError, match="Unknown recipe 'gemma3-270m-ngarm'. Did you mean"):
        recipes.find("gemma3-270m-ngarm", ROOT)


@pytest.mark.parametrize("name", sorted(config.load_recipes(ROOT)))
@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_recipe_renders_for_every_dialect(name: str, dialect: str) -> None:
    """Each recipe renders, or says which setting the dialect cannot express."""
    recipe = config.load_recipes(ROOT)[name]
    engine = "ik_llama.cpp" if dialect.startswith("ik") else "llama.cpp"
    try:
        cmd = recipes.render(recipe, engine, dialect, "/m/t.gguf", "/m/d.gguf", backend="cuda")
    except LlamaspecError as exc:
        text = str(exc)
        assert f"Recipe {name!r}" in text
        assert any(w in text for w in ("does not offer", "one speculative method", "checkpoints"))
        assert dialect != "upstream", text  # today's upstream expresses every recipe
        return
    argv = cmd.argv
    assert argv[:3] == ("llama-server", "-m", "/m/t.gguf")
    if "draft" in recipe.for_engine(engine).spec.types:
        assert "/m/d.gguf" in argv
    if dialect == "upstream":
        assert "--spec-type" in argv and "--draft-max" not in argv
    if dialect in ("upstream-legacy", "ik-legacy") and "draft" in recipe.spec.types:
        assert "--draft-max" in argv


def test_upstream_rendering_of_the_coder_pair() -> None:
    recipe = config.load_recipes(ROOT)["qwen2.5-coder-7b"]
    cmd = recipes.render(recipe, "llama.cpp", "upstream", "t.gguf", "d.gguf", backend="cuda")
    assert cmd.shell() == (
        "llama-server -m t.gguf --host 127.0.0.1 --port 8080 -c 32768 -np 1 -ngl 99 -fa on "
        "--spec-type draft-simple --spec-draft-model d.gguf --spec-draft-n-max 16 "
        "--spec-draft-n-min 0 --spec-draft-p-min 0.75 --spec-draft-ngl 99 "
        "--spec-draft-type-k q8_0 --spec-draft-type-v q8_0"
    )
    cpu = recipes.render(recipe, "llama.cpp", "upstream", "t.gguf", "d.gguf", backend="cpu")
    assert "-ngl" not in cpu.argv and "--spec-draft-ngl" not in cpu.argv
    assert cpu.notes == (
        "dropped -ngl 99, --spec-draft-ngl 99: the build has nothing to offload to (a cpu "
        "backend without the rpc variant); a GPU backend or --variant rpc keeps them",
    )


def test_ik_dialects_and_overrides() -> None:
    all_recipes = config.load_recipes(ROOT)
    stacked = all_recipes["qwen2.5-coder-7b-stacked"]
    up = recipes.render(stacked, "llama.cpp", "upstream", "t", "d")
    assert up.argv[up.argv.index("--spec-type") + 1] == "draft-simple,ngram-mod"
    ik = recipes.render(stacked, "ik_llama.cpp", "ik-legacy", "t", "d")  # override: draft only
    assert "--spec-type" not in ik.argv and "-md" in ik.argv
    mtp = recipes.render(all_recipes["qwen3.5-27b-mtp"], "ik_llama.cpp", "ik-spec-type", "t", None)
    assert mtp.argv[-2:] == ("--spec-type", "mtp:n_max=1,n_min=0,p_min=0.0")
    assert "--ctx-checkpoints" not in mtp.argv  # nulled for ik by the recipe


def _spec_part(cmd: recipes.ServerCommand) -> str:
    """The argv after the server settings (-m … --port N [-c N] [-np N] …)."""
    argv = list(cmd.argv)
    first = min(i for i, a in enumerate(argv) if a in dialects.SPEC_FLAGS | dialects.SPEC_SWITCHES)
    return " ".join(argv[first:])


def test_ik_legacy_speaks_ngram_types_and_mtp() -> None:
    """ik_llama.cpp at 55d3c05 parses `--spec-type ngram-*` (one type) and `-mtp`; its
    ngram-mod takes the lookup length from --spec-ngram-size-n and draft lengths from
    --draft-max/--draft-min (common/common.cpp and common/speculative.cpp at that pin)."""
    r = config.load_recipes(ROOT)
    cases = {
        "qwen3-8b-ngram": "--spec-type ngram-mod",
        "qwen2.5-coder-7b-ngram": (
            "--spec-type ngram-mod --draft-min 48 --draft-max 64 --spec-ngram-size-n 24"
        ),
        "glm-4.5-air-mtp": "-mtp --draft-max 1 --draft-min 0 --draft-p-min 0.0",
        "deepseek-r1": "-md d --draft-max 12 --draft-min 0 --draft-p-min 0.5 -ngld 99 -ot exps=CPU",
    }
    for name, want in cases.items():
        cmd = recipes.render(r[name], "ik_llama.cpp", "ik-legacy", "t", "d", backend="cuda")
        assert _spec_part(cmd) == want, name
    upstream = recipes.render(r["qwen2.5-coder-7b-ngram"], "llama.cpp", "upstream", "t", None)
    assert _spec_part(upstream).endswith(
        "--spec-ngram-mod-n-min 48 --spec-ngram-mod-n-max 64 --spec-ngram-mod-n-match 24"
    )
    legacy = recipes.render(r["qwen2.5-coder-7b-ngram"], "llama.cpp", "upstream-legacy", "t", None)
    assert _spec_part(legacy) == "--spec-type ngram-mod"
    assert "ngram_mod_n_min 48 dropped: the 'upstream-legacy' dialect has no flag for it" in (
        legacy.notes
    )


def test_spec_args_go_through_the_recipe_renderer() -> None:
    """smoke/verify/bench's SpecSettings render to what a one-type recipe renders to."""
    m = Path("/m/d.gguf")
    draft = dialects.SpecSettings("draft", m, n_max=8, p_min=0.0, draft_ngl=99)
    assert dialects.spec_args("upstream", draft) == [
        *("--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf"),
        *("--spec-draft-n-max", "8", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.0"),
        *("--spec-draft-ngl", "99"),
    ]
    assert dialects.spec_args("ik-legacy", draft) == [
        *("-md", "/m/d.gguf", "--draft-max", "8", "--draft-min", "0", "--draft-p-min", "0.0"),
        *("-ngld", "99"),
    ]
    assert dialects.spec_args("ik-spec-type", draft) == [
        *("-md", "/m/d.gguf", "-ngld", "99", "--spec-type", "draft:n_max=8,n_min=0,p_min=0.0")
    ]
    ngram = dialects.SpecSettings("ngram-mod")
    assert dialects.spec_args("upstream", ngram) == ["--spec-type", "ngram-mod"]
    assert dialects.spec_args("ik-legacy", ngram) == ["--spec-type", "ngram-mod"]
    assert dialects.spec_args("upstream", dialects.SpecSettings("mtp", n_max=1)) == [
        *("--spec-type", "draft-mtp", "--spec-draft-n-max", "1", "--spec-draft-n-min", "0")
    ]
    with pytest.raises(LlamaspecError, match="asks for spec type mtp, which llama.cpp"):
        dialects.spec_args("upstream-legacy", dialects.SpecSettings("mtp"))
    with pytest.raises(LlamaspecError, match="needs a draft model path"):
        dialects.spec_args("upstream", dialects.SpecSettings("draft"))
    with pytest.raises(LlamaspecError, match="Unknown speculative CLI dialect 'ik'"):
        dialects.spec_args("ik", draft)


OFFLOAD_FLAGS = {
    "-ngl", "-ngld", "--spec-draft-ngl", "-ot", "-devd", "--spec-draft-device", "--n-cpu-moe",
    "-sm", "-mg", "-ts", "-dev",
}  # fmt: skip


@pytest.mark.parametrize("dialect", DIALECTS)
def test_offload_options_follow_one_rule_in_every_dialect(dialect: str) -> None:
    """Kept when the build can offload (GPU backend, or the rpc variant), dropped with a note
    on a cpu build without rpc: for every recipe, also inside `server.extra`."""
    engine = "ik_llama.cpp" if dialect.startswith("ik") else "llama.cpp"
    extra = ("-sm", "layer", "-mg", "0", "-ts", "3,1", "-dev", "CUDA0", "--override-tensor=x=CPU")
    for recipe in config.load_recipes(ROOT).values():
        recipe = recipe.for_engine(engine)  # an engine's own `extra` replaces the recipe's
        recipe = recipe.model_copy(
            update={
                "server": recipe.server.model_copy(update={"extra": recipe.server.extra + extra})
            }
        )
        builds = {
            "cpu": ("cpu", []),
            "cpu+rpc": ("cpu", ["rpc"]),
            "vulkan": ("vulkan", []),
            "cuda": ("cuda", []),
        }
        for build, (backend, variants) in builds.items():
            try:
                cmd = recipes.render(
                    recipe, engine, dialect, "t", "d", backend=backend, variants=variants
                )
            except LlamaspecError as exc:
                if recipe.server.rpc and "rpc" not in variants:  # refused, not run locally
                    assert "build with `llamaspec build --variant rpc`" in str(exc).lower()
                    continue
                assert "asks for spec type" in str(exc) or "stacks" in str(exc)
                break
            argv = set(cmd.argv)
            assert ("--rpc" in argv) == (bool(recipe.server.rpc) and "rpc" in variants)
            if build == "cpu":
                assert not argv & OFFLOAD_FLAGS, (recipe.name, build, cmd.argv)
                assert "--override-tensor=x=CPU" not in argv
                assert any("nothing to offload to" in n for n in cmd.notes)
                continue
            if "extra" not in recipe.engines.get(engine, {}):  # not overridden for the engine
                assert {"-sm", "-mg", "-ts", "-dev", "--override-tensor=x=CPU"} <= argv
            if recipe.server.gpu_layers is not None:
                assert "-ngl" in argv, (recipe.name, build)
            assert not any("nothing to offload to" in n for n in cmd.notes)


def test_without_an_artifact_a_recipe_naming_rpc_servers_keeps_offload() -> None:
    recipe = config.load_recipes(ROOT)["llama-3.3-70b-rpc-draft"]
    cmd = recipes.render(recipe, "llama.cpp", "upstream", "t", "d", backend="cpu")
    assert {"--rpc", "-ngl", "--spec-draft-ngl", "--spec-draft-device"} <= set(cmd.argv)


def test_a_build_without_rpc_refuses_a_recipe_with_rpc_hosts() -> None:
    """Issue 42: the rpc settings were dropped with a note and every layer of the 70B ran
    on this host (out of memory); now it is a refusal naming the hosts and the fix."""
    recipe = config.load_recipes(ROOT)["llama-3.3-70b-rpc-draft"]
    for engine, dialect in (("ik_llama.cpp", "ik-legacy"), ("llama.cpp", "upstream")):
        for backend in ("cpu", "cuda"):
            with pytest.raises(LlamaspecError) as exc:
                recipes.render(recipe, engine, dialect, "t", "d", backend=backend, variants=[])
            text = str(exc.value)
            assert "192.168.1.20:50052" in text and "llamaspec build --variant rpc" in text
    cmd = recipes.render(recipe, "llama.cpp", "upstream", "t", "d", variants=["rpc"])
    assert "--rpc" in cmd.argv


def _recipe(**kw) -> config.Recipe:
    base = {"name": "x", "pair": "p", "description": "d", "spec": {"types": ["ngram-mod"]}}
    return config.Recipe.model_validate({**base, **kw})


def test_refusals_name_the_missing_spec_type_and_what_would_work() -> None:
    eagle = _recipe(spec={"types": ["eagle3"]})
    with pytest.raises(LlamaspecError) as exc:
        recipes.render(eagle, "ik_llama.cpp", "ik-legacy", "t", "d", pin="55d3c05bf7b3")
    text = str(exc.value)
    assert "Recipe 'x' asks for spec type eagle3, which ik_llama.cpp at 55d3c05" in text
    assert "ik_llama.cpp before its PR #1908" in text and "What would work:" in text
    stacked = _recipe(spec={"types": ["draft", "ngram-mod"]})
    with pytest.raises(LlamaspecError, match="runs one speculative method at a time"):
        recipes.render(stacked, "llama.cpp", "upstream-legacy", "t", "d")
    # An engine override that switches to a draft model on a pair without one says so.
    override = _recipe(engines={"ik_llama.cpp": {"types": ["draft"]}})
    with pytest.raises(LlamaspecError) as exc:
        recipes.render(override, "ik_llama.cpp", "ik-legacy", "t", None, pin="55d3c05bf7b3")
    text = " ".join(str(exc.value).split())
    assert (
        "Its `engines: ik_llama.cpp: types:` override switches to draft, but pair 'p' has no"
        in (text)
    )
    assert "offers the draft-free types mtp, ngram-cache, ngram-map-k" in text
    assert "or drop the override" in text
    override = _recipe(spec={"types": ["eagle3"]}, engines={"ik_llama.cpp": {"types": ["draft"]}})
    with pytest.raises(LlamaspecError) as exc:
        recipes.render(override, "ik_llama.cpp", "ik-legacy", "t", None, pin="55d3c05bf7b3")
    text = " ".join(str(exc.value).split())
    assert "asks for eagle3, which ik_llama.cpp at 55d3c05 lacks" in text
    assert "a recipe with a draft model, or an ik_llama.cpp pin after its PR #1908" in text


def test_engine_spellings_live_only_in_the_dialect_module() -> None:
    """No module but models/dialects.py spells an engine's speculative or offload flag."""
    literals = re.compile(
        r"""["'](--draft-max|--draft-min|--draft-p-min|--spec-draft-[a-z-]+|-md|--spec-type"""
        r"""|-ngld|-ctkd|-ctvd|-devd|-mtp|-ngl|-ot|--override-tensor|--rpc|--ctx-checkpoints"""
        r""")["'=\s]"""
    )
    # proof/ is being moved onto the dialect module (issue 14); until then smoke.py keeps the
    # ngram-mod knobs.
    elsewhere = {"models/dialects.py", "proof/smoke.py"}
    package = ROOT / "src" / "llamaspec"
    found = [
        f"{path.relative_to(package)}:{n}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package).as_posix() not in elsewhere
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if literals.search(line)
    ]
    assert not found, "\n".join(found)
    assert literals.search((package / "models" / "dialects.py").read_text())


def test_server_help_retries_once_then_refuses_output_that_is_no_usage(tmp_path: Path) -> None:
    """A binary that cannot run (or a container tool that failed once) prints no usage: the
    help is read again once, and a second failure is refused with what it printed, never
    taken for a help that lists no flag."""
    marker = tmp_path / "ran-once"
    flaky = tmp_path / "flaky-server"
    flaky.write_text(
        f'#!/bin/sh\nif [ ! -e "{marker}" ]; then touch "{marker}"; '
        'echo "Error: container state improper" >&2; exit 125; fi\n'
        'echo "-m,    --model FNAME   model path"; echo "--spec-type none,ngram-mod  types"\n'
    )
    flaky.chmod(0o755)
    text = server_help.server_help(flaky)
    assert "--spec-type" in server_help.accepted_flags(text)
    broken = tmp_path / "broken-server"
    broken.write_text(
        '#!/bin/sh\necho "llama-server: error while loading shared libraries: libggml.so" >&2\n'
        "exit 127\n"
    )
    broken.chmod(0o755)
    with pytest.raises(LlamaspecError, match=r"printed no usage text \(exit status 127, twice\)"):
        server_help.server_help(broken)
    with pytest.raises(LlamaspecError, match="libggml.so"):
        server_help.server_help(broken)


def test_spec_type_choices_from_either_engine() -> None:
    upstream = "--spec-type none,draft-simple,ngram-mod   comma-separated list"
    assert server_help.spec_type_choices(upstream) == {"none", "draft-simple", "ngram-mod"}
    ik = (
        "  --spec-type Name [none | ngram - cache | ngram - simple | ngram - map - k | "
        "ngram - map - k4v | ngram - mod] type of speculative decoding"
    )
    assert server_help.spec_type_choices(ik) == {
        "none", "ngram-cache", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"
    }  # fmt: skip
    cmd = recipes.ServerCommand(("s", "--spec-type", "ngram-mod"), "ik-legacy")
    recipes.check_against_help(cmd, ik, "ik")
    bad = recipes.ServerCommand(("s", "--spec-type", "ngram-dflash"), "ik-legacy")
    refused = "asks for spec type ngram-dflash, which ik does not offer"
    with pytest.raises(LlamaspecError, match=refused):
        recipes.check_against_help(bad, ik, "ik")
    assert server_help.spec_type_choices("-m FNAME  model") is None
    # ik after its PR #1908 (8337e4c): a SPEC[:k=v,...] usage, the names on a `types:` line
    # (the bracket there holds the key syntax, not the choices)
    ik_new = (
        "  --spec-type SPEC[:k=v,...]      one speculative stage; repeat it to chain two\n"
        "                                  types: none, draft, mtp, ngram-cache, ngram-mod\n"
        "                                  keys: n_max,n_min,p_min\n"
    )
    assert server_help.spec_type_choices(ik_new) == {
        "none", "draft", "mtp", "ngram-cache", "ngram-mod"
    }  # fmt: skip
    assert methods.offered("ik-spec-type", ik_new, "ngram-cache") is None
    stage = recipes.ServerCommand(
        ("s", "--spec-type", "ngram-mod:n_max=64,n_min=0"), "ik-spec-type"
    )
    recipes.check_against_help(stage, ik_new, "ik")  # one stage, its keys are not types
    lacking = recipes.ServerCommand(("s", "--spec-type", "suffix:n_max=8"), "ik-spec-type")
    with pytest.raises(LlamaspecError, match="asks for spec type suffix, which ik does not offer"):
        recipes.check_against_help(lacking, ik_new, "ik")
    assert "not in this binary's --spec-type list" in (
        methods.offered("ik-spec-type", ik_new, "ngram-map-k4v") or ""
    )


def test_help_check_refuses_removed_and_unknown_flags() -> None:
    help_text = (
        "--spec-draft-n-max N                    number of tokens to draft\n"
        "--draft, --draft-n, --draft-max N       the argument has been removed. use\n"
        "                                        --spec-draft-n-max\n"
        "--spec-type none,draft-simple,ngram-mod\n"
        "                                        comma-separated list\n"
        "-m,    --model FNAME                    model path\n"
        "--host HOST                             address\n"
        "--port PORT                             port\n"
    )
    assert server_help.accepted_flags(help_text) == {
        "--spec-draft-n-max",
        "--spec-type",
        "-m",
        "--model",
        "--host",
        "--port",
    }
    old = recipes.ServerCommand(("s", "-m", "x", "--draft-max", "8"), "upstream-legacy")
    with pytest.raises(LlamaspecError, match="does not accept --draft-max"):
        recipes.check_against_help(old, help_text, "llama-server")
    mtp = recipes.ServerCommand(("s", "-m", "x", "--spec-type", "draft-mtp"), "upstream")
    refused = r"spec type mtp or assistant \(--spec-type draft-mtp\), which llama-server does"
    with pytest.raises(LlamaspecError, match=refused):
        recipes.check_against_help(mtp, help_text, "llama-server")


def test_llama_swap_entry() -> None:
    recipe = config.load_recipes(ROOT)["qwen3-8b"]
    cmd = recipes.render(recipe, "llama.cpp", "upstream", "/m/a b.gguf", "/m/d.gguf")
    entry = yaml.safe_load(recipes.llama_swap("qwen3-8b", cmd))
    body = entry["models"]["qwen3-8b"]
    assert "--port ${PORT}" in body["cmd"] and "'/m/a b.gguf'" in body["cmd"]
    assert body["checkEndpoint"] == "/health" and "ttl" not in body and "cmdStop" not in body
    entry = yaml.safe_load(recipes.llama_swap("qwen3-8b", cmd, 300, ["q", "q", "fast"]))
    body = entry["models"]["qwen3-8b"]
    assert body["ttl"] == 300 and body["aliases"] == ["q", "fast"]


def test_llama_swap_docker_entry_stops_its_container_by_name() -> None:
    from llamaspec.images import commands

    recipe = config.load_recipes(ROOT)["qwen3-8b"]
    cmd = recipes.render(recipe, "llama.cpp", "upstream", "/models/a.gguf", "/models/d.gguf")
    run = commands.docker_run_swap(
        "ghcr.io/x/y:cuda", "cuda", cmd.argv, [("/h/a b.gguf", "/models/a.gguf")]
    )
    assert run.startswith("docker run --rm --name ${MODEL_ID} --gpus all ")
    assert "-p 127.0.0.1:${PORT}:8080 " in run and "\n" not in run
    assert "--port" not in run and "-m /models/a.gguf" in run
    entry = yaml.safe_load(
        recipes.llama_swap_entry("qwen3-8b", run, 60, (), stop="docker stop ${MODEL_ID}")
    )
    assert entry["models"]["qwen3-8b"]["cmdStop"] == "docker stop ${MODEL_ID}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["models", "pull", "qwen2.5-coder-7"], "Did you mean 'qwen2.5-coder-7b'"),
        (["models", "check", "lama-3.1-8b"], "Did you mean 'llama-3.1-8b'"),
        (["recipe", "show", "qwen3-8"], "Did you mean 'qwen3-8b'"),
        (
            ["recipe", "show", "glm-4.5-air-mtp", "--dialect", "upstream-legacy"],
            "asks for spec type mtp, which llama.cpp (dialect 'upstream-legacy'",
        ),
        (["recipe", "show", "qwen3-8b", "--engine", "ik-llama"], "Did you mean 'ik_llama.cpp'"),
    ],
)
def test_cli_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli(*args, env_cache=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_cli_check_of_two_files_names_the_rule(tmp_path: Path) -> None:
    t = write_gguf(tmp_path / "t.gguf", vocab(300))
    d = write_gguf(tmp_path / "d.gguf", vocab(300, change={7: "x"}))
    proc = cli(
        "models", "check", "--target-file", str(t), "--draft-file", str(d), env_cache=tmp_path
    )
    assert proc.returncode == 2
    assert "token 7 differs: 'tok7' vs 'x'" in " ".join(proc.stderr.split())


def test_the_docs_list_every_pair_with_its_recipes() -> None:
    readme = (ROOT / "docs/guides/pairs-and-recipes.md").read_text()
    models = config.load_models(ROOT)
    rows = {ln.split("|")[1].strip(" `"): ln for ln in readme.splitlines() if ln.startswith("| `")}
    for name in models.pairs:
        assert name in rows, f"the pairs table (docs/guides/pairs-and-recipes.md) lacks {name}"
    for recipe in config.load_recipes(ROOT, models).values():
        assert f"`{recipe.name}`" in rows[recipe.pair], f"pairs table: {recipe.name} not listed"


def test_cli_renders_the_ngram_recipe_for_ik_at_its_default_pin(tmp_path: Path) -> None:
    """Issue 18: ik_llama.cpp 55d3c05 has `--spec-type ngram-mod`; the recipe renders to it."""
    proc = cli(
        "recipe", "show", "gemma3-270m-ngram", "--engine", "ik_llama.cpp", env_cache=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ik at 55d3c05 reads chats without Jinja: the built-in template by its name
    assert proc.stdout.splitlines()[0].endswith(
        "-c 4096 -np 1 --chat-template deepseek --spec-type ngram-mod --metrics"
    )
    proc = cli(
        "recipe", "show", "deepseek-r1", "--engine", "ik_llama.cpp", "--backend", "cpu",
        env_cache=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.splitlines()[0]
    assert line.endswith("--draft-max 12 --draft-min 0 --draft-p-min 0.5 --metrics")
    assert "-ngl" not in line
    assert "dropped -ngl 99, -ngld 99, -ot exps=CPU" in " ".join(
        (proc.stdout + proc.stderr).split()
    )


def test_cli_renders_a_docker_run_line_with_the_models_mounted(tmp_path: Path) -> None:
    """`--format docker`: every model file mounted read-only where it really is, under its
    own name in /models, the port on loopback only, the recipe in the image's dialect."""
    args = ("recipe", "show", "gemma3-270m-ngram", "--format", "docker", "--port", "9000")
    proc = cli(*args, "--backend", "cpu", env_cache=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run, server = proc.stdout.splitlines()[-2:]
    model = (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").resolve()
    assert run.startswith("docker run --rm -p 127.0.0.1:9000:8080 ")
    assert f" -v {model}:/models/gemma-3-270m-q4_k_m.gguf:ro " in run
    assert run.endswith(" ghcr.io/llamaspec/llamaspec:llama.cpp-cpu \\")
    want = (  # the base model's GGUF has no chat template: upstream gets Gemma's by name
        "-m /models/gemma-3-270m-q4_k_m.gguf -c 4096 -np 1 --no-jinja --chat-template deepseek "
        "--spec-type ngram-mod --metrics"
    )
    assert server.strip() == want
    image = "127.0.0.1:5000/team/llamaspec:mine"
    proc = cli(*args, "--backend", "cuda", "--image", image, env_cache=tmp_path)
    run = proc.stdout.splitlines()[-2]
    assert proc.returncode == 0 and " --gpus all " in run and run.endswith(f" {image} \\")
    proc = cli(*args, env_cache=tmp_path)  # the host picks the backend, and says so
    assert proc.stdout.startswith("# the server has no authentication")  # the line alone
    assert "# restarts when it dies: `llamaspec recipe show RECIPE --format compose`" in proc.stdout
    assert "recipe: this host → cpu image" in proc.stderr
    proc = cli(*args[:2], "qwen2.5-coder-7b", *args[3:], env_cache=tmp_path)
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in text
    assert "is not downloaded" in text and "`llamaspec models pull qwen2.5-coder-7b` first" in text


def test_cli_writes_the_same_run_as_a_compose_file(tmp_path: Path) -> None:
    args = ("recipe", "show", "gemma3-270m-ngram", "--port", "9000", "--backend")
    proc = cli(*args, "cuda", "--format", "compose", env_cache=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    service = yaml.safe_load(proc.stdout)["services"]["llama-server"]
    model = (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").resolve()
    assert service["image"] == "ghcr.io/llamaspec/llamaspec:llama.cpp-cuda13"
    assert service["ports"] == ["127.0.0.1:9000:8080"]
    assert service["restart"] == "unless-stopped"  # docker brings a dead server back
    assert "healthcheck" not in service  # the image's own HEALTHCHECK applies
    assert service["volumes"] == [
        {
            "type": "bind",
            "source": str(model),
            "target": "/models/gemma-3-270m-q4_k_m.gguf",
            "read_only": True,
        }
    ]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    docker = cli(*args, "cuda", "--format", "docker", env_cache=tmp_path).stdout.splitlines()
    assert service["command"] == docker[-1].split()  # the same server arguments


def test_one_invalid_recipe_file_blocks_only_itself(tmp_path: Path) -> None:
    """Skipped and named by the commands that list recipes; `find` of it gives its error."""
    import shutil

    for name in ("engines.yaml", "models.yaml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "recipes").mkdir()
    shutil.copy2(ROOT / "recipes" / "gemma3-270m-ngram.yaml", tmp_path / "recipes")
    (tmp_path / "recipes" / "broken.yaml").write_text("pair: gemma3-270m\nspec: [{type: nope}]\n")
    with pytest.raises(LlamaspecError, match="broken.yaml"):
        config.load_recipes(tmp_path)  # strict: what the repository's own checks use
    said: list[str] = []
    known = recipes.load_all(tmp_path, said.append)
    assert list(known) == ["gemma3-270m-ngram"]
    assert len(said) == 1 and said[0].startswith("recipe 'broken' skipped (invalid):")
    assert recipes.find("gemma3-270m-ngram", tmp_path)[0].name == "gemma3-270m-ngram"
    with pytest.raises(LlamaspecError, match="broken.yaml"):
        recipes.find("broken", tmp_path)


def test_an_unreachable_hub_is_one_paragraph_whatever_client_the_hub_library_uses(
    tmp_path: Path,
) -> None:
    """huggingface_hub 2.x raises httpx2's errors, not httpx's: both end as one paragraph."""
    proc = subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", "models", "check", "qwen2.5-coder-7b"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=120,
        env={
            "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LLAMASPEC_CACHE": str(tmp_path),
            "HF_ENDPOINT": "http://127.0.0.1:9",
        },
    )  # fmt: skip
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Could not reach http://127.0.0.1:9 to fetch ggml-org/Qwen2.5-Coder-7B" in text
    assert "Connection refused" in text


def test_pull_into_a_local_dir_and_the_docker_line_that_mounts_it(tmp_path: Path) -> None:
    """`models pull --local-dir DIR`: plain files (no symlinks into blobs/), the same bytes,
    kept on a second pull, never overwriting another file; `recipe show --format docker
    --models-dir DIR` mounts DIR read-only at /models and refuses a DIR without the files."""
    local = tmp_path / "plain"
    pull = ("models", "pull", "gemma3-270m-ngram", "--local-dir")
    proc = cli(*pull, str(local), env_cache=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    placed = local / "gemma-3-270m-q4_k_m.gguf"
    cached = (tmp_path / "models" / "gemma-3-270m-q4_k_m.gguf").resolve()
    assert placed.is_file() and not placed.is_symlink() and placed.samefile(cached)
    again = cli(*pull, str(local), env_cache=tmp_path)
    assert again.returncode == 0 and "is already there" in again.stdout
    other = tmp_path / "other"
    other.mkdir()
    (other / placed.name).write_bytes(b"not a model")
    refused = cli(*pull, str(other), env_cache=tmp_path)
    text = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and "exists and is not the verified" in text
    assert (other / placed.name).read_bytes() == b"not a model"
    show = ("recipe", "show", "gemma3-270m-ngram", "--format", "docker", "--backend", "cpu")
    proc = cli(*show, "--models-dir", str(local), env_cache=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f" -v {local.resolve()}:/models:ro " in proc.stdout
    assert "-m /models/gemma-3-270m-q4_k_m.gguf -c 4096" in proc.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = cli(*show, "--models-dir", str(empty), env_cache=tmp_path)
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "lacks gemma-3-270m-q4_k_m.gguf" in text
    assert "models pull gemma3-270m-ngram --local-dir" in text


def test_a_transport_error_of_any_client_is_one_paragraph() -> None:
    from llamaspec.models import catalog, hub

    model = catalog.ModelFile(repo="org/m-GGUF", file="m.gguf", tokenizer="t", license="mit")

    class ConnectError(Exception):  # as a client llamaspec does not name would raise it
        __module__ = "httpcore2._exceptions"

    refused = r"Could not reach .* \(ConnectError: refused\)"
    with pytest.raises(LlamaspecError, match=refused), hub.hub_errors(model, "m.gguf"):
        raise ConnectError("refused")
    # not a network error: not disguised as one
    with pytest.raises(ValueError, match="a bug"), hub.hub_errors(model, "m.gguf"):
        raise ValueError("a bug")


def test_user_models_pairs_and_recipes_come_from_the_user_config_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamaspec.models import recipes as recipes_mod

    user = tmp_path / "config"
    (user / "recipes").mkdir(parents=True)
    monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(user))
    (user / "models.yaml").write_text(
        "models:\n  mine:\n    repo: me/mine-GGUF\n    file: mine-q4_k_m.gguf\n"
        "    tokenizer: gemma3\n    license: mit\n"
        "pairs:\n  mine-ngram:\n    target: mine\n    spec: ngram\n"
    )
    (user / "recipes" / "mine-ngram.yaml").write_text(
        "pair: mine-ngram\ndescription: my model\nspec:\n  types: [ngram-mod]\n"
    )
    # the same name as a project recipe: the user's wins, and says so
    (user / "recipes" / "gemma3-270m-ngram.yaml").write_text(
        "pair: gemma3-270m-ngram\ndescription: mine instead\nspec:\n  types: [ngram-simple]\n"
    )
    (user / "recipes" / "broken.yaml").write_text("pair: [oops\n")
    catalog = config.load_models(ROOT)
    assert "mine" in catalog.models and "gemma3-270m-q4_k_m" in catalog.models
    origins: dict[str, str] = {}
    said: list[str] = []
    known = recipes_mod.load_all(ROOT, said.append, origins)
    assert known["mine-ngram"].pair == "mine-ngram" and origins["mine-ngram"] == "user"
    assert known["gemma3-270m-ngram"].description == "mine instead"
    assert origins["gemma3-270m-ngram"] == "user (over checkout)"
    assert origins["gemma3-270m-ngram-tuned"] == "checkout"
    assert any("'broken' skipped" in s for s in said)
    # a user pair naming a model nobody defines is refused naming both files
    (user / "models.yaml").write_text("pairs:\n  bad:\n    target: nobody\n    spec: ngram\n")
    with pytest.raises(LlamaspecError, match=r"models.yaml with .*config/models.yaml: pair 'bad'"):
        config.load_models(ROOT)


def test_a_user_config_dir_that_is_a_file_is_one_paragraph(tmp_path: Path) -> None:
    """llamaspec only reads the user config dir (it may be read-only), but it must be a dir."""
    (tmp_path / "cfg").write_text("not a directory\n")
    proc = cli(
        "recipe", "list", env_cache=tmp_path, env={"LLAMASPEC_CONFIG_DIR": str(tmp_path / "cfg")}
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = " ".join(proc.stderr.split())
    assert "LLAMASPEC_CONFIG_DIR is" in said and "which is a file, not a folder" in said
    assert "Traceback" not in said


# --- pulls against the local hub server (loopback only) -----------------------------------


class _Pulls:
    """A project root with a copy of the checkout's lock, a user config dir, a user data dir,
    an HF cache and a hub, all in tmp."""

    def __init__(self, tmp: Path, hub, monkeypatch: pytest.MonkeyPatch) -> None:
        from huggingface_hub import constants as hf_constants

        self.hub, self.root = hub, tmp / "project"
        self.root.mkdir()
        (self.root / "llamaspec.lock").write_bytes((ROOT / "llamaspec.lock").read_bytes())
        self.config, self.data = tmp / "config", tmp / "data"
        self.config.mkdir()
        for key, value in {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            "LLAMASPEC_CONFIG_DIR": str(self.config),
            "LLAMASPEC_DATA": str(self.data),
        }.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp / "hf"))
        for name, n in (("t", 1 << 16), ("d", 1 << 12), ("p", 1 << 12)):
            f = write_gguf(tmp / f"{name}.gguf", vocab(300), payload_bytes=n)
            hub.add(f"org/{name}-GGUF", f"{name}.gguf", f)
        model = "    repo: org/{0}-GGUF\n    file: {0}.gguf\n    tokenizer: t\n    license: mit\n"
        (self.root / "models.yaml").write_text(
            "models:\n  proj:\n" + model.format("p")
            + "pairs:\n  proj-ngram:\n    target: proj\n    spec: ngram\n"
        )  # fmt: skip
        (self.config / "models.yaml").write_text(
            "models:\n  mine:\n" + model.format("t") + "  mine-d:\n" + model.format("d")
            + "pairs:\n  mine-pair:\n    target: mine\n    draft: mine-d\n"
        )  # fmt: skip

    def pull(self, pair: str, **kw: object) -> str:
        import io

        from rich.console import Console

        from llamaspec.models import catalog

        out = io.StringIO()
        console = Console(file=out, width=200)
        catalog.pull(config.load_models(self.root), pair, self.root, console, **kw)  # type: ignore[arg-type]
        return out.getvalue()


@pytest.fixture
def pulls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hubserver import Hub

    with Hub() as hub:
        yield _Pulls(tmp_path, hub, monkeypatch)


def test_pulling_a_user_pair_pins_it_in_the_users_lock_not_the_checkouts(pulls: _Pulls) -> None:
    """The user's own models (user config dir) are recorded in the user data dir's lock;
    the checkout's tracked llamaspec.lock stays byte-identical. Reading merges both."""
    from llamaspec import lock

    before = (pulls.root / "llamaspec.lock").read_bytes()
    said = pulls.pull("mine-pair")
    assert (pulls.root / "llamaspec.lock").read_bytes() == before
    mine = yaml.safe_load((pulls.data / "llamaspec.lock").read_text())
    sha = pulls.hub.repos["org/t-GGUF"].files["t.gguf"].sha256
    assert mine["models"]["mine"]["sha256"] == {"t.gguf": sha}
    assert set(mine["models"]) == {"mine", "mine-d"}
    assert f"recorded mine @ {pulls.hub.repos['org/t-GGUF'].commit[:12]} in {pulls.data}" in said
    merged = lock.load(pulls.root)
    assert merged["models"]["mine"] == mine["models"]["mine"]
    assert merged["engines"] == lock.load_project(pulls.root)["engines"]
    assert "mine" not in lock.load_project(pulls.root)["models"]  # what maintainers write back
    # a second pull: verified from the cache against the user's pins, nothing recorded again
    served = len(pulls.hub.content_gets())
    again = pulls.pull("mine-pair")
    assert "recorded" not in again and len(pulls.hub.content_gets()) == served
    assert (pulls.root / "llamaspec.lock").read_bytes() == before


def test_pulling_a_project_pair_leaves_the_checkouts_lock_alone(pulls: _Pulls) -> None:
    """No user command writes the tracked llamaspec.lock: a project pair the checkout's lock
    does not pin yet is recorded in the user's lock, and read from there."""
    from llamaspec import lock

    before = (pulls.root / "llamaspec.lock").read_bytes()
    said = pulls.pull("proj-ngram")
    assert (pulls.root / "llamaspec.lock").read_bytes() == before
    mine = yaml.safe_load((pulls.data / "llamaspec.lock").read_text())
    sha = pulls.hub.repos["org/p-GGUF"].files["p.gguf"].sha256
    assert mine["models"]["proj"]["sha256"] == {"p.gguf": sha}
    assert f"in {pulls.data}" in said
    assert lock.load(pulls.root)["models"]["proj"] == mine["models"]["proj"]
    again = pulls.pull("proj-ngram")
    assert "recorded" not in again
    assert (pulls.root / "llamaspec.lock").read_bytes() == before


def test_a_maintainers_lock_write_never_takes_the_users_pins(pulls: _Pulls) -> None:
    from llamaspec import lock

    pulls.pull("mine-pair")
    data = lock.load_project(pulls.root)
    data["engines"] = {**data["engines"], "llama.cpp": "0" * 40}
    lock.save(pulls.root, data)
    written = yaml.safe_load((pulls.root / "llamaspec.lock").read_text())
    assert "mine" not in (written.get("models") or {})


def test_pull_local_dir_that_cannot_be_written_is_refused_before_any_download(
    pulls: _Pulls,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """`models pull --local-dir FILE` refused the destination only after downloading the
    whole pair; now the cheap checks come first and the hub is not asked at all."""
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for dest, says in (
        (a_file, "is a file, not a directory"),
        (a_file / "sub", "cannot be made: .*a-file is a file"),
        (locked / "sub", "is not writable by this user"),
    ):
        if says.startswith("is not writable") and os.geteuid() == 0:
            continue  # root writes anywhere
        with pytest.raises(LlamaspecError, match=says):
            pulls.pull("mine-pair", local_dir=dest)
    assert pulls.hub.log == []
    assert not (pulls.data / "llamaspec.lock").exists()
    # the command line the same way: exit 2, one paragraph, not one request to the hub
    from llamaspec.cli.main import main

    monkeypatch.setenv("LLAMASPEC_ROOT", str(pulls.root))
    with pytest.raises(SystemExit) as exit_:  # refused as the command line is read
        main(["models", "pull", "mine-pair", "--local-dir", str(a_file)])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_.value.code == 2 and "is a file, not a folder" in err
    assert "Traceback" not in err
    assert pulls.hub.log == [] and not (tmp_path / "hf").exists()


# Excerpts of the pinned servers' --help: upstream 0c1e570 (common/arg.cpp) and ik_llama.cpp
# 55d3c05 (common/common.cpp, gpt_params_print_usage).
UPSTREAM_HELP = """\
-m,    --model FNAME                    model path
--host HOST                             ip address to listen
--port PORT                             port to listen
-c,    --ctx-size N                     size of the prompt context
-np,   --parallel N                     number of server slots
--jinja, --no-jinja                     whether to use jinja template engine (default: enabled)
--chat-template JINJA_TEMPLATE          set custom jinja chat template
--spec-type none,draft-simple,ngram-simple,ngram-mod
                                        speculative types
"""
IK_HELP = """\
  -m,    --model FNAME              model path
         --host HOST                ip address to listen
         --port PORT                port to listen
  -c,    --ctx-size N               size of the prompt context
  -np,   --parallel N               number of parallel sequences to decode
         --chat-template JINJA_TEMPLATE set custom jinja chat template
  --spec-type Name [none | ngram - cache | ngram - simple | ngram - mod]
"""


def test_a_recipe_names_a_built_in_chat_template_in_each_dialect() -> None:
    """Gemma 3 270M's GGUF has no chat template, and ChatML (the server's fallback) or
    Gemma's turns make the base model repeat the question: the recipe names the engine's
    built-in instruction/response template (`deepseek`), which it answers. Upstream's server
    reads `--chat-template` as Jinja source unless --no-jinja (its default is Jinja on: the
    name would be a template that prints itself); ik at its pin has Jinja off and looks the
    name up."""
    recipe = config.load_recipes(ROOT)["gemma3-270m-ngram"]
    assert recipe.server.chat_template == "deepseek"
    want = {
        "upstream": ["--no-jinja", "--chat-template", "deepseek"],
        "upstream-legacy": ["--no-jinja", "--chat-template", "deepseek"],
        "ik-legacy": ["--chat-template", "deepseek"],
        "ik-spec-type": ["--chat-template", "deepseek"],
    }
    for dialect, flags in want.items():
        engine = "ik_llama.cpp" if dialect.startswith("ik") else "llama.cpp"
        argv = list(recipes.render(recipe, engine, dialect, "t.gguf", None).argv)
        i = argv.index("--chat-template")
        assert argv[i - len(flags) + 2 : i + 2] == flags, (dialect, argv)
        assert "--no-jinja" not in argv or dialect.startswith("upstream")
        assert _spec_part(recipes.ServerCommand(tuple(argv), dialect)).startswith("--spec-type")
    up = recipes.render(recipe, "llama.cpp", "upstream", "t.gguf", None)
    recipes.check_against_help(up, UPSTREAM_HELP, "llama-server")
    ik = recipes.render(recipe, "ik_llama.cpp", "ik-legacy", "t.gguf", None)
    recipes.check_against_help(ik, IK_HELP, "llama-server")
    with pytest.raises(ValueError, match="chat_template"):
        config.ServerSettings(chat_template="{% for m in messages %}")  # a name, not Jinja


def test_ik_chains_put_the_self_speculative_stage_first() -> None:
    """ik 8337e4c refuses `--spec-type draft… --spec-type ngram-mod…` ("two-stage speculative
    mode currently requires a self-spec stage first"): the n-gram stage is rendered first."""
    spec = config.SpecSettings(types=("draft", "ngram-mod"), draft_n_max=8)
    argv = list(dialects.render("ik-spec-type", spec, draft=Path("d.gguf")).argv)
    stages = [argv[i + 1].split(":")[0] for i, a in enumerate(argv) if a == "--spec-type"]
    assert stages == ["ngram-mod", "draft"]
    # upstream keeps the order it is given (one --spec-type list)
    up = list(dialects.render("upstream", spec, draft=Path("d.gguf")).argv)
    assert up[up.index("--spec-type") + 1] == "draft-simple,ngram-mod"
