"""What the commands that run a built artifact (verify, bench, tune, bench-build) share:
`--artifact`/`--dist`, declared once, the artifact they name, and the argparse types for a
count, a port, a host, an rpc host, a time limit (the network ones read by netaddr, as the
engine reads them), a number of minutes, a folder to write into and a file to read.

Imported by parsers, so it stays light: the build module loads inside `load_artifact`."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from llamaspec.cli import options
from llamaspec.paths import default_out

if TYPE_CHECKING:
    from llamaspec.engine.artifact import Artifact


def add_artifact_args(p: argparse.ArgumentParser, default: str = "the newest there") -> None:
    """`--artifact ID` (or a prefix) in `--dist DIR`, declared once for every command;
    `default` says which artifact the command takes without one."""
    p.add_argument(
        "--artifact",
        type=artifact_id,
        metavar="ID",
        help=f"a built artifact's id (or a unique prefix) in --dist; default: {default}",
    )
    add_dist(p)


def add_dist(p: argparse.ArgumentParser) -> None:
    """`--dist DIR`: where built artifacts are (the build options' own declaration)."""
    options.add(p, "dist")


REPORTS_HELP = "where {what} (default: reports/)"


def add_reports(p: argparse.ArgumentParser, what: str = "the report goes") -> None:
    """`--reports DIR`: the folder the command writes into (`what`: what goes there),
    checked writable before any work."""
    p.add_argument(
        "--reports",
        type=out_dir,
        default=default_out("reports"),
        metavar="DIR",
        help=REPORTS_HELP.format(what=what),
    )


MAX_SLOTS = 256


def add_slots(p: argparse.ArgumentParser, default: str) -> None:
    """`--slots N` and `--cache-ram MIB`: how many requests a server serves at once and how
    much host memory its prompt cache may take (`default` says what holds without them)."""
    p.add_argument(
        "--slots",
        type=whole(1, MAX_SLOTS, "slots"),
        metavar="N",
        help=f"server slots, requests served at once (default: {default})",
    )
    p.add_argument(
        "--cache-ram",
        type=whole(0, 1 << 20, "MiB"),
        metavar="MIB",
        help="host memory for the prompt cache in MiB, 0 to turn it off (default: the "
        "recipe's, else the server's own: 8192 at the upstream pin)",
    )


def add_busy_max(p: argparse.ArgumentParser, default: str) -> None:
    """`--spec-busy-max N`: the server drafts only while at most N slots are busy
    (`default` says what holds without it)."""
    p.add_argument(
        "--spec-busy-max",
        type=whole(0, MAX_SLOTS, "slots"),
        metavar="N",
        help="draft only while at most N slots are busy, plain decoding above (0: no limit; "
        f"default: {default}; needs llamaspec's default llama.cpp build)",
    )


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


def counts(low: int, high: int):
    """argparse type: a comma-separated list of whole numbers from `low` to `high`, e.g. 4,8
    (each once, in the order given)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(v) for v in text.split(","))
        except ValueError:
            values = ()
        if not values or any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of whole numbers from {low} to "
                f"{high}, e.g. 4,8"
            )
        return tuple(dict.fromkeys(values))

    parse.__name__ = "count list"
    return parse


def whole(low: int, high: int, what: str):
    """argparse type: a whole number of `what` from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of {what} from {low} to {high}"
            )
        return value

    parse.__name__ = what
    return parse


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


def quantity(what: str, zero: bool = False):
    """argparse type: a finite number above 0 (or at least 0 with `zero`) of `what`."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value >= 0 if zero else value > 0) or not math.isfinite(value):
            least = "0 or more" if zero else "above 0"
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of {what} {least}")
        return value

    return parse


def artifact_id(text: str) -> str:
    """argparse type for --artifact: not empty (an empty id is not "the newest")."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "must not be empty; give an artifact id (or a prefix of one) from dist/, or leave "
            "--artifact out for the newest"
        )
    return text


def minutes(text: str) -> float:
    """argparse type: a finite number of minutes above 0 (nan and inf are refused like 0)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of minutes above 0")
    return value


def out_dir(text: str) -> Path:
    """argparse type for a folder llamaspec writes into (--reports, --out): not empty, not a
    file, not under one, and writable: a folder made and removed at once in it (or, when it
    is missing, in the nearest folder above it that exists) shows that the command can make
    and fill it. It is not created here: a refused command leaves nothing."""
    path = options.checked_path(text, "some-dir", "give a folder to write into (made if missing)")
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        probe = tempfile.mkdtemp(prefix=".llamaspec-probe-", dir=existing)
    except OSError as exc:
        made = "written" if existing == path.absolute() else f"made (in {existing})"
        raise argparse.ArgumentTypeError(
            f"{text} cannot be {made}: {exc.strerror or exc}; give a folder you can write to "
            "(made if missing)"
        ) from None
    os.rmdir(probe)
    return path


def existing_file(text: str) -> Path:
    """argparse type for a file llamaspec reads (a GGUF): it must exist and be a file."""
    return options.checked_path(text, "file", "give the path of a file")


def existing_dir(text: str) -> Path:
    """argparse type for a folder llamaspec reads: it must exist and be a folder."""
    return options.checked_path(text, "dir", "give the path of a folder")


def some_dir(text: str) -> Path:
    """argparse type for a folder a command reads, or makes, when it runs (--dist,
    --source-dir): a folder or a path one can be made at, never a file, a path under one or a
    kernel filesystem. Whether it must exist, and hold what, is the command's to say."""
    return options.checked_path(text, "some-dir", "give the path of a folder")


def some_file(text: str) -> Path:
    """argparse type for a file a command reads, or writes, when it runs (--target, a
    record): a file or a path one can be made at, never a folder, a path under a file or a
    kernel filesystem."""
    return options.checked_path(text, "some-file", "give the path of a file")


def out_file(text: str) -> Path:
    """argparse type for a file llamaspec writes (a JSON record): not empty, not a folder,
    and in a folder it can write into."""
    path = options.checked_path(text, "some-file", "give the path of a file to write")
    try:
        out_dir(str(path.parent))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{text}: its folder {exc}") from None
    return path
