"""Damaged or mistyped user files and directories: one paragraph, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaspec.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return " ".join(out.err.split())


@pytest.mark.parametrize("key", ["models", "pairs"])
def test_a_user_models_yaml_with_a_list_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], key: str
) -> None:
    (tmp_path / "models.yaml").write_text(f"{key}:\n  - a\n  - b\n")
    monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(tmp_path))
    err = _run(capsys, "models", "list")
    assert f"`{key}:` must be a mapping of names to entries" in err and "not a list" in err


@pytest.mark.parametrize("text", ["{bad", "[1, 2]", "\xff\xfe"])
def test_a_damaged_artifact_manifest_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "manifest.json").write_bytes(text.encode("latin-1"))
    for argv in (["--artifact", "x"], []):  # named, and found as the newest
        err = _run(capsys, "smoke", "--dist", str(tmp_path), *argv)
        assert f"{tmp_path / 'x' / 'manifest.json'}" in err and "build it again" in err


def test_a_config_dir_that_does_not_exist_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(tmp_path / "nope"))
    err = _run(capsys, "recipe", "list")
    assert f"LLAMASPEC_CONFIG_DIR is '{tmp_path / 'nope'}', which does not exist" in err
    assert not (tmp_path / "nope").exists()
