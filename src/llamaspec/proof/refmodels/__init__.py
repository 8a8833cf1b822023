"""Random-weight reference models for the speculation types no download gives here.

Each family module (mtp, eagle3, gemma4, dflash, ...) writes an F32 target and, where the
type reads one, its draft, with the `gguf` package into the llamaspec cache, and returns a
`RefPair`: what verify serves and which speculation types the pair exercises. Files are
written once per (family, VERSION, seed) through `cached`, atomically.
`common` holds what the families share: the character-level vocabulary and its tokenizer
keys, the dense and norm weight draws, the writer's last steps.

May import: the base modules, llamaspec.engine, llamaspec.models and llamaspec.runtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llamaspec.paths import cache_dir

Say = Callable[[str], None]


@dataclass(frozen=True)
class RefPair:
    """A reference target and the draft a speculation type reads (None: the target's own
    heads draft, as with MTP)."""

    name: str  # `verify --model NAME`
    target: Path
    draft: Path | None
    spec_types: tuple[str, ...]  # llamaspec spec type names (config.SPEC_TYPES)
    engine: str = "llama.cpp"  # the engine whose pinned loader takes the files
    how: str = ""  # how the files are made, one paragraph (the report quotes it)


def cached(
    family: str,
    version: int,
    seed: int,
    filename: str,
    write: Callable[[Path], None],
    say: Say | None = None,
) -> Path:
    """`filename` for (family, version, seed) in the cache, written by `write(tmp)` once and
    moved into place atomically (never a half-written model)."""
    out = cache_dir() / "models" / f"ref-{family}-v{version}-seed{seed}"
    path = out / filename
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".tmp-{os.getpid()}-{filename}"
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if say:
        say(f"reference: wrote {path.name} ({path.stat().st_size / 1e6:.1f} MB, seed {seed})")
    return path
