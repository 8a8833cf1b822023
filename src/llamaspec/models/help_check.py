"""A rendered server command checked against the binary's own `--help`, before it runs:
flags the binary does not accept, and spec types it does not offer, each with one refusal
text whoever asked (a recipe, a method, a command line)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from llamaspec.errors import LlamaspecError
from llamaspec.models.dialects import DIALECTS, ServerCommand
from llamaspec.models.server_help import accepted_flags, is_number, spec_type_choices


def check_against_help(cmd: ServerCommand, help_text: str, binary: str) -> None:
    """Refuse a command the binary would reject: unknown flags, or spec types it lacks."""
    known = accepted_flags(help_text)
    d = DIALECTS.get(cmd.dialect)
    if d is not None:
        known |= d.unlisted
    unknown = [a for a in cmd.argv[1:] if a.startswith("-") and a not in known and not is_number(a)]
    if unknown:
        raise LlamaspecError(
            f"{binary} does not accept {', '.join(unknown)} (not in its --help, or marked "
            f"removed there). The {cmd.dialect!r} dialect does not match this build's pin; "
            "rebuild at a pin that has these flags or pass --dialect for this binary."
        )
    lacking, choices = spec_types_lacking(cmd, help_text)
    if lacking:
        raise spec_type_refusal(cmd.dialect, lacking, choices, binary)


def spec_types_lacking(cmd: ServerCommand, help_text: str) -> tuple[list[str], set[str]]:
    """(the spec types `cmd` asks for that the binary's --help does not list, those it
    lists); nothing lacks where the help lists no choices. Upstream's value is a comma list
    of types; ik's later one is one `TYPE:k=v,k=v` stage per flag."""
    choices = spec_type_choices(help_text)
    if choices is None:
        return [], set()
    d = DIALECTS.get(cmd.dialect)
    flag = (d or DIALECTS["upstream"]).flags["spec_type"]
    values = [cmd.argv[i + 1] for i, a in enumerate(cmd.argv[:-1]) if a == flag]
    wanted = [w for v in values for w in ([v.split(":", 1)[0]] if ":" in v else v.split(","))]
    return [w for w in wanted if w not in choices], choices


def spec_type_refusal(
    dialect: str,
    lacking: Sequence[str],
    choices: Collection[str],
    build: str,
    asker: str = "The command",
    own_fix: str = "",
) -> LlamaspecError:
    """The one refusal of spec types a build does not offer, whoever asked (a recipe, a
    method, a command line): what was asked in llamaspec's names and the engine's, what the
    build lists, and what would work (`own_fix`: the asker's own way out)."""
    d = DIALECTS.get(dialect)
    flag = (d or DIALECTS["upstream"]).flags["spec_type"]
    names = d.type_names if d is not None else {}  # llamaspec's name → the engine's
    neutral: dict[str, list[str]] = {}  # engine name → llamaspec's (draft-mtp: mtp, assistant)
    for k, v in names.items():
        neutral.setdefault(v, []).append(k)
    named = ", ".join(
        f"{' or '.join(neutral[w])} ({flag} {w})" if neutral.get(w, [w]) != [w] else w
        for w in lacking
    )
    offered = sorted(
        {k for k, v in names.items() if v in choices}
        | {c for c in choices if c != "none" and c not in neutral}
    )
    later = f" ({d.later})" if d is not None and d.later else ""
    return LlamaspecError(
        f"{asker} asks for spec type {named}, which {build} does not offer: its {flag} "
        f"accepts {', '.join(sorted(choices))}, so it could not draft there as written. What "
        f"would work: a build at a pin that has it{later}; spec types this build offers "
        f"({', '.join(offered) or 'none'}){own_fix}."
    )
