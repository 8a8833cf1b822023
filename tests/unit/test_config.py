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


def test_real_history_pins_span_2026_with_sdists_and_later_ik_commits() -> None:
    engines = config.load_engines(ROOT)
    up, ik = engines["llama.cpp"], engines["ik_llama.cpp"]
    pins = config.known_pins(up)
    assert len(pins) >= 5 and all(p.pypi for p in pins)
    assert [p.date for p in pins] == sorted(p.date for p in pins)
    assert pins[0].date.year == 2026 and pins[0].date.month <= 4 and pins[-1].date.month >= 9
    versions = {p.pypi.version: p.pin for p in pins if p.pypi}
    assert versions["0.3.20"].startswith("f49e9178767d") and versions["0.3.36"] == up.pin
    assert versions["0.3.28"].startswith("9e3b928fd")
    assert len({p.pypi.sha256 for p in pins if p.pypi}) == len(pins)
    later = [h for h in ik.history if h.date > ik.pin_date]
    assert len(later) >= 2 and all(h.pypi is None and h.note for h in later)


def test_record_for_a_history_pin_carries_its_date_and_mirror() -> None:
    up = config.load_engines(ROOT)["llama.cpp"]
    assert config.record_for(up, up.pin) is up
    old = up.history[0]
    rec = config.record_for(up, old.pin)
    assert rec is not None and rec.pin == old.pin and rec.pin_date == old.date
    assert rec.pypi == old.pypi and rec.build_number is None and rec.tag.startswith("llama-cpp")
    assert config.record_for(up, "f" * 40) is None


HISTORY = """
    history:
      - pin: {first}
        date: {d1}
        note: one
        pypi: {{package: p, version: "1", sha256: {sha}, subdir: vendor/x}}
      - pin: {second}
        date: 2026-05-01
        note: two
"""


def _with_history(**kw: str) -> str:
    values = {"first": "a" * 40, "second": "b" * 40, "d1": "2026-04-01", "sha": "c" * 64, **kw}
    text = (ROOT / "engines.yaml").read_text()
    # the ik entry's history block is replaced by the one under test
    head, _, _ = text.partition("    history:\n      - pin: c2b8bca8")
    return head + HISTORY.format(**values).lstrip("\n")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({}, None),
        ({"d1": "2026-06-01"}, "history is listed oldest first"),
        ({"second": "a" * 40}, "history lists a{40} twice"),
        ({"first": "abc1234"}, "not a full 40-character commit SHA"),
        ({"sha": "c" * 63}, "sha256"),
    ],
)
def test_history_schema(tmp_path: Path, change: dict, match: str | None) -> None:
    root = write_root(tmp_path, _with_history(**change))
    if match is None:
        ik = config.load_engines(root)["ik_llama.cpp"]
        assert [h.note for h in ik.history] == ["one", "two"]
        return
    with pytest.raises(LlamaspecError, match=match):
        config.load_engines(root)
