"""engines.yaml / series.yaml loading: the real files load, bad input gets clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llamaspec import config
from llamaspec.errors import LlamaspecError, choose

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def write_root(tmp_path: Path, engines: str, series: str = "patches: []\n") -> Path:
    (tmp_path / "engines.yaml").write_text(engines)
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series.yaml").write_text(series)
    return tmp_path


def test_real_engines_load_with_full_shas_and_mirrors() -> None:
    engines = config.load_engines(ROOT)
    assert set(engines) == {"llama.cpp", "ik_llama.cpp"}
    up = engines["llama.cpp"]
    assert up.pin == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    assert up.pypi and up.pypi.package == "llama-cpp-python" and up.pypi.version == "0.3.36"
    assert engines["ik_llama.cpp"].pin.startswith("55d3c05bf7b3")
    with pytest.raises(ValidationError):  # frozen
        up.pin = "x"  # type: ignore[misc]


def test_real_series_loads() -> None:
    assert isinstance(config.load_series(ROOT), tuple)


def test_unknown_key_gets_did_you_mean(tmp_path: Path) -> None:
    text = (ROOT / "engines.yaml").read_text().replace("server_dir:", "server_dirr:", 1)
    with pytest.raises(
        LlamaspecError, match=r"unknown key .*server_dirr.*Did you mean 'server_dir'"
    ):
        config.load_engines(write_root(tmp_path, text))


def test_short_pin_rejected(tmp_path: Path) -> None:
    text = (
        (ROOT / "engines.yaml")
        .read_text()
        .replace("0c1e57098bba43ac29e6e3b677cdceebdd22334f", "0c1e570")
    )
    with pytest.raises(LlamaspecError, match="not a full 40-character commit SHA"):
        config.load_engines(write_root(tmp_path, text))


def test_unknown_engine_name_in_file(tmp_path: Path) -> None:
    text = (ROOT / "engines.yaml").read_text().replace("  llama.cpp:", "  llama.ccp:", 1)
    with pytest.raises(LlamaspecError, match="Did you mean 'llama.cpp'"):
        config.load_engines(write_root(tmp_path, text))


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    with pytest.raises(LlamaspecError, match=r"not valid YAML at line 2"):
        config.load_engines(write_root(tmp_path, "engines:\n  a: b: c\n"))


def test_series_rejects_unknown_engine_and_escaping_path(tmp_path: Path) -> None:
    root = write_root(
        tmp_path,
        (ROOT / "engines.yaml").read_text(),
        "patches:\n- {id: a, engine: llama.cp, title: t, source: {file: a.patch}}\n",
    )
    with pytest.raises(LlamaspecError, match="Did you mean 'llama.cpp'"):
        config.load_series(root)
    (root / "patches" / "series.yaml").write_text(
        "patches:\n- {id: a, engine: llama.cpp, title: t, source: {file: ../../etc/passwd}}\n"
    )
    with pytest.raises(LlamaspecError, match=r"relative path inside the tree"):
        config.load_series(root)


def test_choose_suggests() -> None:
    assert choose("engine", "llama.cpp", ["llama.cpp"]) == "llama.cpp"
    with pytest.raises(LlamaspecError, match="Did you mean 'ik_llama.cpp'"):
        choose("engine", "ik-llama.cpp", ["llama.cpp", "ik_llama.cpp"])


def test_series_source_needs_exactly_one_kind_and_known_requirements(tmp_path: Path) -> None:
    root = write_root(
        tmp_path,
        (ROOT / "engines.yaml").read_text(),
        "patches:\n- {id: a, engine: llama.cpp, title: t,\n"
        "   source: {file: a.patch, pr_head: true}}\n",
    )
    with pytest.raises(LlamaspecError, match="exactly one of"):
        config.load_series(root)
    (root / "patches" / "series.yaml").write_text(
        "patches:\n- {id: a, engine: llama.cpp, title: t, source: {file: a.patch}, "
        "requires: [spec-checkpointin]}\n"
    )
    with pytest.raises(LlamaspecError, match="not in the catalog"):
        config.load_series(root)
    (root / "patches" / "series.yaml").write_text(
        "patches:\n- {id: a, engine: llama.cpp, title: t, source: {commits: [xyz]}}\n"
    )
    with pytest.raises(LlamaspecError, match="is not a commit SHA"):
        config.load_series(root)


def test_real_series_has_the_two_seed_patches() -> None:
    by_id = {p.id: p for p in config.load_series(ROOT)}
    port = by_id["ik-spec-port"]
    assert port.source.commits == ("b6bc5eedadb75a2e690fc907e83951e6081fa459",)
    assert port.upstream and port.upstream.pr == 645 and port.default
    ckpt = by_id["spec-checkpointing"]
    assert ckpt.upstream and ckpt.upstream.pr == 19493 and ckpt.landed and ckpt.landed.release
    opens = [p for p in by_id.values() if p.state == "open"]
    assert {p.upstream.pr for p in opens if p.upstream} == {25592, 28118, 1976}
    assert not any(p.default for p in opens)


def test_a_duplicate_pair_key_in_models_yaml_names_key_and_line(tmp_path: Path) -> None:
    text = (ROOT / "models.yaml").read_text()
    assert text.rstrip().splitlines()[-1].startswith("    ")  # pairs is the last section
    dup_at = text.count("\n") + 1
    (tmp_path / "models.yaml").write_text(
        text + "  gemma3-270m-self:\n    target: gemma-3-270m-q4_k_m\n    spec: ngram\n"
    )
    first = 1 + text[: text.index("\n  gemma3-270m-self:")].count("\n") + 1
    with pytest.raises(LlamaspecError) as err:
        config.load_models(tmp_path)
    assert (
        f"at line {dup_at}, column 3: duplicate key 'gemma3-270m-self' (first given at line "
        f"{first})" in err.value.message
    )


def test_duplicate_keys_are_refused_in_every_yaml_file(tmp_path: Path) -> None:
    root = write_root(tmp_path, (ROOT / "engines.yaml").read_text(), "patches: []\npatches: []\n")
    with pytest.raises(LlamaspecError, match="duplicate key 'patches'.*line 1"):
        config.load_series(root)
    # merge keys may still be overridden, as YAML intends
    assert config.load_yaml_text("a: &x {k: 1}\nb:\n  <<: *x\n  k: 2\n", "t") == {
        "a": {"k": 1},
        "b": {"k": 2},
    }


def test_unreadable_yaml_is_one_paragraph(tmp_path: Path) -> None:
    (tmp_path / "engines.yaml").mkdir()
    with pytest.raises(LlamaspecError, match="is a directory"):
        config.load_engines(tmp_path)
    (tmp_path / "engines.yaml").rmdir()
    (tmp_path / "engines.yaml").write_bytes(b"engines:\n  \xff\xfe: x\n")
    with pytest.raises(LlamaspecError, match="cannot be read .not UTF-8"):
        config.load_engines(tmp_path)
