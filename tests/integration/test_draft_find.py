"""`llamaspec draft find` against a local server speaking the Hub's protocol (search, file
listing, range reads), driven through the real CLI and the real `huggingface_hub` client."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_models_hub import Env

from ggufs import vocab, write_gguf
from hubserver import Hub

pytestmark = pytest.mark.integration
TARGET_BYTES = 1 << 20


def _gguf(tmp: Path, name: str, size: int, **kw: object) -> Path:
    kw.setdefault("basename", "testlm")
    tokens = kw.pop("tokens", None) or vocab(300)
    return write_gguf(tmp / name, tokens, payload_bytes=size, **kw)  # type: ignore[arg-type]


def _populate(hub: Hub, tmp: Path) -> None:
    """A target and its family on the hub: two drafts that fit, three the engine refuses,
    one larger than the target and one repo with no GGUF."""
    hub.add("org/testlm-7B-GGUF", "testlm-7b-Q8_0.gguf", _gguf(tmp, "t.gguf", TARGET_BYTES))
    small = _gguf(tmp, "s8.gguf", 1 << 16)
    hub.add("org/testlm-0.5B-GGUF", "testlm-0.5b-Q8_0.gguf", small, downloads=50)
    hub.add("org/testlm-0.5B-GGUF", "testlm-0.5b-Q4_K_M.gguf", _gguf(tmp, "s4.gguf", 1 << 15))
    hub.add("org/testlm-0.5B-GGUF", "mmproj-testlm-f16.gguf", _gguf(tmp, "mm.gguf", 1 << 12))
    hub.add(
        "someone/testlm-DRAFT-0.1B-GGUF",
        "testlm-DRAFT-0.1B-Q4_0.gguf",
        _gguf(tmp, "tiny.gguf", 1 << 12),
        downloads=40,
    )
    hub.add(
        "org/testlm-vocab-0.5B-GGUF",
        "testlm-vocab-Q8_0.gguf",
        _gguf(tmp, "v.gguf", 1 << 16, tokens=vocab(300 + 200)),
        downloads=30,
    )
    hub.add(
        "org/testlm-chat-0.5B-GGUF",
        "testlm-chat-Q8_0.gguf",
        _gguf(tmp, "c.gguf", 1 << 16, bos=3),
        downloads=20,
    )
    hub.add(
        "other/testlm-gpt2ified-GGUF",
        "gpt2ified-Q8_0.gguf",
        _gguf(tmp, "g.gguf", 1 << 16, model="gpt2", arch="gpt2", basename="gpt2"),
        downloads=10,
    )
    hub.add("org/testlm-14B-GGUF", "testlm-14b-Q8_0.gguf", _gguf(tmp, "b.gguf", 2 * TARGET_BYTES))
    readme = tmp / "README.md"
    readme.write_text("no GGUF here\n")
    hub.add("org/testlm-safetensors", "README.md", readme)


@pytest.fixture
def env(tmp_path: Path):
    with Hub() as hub:
        _populate(hub, tmp_path)
        yield Env(tmp_path, hub)


def _rows(out: str) -> list[str]:
    """The table's first line of each row (a wrapped cell continues on lines without #)."""
    return [ln for ln in out.splitlines() if ln.startswith("│ ") and ln.split("│")[1].strip()]


def test_find_ranks_the_family_by_the_engine_rules_from_headers_only(env: Env) -> None:
    proc = env.cli("draft", "find", "org/testlm-7B-GGUF", "--limit", "10")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    rows = _rows(out)
    order = [r.split("│")[2].strip() for r in rows]
    assert order == [
        "org/testlm-0.5B-GGUF/testlm-0.5b-Q8_0.gguf",
        "someone/testlm-DRAFT-0.1B-GGUF/testlm-DRAFT-0.1B-Q4_0.gguf",
        "org/testlm-chat-0.5B-GGUF/testlm-chat-Q8_0.gguf",
        "org/testlm-vocab-0.5B-GGUF/testlm-vocab-Q8_0.gguf",
        "other/testlm-gpt2ified-GGUF/gpt2ified-Q8_0.gguf",
    ], out
    assert "compatible" in rows[0] and "compatible" in rows[1]
    assert "Q4_K_M Q8_0" in rows[0] and "0.062" in rows[0]
    assert "refused: BOS id" in rows[2]
    assert "refused: vocab size" in rows[3] and "difference 200" in rows[3]
    assert "refused: vocab type" in rows[4]
    assert "org/testlm-14B-GGUF (every GGUF as large as the target or larger)" in out
    assert "org/testlm-safetensors (no GGUF file)" in out
    assert "2 compatible" in out
    # headers only: every content request is a range read of the file's first bytes
    gets = env.hub.content_gets()
    assert gets and all(g.range and g.range.startswith("bytes=0-") for g in gets)
    assert env.blobs() == []


def test_find_a_local_target_and_no_compatible_draft_offers_ngram(env: Env, tmp_path: Path) -> None:
    lonely = _gguf(tmp_path, "lonely.gguf", 1 << 20, tokens=vocab(999), basename="testlm-chat")
    proc = env.cli("draft", "find", str(lonely))
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, out + proc.stderr
    assert "0 compatible" in out and "No compatible draft was found" in out
    assert f"llamaspec bench --target {lonely} --spec ngram-mod" in out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("org/nope-GGUF", "Listing the files of org/nope-GGUF: no such repository"),
        ("org/testlm-safetensors", "org/testlm-safetensors on http"),
        ("org/testlm-7B-GGUF:other.gguf", "other.gguf is not in org/testlm-7B-GGUF"),
        ("missing.gguf", "The target missing.gguf is not a file here"),
    ],
)
def test_bad_targets_are_one_paragraph(env: Env, target: str, message: str) -> None:
    proc = env.cli("draft", "find", target)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_unreadable_target_header_and_no_network(env: Env, tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    env.hub.add("org/broken-GGUF", "broken-Q8_0.gguf", bad)
    proc = env.cli("draft", "find", "org/broken-GGUF")
    msg = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "The target's header cannot be read" in msg, msg
    offline = env.cli("draft", "find", "org/testlm-7B-GGUF", HF_ENDPOINT="http://127.0.0.1:9")
    msg = " ".join(offline.stderr.split())
    assert offline.returncode == 2, msg
    assert "could not reach http://127.0.0.1:9" in msg and "needs the network" in msg
    assert "Traceback" not in offline.stderr
