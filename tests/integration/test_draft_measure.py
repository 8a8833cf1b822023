"""`draft find` for the embedded model, then `--measure` end to end: small synthetic Gemma 3
drafts (the embedded tokenizer, tiny random weights) on the local hub, the session's build,
and `verify --recipe` on the recipe it writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from test_draft_find import _rows
from test_models_hub import ROOT, Env

from llamaspec.engine.artifact import Artifact

from ggufs import tiny_gemma, vocab, write_gguf
from hubserver import Hub

pytestmark = pytest.mark.integration
EMBEDDED = "gemma3-270m-q4_k_m"


def populate_gemma(hub: Hub, gemma: Path, tmp: Path) -> None:
    """Gemma-family repos for the embedded target: two drafts the engine accepts, one with
    another BOS id, one with another vocabulary, one of another family."""
    hub.add(
        "test/gemma-3-tiny-draft-GGUF",
        "gemma-3-tiny-draft-F16.gguf",
        tiny_gemma(gemma, tmp / "tiny.gguf", embd=64, layers=1),
        downloads=100,
    )
    hub.add(
        "test/gemma-3-tiny2-draft-GGUF",
        "gemma-3-tiny2-draft-F16.gguf",
        tiny_gemma(gemma, tmp / "tiny2.gguf", embd=32, layers=1, seed=1),
        downloads=90,
    )
    hub.add(
        "test/gemma-3-badbos-GGUF",
        "gemma-3-badbos-F16.gguf",
        tiny_gemma(gemma, tmp / "bos.gguf", embd=32, bos=3, seed=2),
        downloads=80,
    )
    hub.add(
        "test/gemma-3-smallvocab-GGUF",
        "gemma-3-smallvocab-Q8_0.gguf",
        write_gguf(tmp / "v.gguf", vocab(1000), bos=2, eos=1, basename="gemma-3", arch="gemma3"),
        downloads=70,
    )
    hub.add(
        "test/gemma-3-gpt2-GGUF",
        "gemma-3-gpt2-Q8_0.gguf",
        write_gguf(tmp / "g.gguf", vocab(1000), model="gpt2", arch="gpt2", basename="gpt2"),
        downloads=60,
    )


@pytest.fixture
def env(tmp_path: Path, gemma_path: Path):
    with Hub() as hub:
        populate_gemma(hub, gemma_path, tmp_path)
        e = Env(tmp_path, hub)
        e.models[EMBEDDED] = {
            "source": "embedded",
            "file": "gemma-3-270m-q4_k_m.gguf",
            "tokenizer": "gemma3",
            "license": "gemma",
        }
        e.env["LLAMASPEC_CACHE"] = str(gemma_path.parents[1])  # the session's embedded model
        (tmp_path / "config").mkdir()  # a LLAMASPEC_CONFIG_DIR must exist
        e.env["LLAMASPEC_CONFIG_DIR"] = str(tmp_path / "config")
        shutil.copy(ROOT / "engines.yaml", e.root / "engines.yaml")
        shutil.copytree(ROOT / "patches", e.root / "patches")  # verify reads the catalog
        yield e


def test_find_measure_and_verify_for_the_embedded_model(
    env: Env, upstream_artifact: Artifact
) -> None:
    dist = str(upstream_artifact.path.parent)
    found = env.cli("draft", "find", EMBEDDED)
    assert found.returncode == 0, found.stdout + found.stderr
    rows = _rows(found.stdout)
    assert [r.split("│")[2].strip().split("/")[1] for r in rows] == [
        "gemma-3-tiny-draft-GGUF",
        "gemma-3-tiny2-draft-GGUF",
        "gemma-3-badbos-GGUF",
        "gemma-3-smallvocab-GGUF",
        "gemma-3-gpt2-GGUF",
    ], found.stdout
    assert "refused: BOS id" in rows[2] and "refused: vocab size" in rows[3]
    assert "refused: vocab type" in rows[4]

    small = env.cli("draft", "find", EMBEDDED, "--measure", "--memory", "0.3", "--dist", dist)
    msg = " ".join(small.stderr.split())
    assert small.returncode == 2 and "No compatible draft fits in --memory 0.3 GiB" in msg, msg

    # an F32 check and a timed run: 4-9 min on 2 cores, more under load
    proc = env.cli(
        "draft", "find", EMBEDDED, "--measure", "--memory", "4", "--top", "1",
        "--ctx", "2048", "--dist", dist, "--artifact", upstream_artifact.id,
        "--reports", str(env.root / "reports"), timeout=1200,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    recipe_path = env.root.parent / "config" / "recipes" / f"{EMBEDDED}-draft.yaml"
    assert f"wrote {recipe_path}" in " ".join(out.split())
    recipe = yaml.safe_load(recipe_path.read_text())
    assert recipe["pair"] == f"{EMBEDDED}-draft" and recipe["spec"]["types"] == ["draft"]
    assert "tok/s" in recipe["measured"]["result"] and recipe["measured"]["artifact"]
    mine = yaml.safe_load((env.root.parent / "config" / "models.yaml").read_text())
    assert mine["pairs"][f"{EMBEDDED}-draft"]["target"] == EMBEDDED

    # the recipe it wrote passes verify (oracle tier, the built-in prompts, its own flags)
    verified = env.cli(
        "verify", "--recipe", f"{EMBEDDED}-draft", "--dist", dist,
        "--artifact", upstream_artifact.id, "--reports", str(env.root / "reports"),
        timeout=1200,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
