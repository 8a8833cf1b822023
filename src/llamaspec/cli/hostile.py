"""Values no option of any command takes, refused for the whole command tree at once.

A control character (a line break, NUL, escape, a direction override) in any argument
would end up in the commands, reports and YAML files llamaspec writes, and no argument runs
past env.LONGEST characters; a number that is not finite, or beyond a
32-bit integer, is no count, size or time any option means. Checking the parsed values
here, rather than in each option's type, keeps a new command's options covered without a
list to maintain (tests/unit/test_generated_sweep.py walks the tree to prove it).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator, Sequence

from llamaspec import env

CONTROL = re.compile(f"[\x00-\x08\x0a-\x1f{env.UNSEEN}]")  # a tab is no harm
LARGEST = 2**31 - 1  # no count llamaspec passes on (to llama-server or to a loop) is larger


def check_argv(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Refuse (exit 2, one paragraph) an argument that holds a control character or is
    longer than any path, name or value llamaspec takes."""
    for i, arg in enumerate(argv, start=1):
        if len(arg) > env.LONGEST:
            parser.error(
                f"argument {i} ({arg[:40]!r}…) runs to {len(arg):,} characters, more than the "
                f"{env.LONGEST:,} any llamaspec option or name takes. Shorten it (a long text "
                "goes in a file, where an option reads one)."
            )
        if CONTROL.search(arg):
            parser.error(
                f"argument {i} ({arg!r}) holds a control character (a line break, NUL, a "
                "direction override or the like). No llamaspec option or name takes one: it "
                "would end up in the commands, reports and files llamaspec writes. Retype the "
                "value, or rename the file or folder it names."
            )


def _actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        else:
            yield action


def _unlike_any(value: object) -> str | None:
    """Why `value` is no number an option means, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    if isinstance(value, int) and abs(value) > LARGEST:
        return f"is beyond {LARGEST:,}, more than any count or size llamaspec passes on"
    return None


def check_values(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> None:
    """Refuse (exit 2, one paragraph) a parsed number that is not finite or is beyond a
    32-bit integer (no option's default is one: tests/unit/test_generated_sweep.py)."""
    for dest, value in vars(args).items():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            why = _unlike_any(item)
            if why is None:
                continue
            # only on the way to the refusal: the tree is walked for the option's spelling
            flags = [f for a in _actions(parser) if a.dest == dest for f in a.option_strings]
            given = [f for f in flags if any(x == f or x.startswith(f"{f}=") for x in argv)]
            flag = given[0] if given else f"--{dest.replace('_', '-')}"
            parser.error(
                f"{flag} {item!r} {why}. Give a value in the range `--help` states for it."
            )
