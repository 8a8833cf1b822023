"""What the commands that run a built artifact (verify, bench, tune, bench-build) share:
`--artifact`/`--dist`, declared once, the artifact they name, and the argparse type for a
count.

Imported by parsers, so it stays light: the build module loads inside `load_artifact`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.paths import default_out

if TYPE_CHECKING:
    from llamaspec.engine.artifact import Artifact


def add_artifact_args(p: argparse.ArgumentParser) -> None:
    """`--artifact ID` (or a prefix) in `--dist DIR`; the newest one there by default."""
    p.add_argument("--artifact", help="artifact id (or prefix); default: newest in dist/")
    p.add_argument("--dist", type=Path, default=default_out("dist"))


def load_artifact(args: argparse.Namespace) -> Artifact:
    """The artifact `--artifact` names in `--dist`, else the newest one there."""
    from llamaspec.engine.artifact import load_artifact, newest_artifact

    return load_artifact(args.dist, args.artifact or newest_artifact(args.dist))


def positive(text: str) -> int:
    """argparse type: a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return value
