"""A real draft pair from the embedded model alone (issue 44): a derived model (the F32 copy
of a catalog model, made here and verified against models.yaml's sha256), the pair that
drafts for it with the Q4_K_M, its recipe in both engines' dialects, and the refusal of a
pair whose draft is not smaller than its target (with the ratio). Small real GGUFs written
with the `gguf` package, served by the local hub server; nothing leaves loopback."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize
from rich.console import Console

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.models import catalog, derived, gguf_header, recipes

from ggufs import vocab
from runcli import cli

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


# --- the repository's catalog ------------------------------------------------------------


def test_the_catalog_has_the_f32_target_its_q4_draft_and_a_recipe() -> None:
    models = config.load_models(ROOT)
    f32 = models.models["gemma3-270m-f32"]
    assert (f32.source, f32.derived_from, f32.dtype) == ("derived", "gemma3-270m-q4_k_m", "f32")
    assert f32.file == config.derived_name("gemma-3-270m-q4_k_m.gguf", EMBEDDED_SHA)
    assert f32.file == "gemma-3-270m-q4_k_m-a5fd3b62230aa5ec-f32.gguf"
    assert f32.sha256 and f32.size and f32.repo is None
    pair = models.pairs["gemma3-270m-f32-q4draft"]
    assert (pair.target, pair.draft, pair.spec, pair.plumbing) == (
        "gemma3-270m-f32",
        "gemma3-270m-q4_k_m",
        "draft",
        False,
    )
    assert models.pairs["gemma3-270m-self"].plumbing  # the self-draft: a warning, not refused
    recipe = config.load_recipes(ROOT, models)["gemma3-270m-q4-draft"]
    assert recipe.pair == "gemma3-270m-f32-q4draft" and recipe.spec.types == ("draft",)
    # tune's best draft setting, with the report that measured it
    assert recipe.spec.draft_p_min == 0.0 and recipe.measured is not None
    assert (ROOT / recipe.measured.report).is_file()
    # the strict tier's reference copy and the derived model are one file
    source = Path("gemma-3-270m-q4_k_m.gguf")
    assert derived.copy_path(source, EMBEDDED_SHA) == derived.copies_dir() / f32.file


def test_the_recipe_renders_for_both_engines() -> None:
    recipe = config.load_recipes(ROOT)["gemma3-270m-q4-draft"]
    up = recipes.render(recipe, "llama.cpp", "upstream", "t.gguf", "d.gguf")
    assert up.shell() == (
        "llama-server -m t.gguf --host 127.0.0.1 --port 8080 -c 4096 -np 1 --no-jinja "
        "--chat-template deepseek --spec-type draft-simple --spec-draft-model d.gguf "
        "--spec-draft-n-max 8 --spec-draft-n-min 0 --spec-draft-p-min 0.0"
    )
    ik = recipes.render(recipe, "ik_llama.cpp", "ik-legacy", "t.gguf", "d.gguf")
    assert ik.shell().endswith(
        "-c 4096 -np 1 --chat-template deepseek -md d.gguf --draft-max 8 --draft-min 0 "
        "--draft-p-min 0.0"
    )
    ik_new = recipes.render(recipe, "ik_llama.cpp", "ik-spec-type", "t.gguf", "d.gguf")
    assert "-md" in ik_new.argv and "d.gguf" in ik_new.argv


def test_recipe_show_names_the_copy_not_made_yet(tmp_path: Path) -> None:
    """Before the copy is made, `recipe show` prints where it comes from and says that
    pulling makes it (it does not make a 1 GB file to print a command line)."""
    proc = cli("recipe", "show", "gemma3-270m-q4-draft", "--engine", "ik_llama.cpp",
               env_cache=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.splitlines()[0]
    assert line.startswith(
        "llama-server -m derived://gemma3-270m-q4_k_m/gemma-3-270m-q4_k_m-a5fd3b62230aa5ec-"
        "f32.gguf "
    )
    assert "-md " in line and "models pull gemma3-270m-f32-q4draft" in " ".join(proc.stderr.split())
    assert not list(tmp_path.rglob("*-f32.gguf"))


def test_bench_and_tune_make_a_copy_of_the_embedded_model_themselves() -> None:
    """`bench --recipe` refuses a pair that is not downloaded; a derived model whose source
    is the embedded model is on hand (made on first use), without touching a file."""
    models = config.load_models(ROOT)
    assert catalog.on_hand(models, "gemma3-270m-f32", {})
    assert catalog.on_hand(models, "gemma3-270m-q4_k_m", {})
    assert not catalog.on_hand(models, "qwen2.5-coder-7b-q8_0", {})


# --- the schema ----------------------------------------------------------------------------

SOURCE_SHA = "ab" * 32
SOURCE = {
    "repo": "org/s-GGUF",
    "file": "sub/s-q8_0.gguf",
    "sha256": SOURCE_SHA,
    "tokenizer": "t",
    "license": "mit",
}
DERIVED = {
    "source": "derived",
    "derived_from": "s",
    "dtype": "f32",
    "file": f"s-q8_0-{SOURCE_SHA[:16]}-f32.gguf",
    "tokenizer": "t",
    "license": "mit",
}


def _load(tmp: Path, models: dict, pairs: dict | None = None) -> config.ModelsFile:
    (tmp / "models.yaml").write_text(yaml.safe_dump({"models": models, "pairs": pairs or {}}))
    return config.load_models(tmp)


def test_a_derived_model_entry_is_validated_in_one_place(tmp_path: Path) -> None:
    got = _load(tmp_path, {"s": SOURCE, "f": DERIVED}, {"p": {"target": "f", "draft": "s"}})
    assert got.models["f"].parts == (DERIVED["file"],)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"derived_from": None}, "needs `derived_from`"),
        ({"dtype": None}, "needs `derived_from` .* and `dtype: f32`"),
        ({"dtype": "f16"}, "f32"),
        ({"repo": "org/x-GGUF"}, "made here, not downloaded: drop `repo`"),
        ({"sha256": ["ab" * 32, "cd" * 32]}, "give one sha256"),
        ({"derived_from": "t"}, r"derived from 't', which is not under `models:`"),
        ({"derived_from": "s2"}, "Did you mean 's'"),
        ({"file": "s-f32.gguf"}, f"write `file: s-q8_0-{SOURCE_SHA[:16]}-f32.gguf`"),
    ],
)
def test_bad_derived_models(tmp_path: Path, change: dict, message: str) -> None:
    entry = {k: v for k, v in {**DERIVED, **change}.items() if v is not None}
    with pytest.raises(LlamaspecError, match=message):
        _load(tmp_path, {"s": SOURCE, "f": entry})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"sha256": None}, "whose `sha256` models.yaml records"),
        ({"file": "s-q8_0-00001-of-00002.gguf", "sha256": None}, "in one part"),
    ],
)
def test_a_derived_model_needs_one_verified_source_file(
    tmp_path: Path, source: dict, message: str
) -> None:
    src = {k: v for k, v in {**SOURCE, **source}.items() if v is not None}
    with pytest.raises(LlamaspecError, match=message):
        _load(tmp_path, {"s": src, "f": DERIVED})


def test_derived_fields_belong_to_derived_models_and_plumbing_to_draft_pairs(
    tmp_path: Path,
) -> None:
    with pytest.raises(LlamaspecError, match="belong to `source: derived` only"):
        _load(tmp_path, {"s": {**SOURCE, "dtype": "f32"}})
    with pytest.raises(LlamaspecError, match="`plumbing` is for a pair with a draft model"):
        _load(tmp_path, {"s": SOURCE}, {"p": {"target": "s", "spec": "ngram", "plumbing": True}})


# --- made from a real quantized GGUF, through the local hub server ---------------------------


def _quantized(path: Path, rows: int = 64) -> Path:
    """A GGUF with a tokenizer and Q8_0 weights: a source a copy is made from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(vocab(300))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_file_type(7)
    weights = np.random.default_rng(0).standard_normal((rows, 64)).astype(np.float32)
    q = quantize(weights, GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.w", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.norm", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class _World:
    """A project root (a copy of the checkout's lock, models.yaml written by the test), an
    HF cache and a hub serving one quantized GGUF, all in tmp."""

    def __init__(self, tmp: Path, hub, monkeypatch: pytest.MonkeyPatch) -> None:
        from huggingface_hub import constants as hf_constants

        self.tmp, self.hub, self.root = tmp, hub, tmp / "project"
        self.root.mkdir()
        (self.root / "llamaspec.lock").write_bytes((ROOT / "llamaspec.lock").read_bytes())
        for key, value in {"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp / "cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp / "hf"))
        src = _quantized(tmp / "s-q8_0.gguf")
        hub.add("org/s-GGUF", "s-q8_0.gguf", src)
        self.source_sha = hashlib.sha256(src.read_bytes()).hexdigest()
        self.copy_name = config.derived_name("s-q8_0.gguf", self.source_sha)

    def catalog(self, pairs: dict, sha256: str | None = None) -> config.ModelsFile:
        made = {"sha256": sha256} if sha256 else {}
        models = {
            "s": {**SOURCE, "file": "s-q8_0.gguf", "sha256": self.source_sha},
            "f": {**DERIVED, "file": self.copy_name, **made},
        }
        (self.root / "models.yaml").write_text(yaml.safe_dump({"models": models, "pairs": pairs}))
        return config.load_models(self.root)

    def pull(self, models: config.ModelsFile, pair: str) -> tuple[catalog.PairFiles, str]:
        out = io.StringIO()
        files = catalog.pull(models, pair, self.root, Console(file=out, width=300))
        return files, out.getvalue()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hubserver import Hub

    with Hub() as hub:
        yield _World(tmp_path, hub, monkeypatch)


