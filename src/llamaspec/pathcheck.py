"""Why a path cannot serve as the folder or file it is given for, or None: one rule for the
command line's path options (cli/shared.py) and the environment's path variables (env.py).

A base module: it imports nothing of llamaspec's."""

from __future__ import annotations

import os
from pathlib import Path

KERNEL = ("/proc", "/sys", "/dev")  # kernel filesystems: nothing llamaspec keeps lives there

# what the path must be: a folder or a file, that exists ("dir", "file"), that may be made
# ("some-dir", "some-file"), or a folder this user can write into ("writable-dir")
KINDS = ("dir", "file", "some-dir", "some-file", "writable-dir")


def why_not(path: Path, kind: str) -> str | None:
    """What is wrong with `path` as a `kind` (a phrase after the path), or None."""
    absolute = Path(os.path.abspath(path))
    if any(absolute.is_relative_to(k) for k in KERNEL):
        return "is under a kernel filesystem (/proc, /sys, /dev), where llamaspec keeps nothing"
    folder = kind.endswith("dir")
    if path.exists():
        if folder and not path.is_dir():
            return "is a file, not a folder"
        if not folder and path.is_dir():
            return "is a folder, not a file"
        if kind == "writable-dir" and not os.access(path, os.W_OK | os.X_OK):
            return "is a folder this user cannot write into"
        return None
    if kind in ("dir", "file"):
        return "does not exist"
    above = next((p for p in absolute.parents if p.exists()), None)
    if above is None or not above.is_dir():
        return f"cannot be made: it is under the file {above}"
    return None
