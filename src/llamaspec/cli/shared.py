"""What the commands that run a built artifact (verify, bench, tune, bench-build) share:
`--artifact`/`--dist`, declared once, the artifact they name, and the argparse types for a
count, a port, a host, an rpc host and a time limit (the network ones read by netaddr, as
the engine reads them).

Imported by parsers, so it stays light: the build module loads inside `load_artifact`."""

from __future__ import annotations

import argparse
import math
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


def _checked(check, text: str):
    """Run a netaddr check as an argparse type: its refusal becomes argparse's message."""
    from llamaspec.netaddr import AddressError

    try:
        return check(text)
    except AddressError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port(text: str) -> int:
    """argparse type: a TCP port, 1-65535 (a larger one would wrap in the engine)."""
    from llamaspec.netaddr import parse_port

    return _checked(lambda t: parse_port(t, "port"), text)


def host(text: str) -> str:
    """argparse type: an address or host name the engine reads as written (no whitespace,
    no short or octal IPv4 forms such as `0` or `010.0.0.1`)."""
    from llamaspec.netaddr import check_host

    return _checked(lambda t: check_host(t, "host"), text)


def rpc_endpoint(text: str) -> str:
    """argparse type: an rpc host, HOST:PORT, as llama.cpp's RPC client reads it."""
    from llamaspec.netaddr import check_rpc_endpoint

    return _checked(check_rpc_endpoint, text)


def seconds(text: str) -> float:
    """argparse type: a time limit, a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value