PAIR = {"real": {"target": "f", "draft": "s"}}


def test_pulling_the_pair_makes_the_copy_once_and_checks_it(world: _World) -> None:
    models = world.catalog(PAIR)
    files, said = world.pull(models, "real")
    assert files.target == derived.copies_dir() / world.copy_name and files.draft is not None
    assert "the draft is 0.28× the target's size (4,608 bytes of 16,640 bytes" in said
    assert "model: f ok (made here, sha256 " in said
    reader = GGUFReader(files.target)
    assert {int(t.tensor_type) for t in reader.tensors} == {0}  # every tensor F32
    record = json.loads(files.target.with_suffix(".json").read_text())
    digest = hashlib.sha256(files.target.read_bytes()).hexdigest()
    assert record["sha256"] == digest and record["source_sha256"] == world.source_sha
    assert not list(files.target.parent.glob(".tmp-*"))  # nothing half-written left
    # the same bytes every time: models.yaml may record them, and a second pull only checks
    models = world.catalog(PAIR, sha256=digest)
    stamp = files.target.stat().st_mtime_ns
    again, said = world.pull(models, "real")
    assert again.target == files.target and files.target.stat().st_mtime_ns == stamp
    assert "f ok (made here, verified)" in said
    assert catalog.pair_files(models, "real", world.root)[0] == files.target
    # a copy changed on disk is not used: it is made again, to the recorded digest
    with files.target.open("r+b") as f:
        f.seek(-8, 2)
        f.write(b"\1" * 8)
    assert catalog.derived_made(models.models["f"]) is None
    world.pull(models, "real")
    assert hashlib.sha256(files.target.read_bytes()).hexdigest() == digest


