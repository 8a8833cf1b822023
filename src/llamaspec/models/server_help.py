"""A built llama-server's own `--help`, read: the truth about what that binary accepts.

`server_help` runs `--help`; the readers take its text: every flag it mentions
(`help_flags`), the flags it accepts (`accepted_flags`: those it lists, minus those it
marks removed), and the values `--spec-type` lists (`spec_type_choices`). `check_help`
refuses argv with a flag the binary lacks. Engine flag spellings are not here: dialects
(which spells them) checks rendered commands and tells a binary's dialect with these
readers, and methods learns from them which methods a build offers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from llamaspec.errors import LlamaspecError

_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def help_flags(help_text: str) -> set[str]:
    """Every flag spelling mentioned in a binary's `--help` output."""
    return set(_FLAG.findall(help_text))


_REMOVED = re.compile(r"has been removed|is deprecated and has no effect", re.I)


def accepted_flags(help_text: str) -> set[str]:
    """Flags a binary accepts: those in its --help, minus those it says were removed."""
    accepted: set[str] = set()
    entry: list[str] = []

    def flush() -> None:
        if entry and not _REMOVED.search(" ".join(entry)):
            for segment in re.split(r"\s{2,}", entry[0].strip()):
                if not segment.startswith("-"):
                    break  # the description starts here
                accepted.update(help_flags(segment))
        entry.clear()

    for line in help_text.splitlines():
        if line.lstrip().startswith("-") and not line.startswith(" " * 10):
            flush()
        entry.append(line)
    flush()
    return accepted


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


DIALECT_FIX = (
    "The recipe's dialect does not match this build's pin; pick the dialect the binary speaks."
)


def check_help(argv: Sequence[str], help_text: str, binary: str, fix: str = DIALECT_FIX) -> None:
    """Refuse flags the binary's own `--help` does not list (values are not checked);
    `fix` says what to do about it."""
    known = accepted_flags(help_text)
    unknown = [a for a in argv if a.startswith("-") and not is_number(a) and a not in known]
    if unknown:
        raise LlamaspecError(
            f"{binary} does not accept {', '.join(unknown)} (not in its --help). {fix}"
        )


_SPEC_LIST = re.compile(r"--spec-type\s+([a-z0-9-]+(?:,[a-z0-9-]+)+)")
_SPEC_BRACKET = re.compile(r"--spec-type\s+\w+\s*\[([^\]]*\|[^\]]*)\]")
# ik_llama.cpp after its PR #1908: `--spec-type SPEC[:k=v,...]`, the names on a `types:` line
# of its description
_SPEC_TYPES_LINE = re.compile(
    r"--spec-type\s+SPEC\b[^\n]*\n(?:[^\n]*\n){0,3}?\s*types:\s*([a-z0-9-]+(?:,\s*[a-z0-9-]+)+)"
)


def spec_type_choices(help_text: str) -> set[str] | None:
    """The values `--spec-type` lists in a --help (None when not listed): upstream's comma
    list, ik_llama.cpp's `[none | ngram - cache | …]` (spaced around its hyphens), or its
    later `types: none, draft, …` line."""
    m = _SPEC_LIST.search(help_text)
    if m:
        return set(m.group(1).split(","))
    m = _SPEC_TYPES_LINE.search(help_text)
    if m:
        return {v.strip() for v in m.group(1).split(",")}
    m = _SPEC_BRACKET.search(help_text)
    if m:
        return {re.sub(r"\s*-\s*", "-", v.strip()) for v in m.group(1).split("|") if v.strip()}
    return None


_READ: dict[tuple[str, int, int, int], str] = {}  # (path, inode, size, mtime) → --help


def server_help(server_bin: Path) -> str:
    """The binary's own --help: the truth about which flags it accepts.

    Read once per binary per process: the text is kept against the file's inode, size and
    modification time, so a command that renders, checks and runs one artifact asks it once
    (a rebuilt or replaced binary is asked again).

    Output that names no `--model` is not a usage text: the binary did not run (a missing
    library, or a container runtime's transient failure when `server_bin` wraps one). That
    is tried once more, then refused with what the binary printed."""
    try:
        st = server_bin.stat()
        key: tuple[str, int, int, int] | None = (
            str(server_bin.resolve()),
            st.st_ino,
            st.st_size,
            st.st_mtime_ns,
        )
    except OSError:
        key = None  # not there: let the run say so
    if key is not None and key in _READ:
        return _READ[key]
    text = _run_help(server_bin)
    if key is not None:
        _READ[key] = text
    return text


def _run_help(server_bin: Path) -> str:
    from llamaspec import procs

    for _ in range(2):
        proc = procs.run(
            [str(server_bin), "--help"], timeout=60, check=False, what=f"{server_bin.name} --help"
        )
        text = proc.stdout + proc.stderr
        if "--model" in help_flags(text):
            return text
    tail = " / ".join(text.strip().splitlines()[-3:]) or "nothing"
    raise LlamaspecError(
        f"`{server_bin} --help` printed no usage text (exit status {proc.returncode}, twice); "
        f"it ends: {tail}. The binary cannot run here: run it by hand to see why (a missing "
        "shared library, or a container tool that failed), fix that, and try again."
    )
