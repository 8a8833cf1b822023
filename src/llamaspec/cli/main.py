"""The `llamaspec` command line; the noxfile calls the same entry points."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from llamaspec import __version__, env
from llamaspec.cli import bench as cli_bench
from llamaspec.cli import build as cli_build
from llamaspec.cli import docker as cli_docker
from llamaspec.cli import doctor as cli_doctor
from llamaspec.cli import draft as cli_draft
from llamaspec.cli import examples, hostile, options
from llamaspec.cli import gpu as cli_gpu
from llamaspec.cli import health as cli_health
from llamaspec.cli import limit as cli_limit
from llamaspec.cli import load as cli_load
from llamaspec.cli import models as cli_models
from llamaspec.cli import patches as cli_patches
from llamaspec.cli import rpc as cli_rpc
from llamaspec.cli import verify as cli_verify
from llamaspec.errors import LlamaspecError

# What maintainers of llamaspec (not its users) run: left out of the top-level command
# list, listed after it, and also reachable as `llamaspec maint COMMAND`.
MAINTAINER = (
    "lock",
    "bump",
    "patches",
    "bench-build",
    "bench-reproducible",
    "bench-portable",
    "cuda-compile-check",
    "gpu-acceptance",
    "health",
    "oracle-power",
)
LOG_WIDTH = 200  # the width of tables written to a file or pipe
MAINT_HELP = (
    "maintainer commands (also as `llamaspec maint COMMAND`; each has --help): "
    + ", ".join(MAINTAINER)
    + "; and under docker: build-stage, matrix, bake, base, push."
)


def make_parser() -> argparse.ArgumentParser:
    """The whole command line; building it imports no stage module.

    Every command's parser sets `handler`, the function `main` calls with the parsed
    arguments and the console (`set_defaults(handler=...)`)."""
    parser = argparse.ArgumentParser(
        prog="llamaspec",
        description="Build, check and run llama-server with speculative decoding.",
        epilog=MAINT_HELP,
    )
    parser.add_argument("--version", action="version", version=f"llamaspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    cli_build.add_parsers(sub)
    cli_verify.add_parsers(sub)
    cli_bench.add_parsers(sub)
    cli_limit.add_parsers(sub)
    cli_load.add_parsers(sub)
    cli_patches.add_parsers(sub)
    cli_models.add_parsers(sub)
    cli_draft.add_parsers(sub)
    cli_docker.add_parsers(sub)
    cli_doctor.add_parsers(sub)
    cli_gpu.add_parsers(sub)
    cli_health.add_parsers(sub)
    cli_rpc.add_parsers(sub)
    examples.attach(parser)
    # users' commands only in the list; maintainers' still parse (and are in the epilog)
    sub._choices_actions = [a for a in sub._choices_actions if a.dest not in MAINTAINER]
    return parser


def _maint(argv: Sequence[str] | None) -> list[str] | None:
    """`llamaspec maint COMMAND ...` → `llamaspec COMMAND ...` for a maintainer command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "maint":
        return argv
    if len(argv) > 1 and argv[1] in MAINTAINER:
        return argv[1:]
    if argv[1:] in (["-h"], ["--help"]):
        print(f"usage: llamaspec maint COMMAND [...]\n\n{MAINT_HELP}", file=sys.stderr)
        raise SystemExit(0)
    given = f"{argv[1]!r} is not a maintainer command" if argv[1:] else "a command is required"
    print(
        "usage: llamaspec maint COMMAND [...]\nllamaspec maint: error: "
        f"{given}; give one of {', '.join(MAINTAINER)} (users' commands, such as "
        "`llamaspec serve`, run without `maint`; `llamaspec maint --help` lists them).",
        file=sys.stderr,
    )
    raise SystemExit(2)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed command line; exit 2 with one paragraph for what no option takes
    (cli/hostile.py) or what a command's parser refuses."""
    parser, given = make_parser(), _maint(argv) or []
    hostile.check_argv(parser, given)
    args = parser.parse_args(given)
    hostile.check_values(parser, args, given)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    # stage modules load here, after parsing: `llamaspec --help` stays fast
    from rich.console import Console
    from rich.markup import escape

    from llamaspec import procs

    procs.install_signal_handlers()
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = LOG_WIDTH  # a log keeps whole tables (rich assumes 80 columns)
    try:
        env.check()  # a variable set to what its kind rules out: refused before any work
        options.settle_patch_source(args)
        args.handler(args, console)  # each command parser sets its handler
    except LlamaspecError as exc:
        # soft wrap: the terminal wraps the paragraph; paths and commands stay whole to copy
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        return 2
    except KeyboardInterrupt as exc:
        from llamaspec import procs

        Console(stderr=True).print("interrupted; caches were left consistent")
        return procs.exit_status(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