def test_a_copy_that_is_not_the_recorded_file_is_one_paragraph(world: _World) -> None:
    models = world.catalog(PAIR, sha256="cd" * 32)
    with pytest.raises(LlamaspecError, match="has sha256 .* but models.yaml records cd") as err:
        world.pull(models, "real")
    assert "Install that gguf version" in err.value.message and "\n" not in err.value.message
    assert catalog.derived_made(models.models["f"]) is None


def test_a_draft_not_smaller_than_its_target_is_refused_with_the_ratio(world: _World) -> None:
    """Judged from headers before anything is downloaded or made: the copy (F32) drafting
    for its Q8_0 source is 3.61x the target's size; a model drafting for itself is 1.00x."""
    models = world.catalog(
        {
            "backwards": {"target": "s", "draft": "f"},
            "itself": {"target": "s", "draft": "s"},
            "plumbing": {"target": "s", "draft": "s", "plumbing": True},
        }
    )
    for pair, ratio in (("backwards", "3.61"), ("itself", "1.00")):
        with pytest.raises(LlamaspecError) as err:
            world.pull(models, pair)
        message = err.value.message
        assert f"Pair {pair!r}: the draft " in message
        assert f"is {ratio}× the target's size" in message
        assert "speculation cannot pay" in message and "Pick a smaller draft" in message
        assert "Nothing was downloaded." in message and "\n" not in message
    assert world.hub.content_gets() == [] or all(g.range for g in world.hub.content_gets())
    assert not (world.tmp / "cache" / "models" / "reference").exists()
    out = io.StringIO()
    verdict = catalog.check_pair(models, "plumbing", world.root, Console(file=out, width=300))
    assert verdict is not None and verdict.ok
    assert "is a plumbing pair" in out.getvalue() and "1.00×" in out.getvalue()


def test_a_split_target_whose_first_part_is_small_is_not_judged() -> None:
    small = gguf_header.TokenizerInfo("t", "llama", "llama", (), 1, 2, True, False, nbytes=10)
    big = gguf_header.TokenizerInfo("d", "llama", "llama", (), 1, 2, True, False, nbytes=100)
    assert catalog.size_ratio(small, big) == 10.0
    assert catalog.size_ratio(dataclasses.replace(small, split_count=3), big) is None
    assert catalog.size_ratio(small, dataclasses.replace(big, nbytes=None)) is None


def test_the_header_reader_counts_tensor_bytes_by_type(tmp_path: Path) -> None:
    info = gguf_header.read_local(_quantized(tmp_path / "q.gguf"))
    assert info.params == 64 * 64 + 64
    assert info.nbytes == 64 * 64 // 32 * 34 + 64 * 4  # Q8_0 blocks, and F32 norms


def test_draft_find_on_a_copy_not_made_yet_names_its_source() -> None:
    from llamaspec.models import drafts

    with pytest.raises(LlamaspecError, match="has not been made yet") as err:
        drafts.resolve_target("gemma3-270m-f32", config.load_models(ROOT))
    assert "give gemma3-270m-q4_k_m as the target" in err.value.message
