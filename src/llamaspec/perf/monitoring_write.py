"""Writing what `recipe monitor` rendered: `--out DIR` checked and made, every file written
atomically (perf/monitoring.py renders them)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from llamaspec.errors import LlamaspecError


def out_dir(out: Path) -> Path:
    """`--out DIR` as a directory to write into, created if missing; one paragraph if not."""
    if out.exists() and not out.is_dir():
        raise LlamaspecError(
            f"--out {out} is a file, not a directory: give a directory for the rendered rules, "
            "dashboard and scrape config (it is created if missing)."
        )
    parent = next((p for p in (out, *out.parents) if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise LlamaspecError(f"--out {out} lies under {parent}, which is a file, not a directory.")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise LlamaspecError(
            f"--out {out} cannot be written: {parent} is not writable by this user. Give a "
            "directory you can write to."
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LlamaspecError(
            f"--out {out} cannot be created ({exc.strerror or exc}). Give a directory you can "
            "write to."
        ) from None
    return out


def write_files(files: Mapping[str, str], out: Path) -> list[Path]:
    """Every file (name → text) into `out`, each one atomically (a temporary file in `out`,
    then renamed over the old one)."""
    out = out_dir(out)
    written = []
    for name, text in files.items():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, out / name)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise LlamaspecError(f"Cannot write {out / name}: {exc.strerror or exc}.") from None
        written.append(out / name)
    return written
