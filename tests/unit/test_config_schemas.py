"""The committed JSON Schemas (docs/reference/schemas/) are what the pydantic models give,
and they describe the files as llamaspec reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from llamaspec.config import schemas, user

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_schemas_are_what_the_models_give() -> None:
    stale = schemas.stale(ROOT)
    assert not stale, (
        f"{', '.join(stale)} differ from the pydantic models in src/llamaspec/config/: "
        f"regenerate them with {schemas.REGENERATE} and commit the result"
    )
    assert sorted(p.name for p in (ROOT / schemas.DIR).glob("*.schema.json")) == [
        "models.schema.json",
        "recipe.schema.json",
        "user-config.schema.json",
    ]


def test_a_stale_missing_or_extra_schema_is_found_and_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "docs").mkdir()
    assert schemas.main(["--root", str(tmp_path)]) == 0
    assert schemas.stale(tmp_path) == [] and schemas.main(["--check", "--root", str(tmp_path)]) == 0
    where = tmp_path / schemas.DIR
    recipe = where / "recipe.schema.json"
    recipe.write_text(recipe.read_text().replace('"draft_n_max"', '"draft_max"'))
    (where / "models.schema.json").unlink()
    (where / "old.schema.json").write_text("{}\n")
    expected = [f"{schemas.DIR}/{n}" for n in ("recipe", "models", "old")]
    assert schemas.stale(tmp_path) == [f"{e}.schema.json" for e in expected]
    capsys.readouterr()
    assert schemas.main(["--check", "--root", str(tmp_path)]) == 1
    said = capsys.readouterr().err
    assert "recipe.schema.json differs" in said and "nox -s schemas" in said
    assert schemas.write(tmp_path) == [f"{e}.schema.json" for e in expected]
    assert schemas.stale(tmp_path) == [] and not (where / "old.schema.json").exists()
    assert schemas.main(["--root", str(tmp_path / "nowhere")]) == 2


def test_the_user_config_schema_accepts_the_documented_example_and_what_llamaspec_does(
    tmp_path: Path,
) -> None:
    schema = json.loads((ROOT / schemas.DIR / "user-config.schema.json").read_text())
    page = (ROOT / "docs" / "reference" / "user-config.md").read_text()
    example = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", page, re.S)[0])
    assert example["defines"] == {"GGML_NATIVE": True}  # YAML's ON, a CMake ON to llamaspec
    jsonschema.validate(example, schema)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(example))
    assert user.load(path)[0].defines == {"GGML_NATIVE": "ON"}
    for bad in ({"jobs": 0}, {"jobs": True}, {"job": 8}, {"backends": {"rocm": {}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
