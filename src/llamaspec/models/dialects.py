"""Speculative-decoding CLI dialects: engine-neutral settings → argv for one engine and pin.

The engines spell speculative flags differently, and so do different pins of one engine.
The truth for a given binary is its own `--help`, which `check_help` compares against.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from llamaspec import config
from llamaspec.engine.build import Artifact
from llamaspec.errors import LlamaspecError, choose

Method = Literal["draft", "ngram-simple", "ngram-map-k", "ngram-mod", "mtp"]


@dataclass(frozen=True)
class SpecSettings:
    """What speculation a run wants, independent of any engine's flag spelling."""

    method: Method
    draft_model: Path | None = None
    n_max: int = 8
    n_min: int = 0
    p_min: float | None = None
    draft_ngl: int | None = None


def spec_args(dialect: str, s: SpecSettings) -> list[str]:
    """Render `s` for `dialect`; raise when the dialect cannot express it."""
    if s.method == "draft" and s.draft_model is None:
        raise LlamaspecError("Speculation with a draft model needs a draft model path.")
    if dialect == "upstream":
        types = {"draft": "draft-simple", "mtp": "draft-mtp"}.get(s.method, s.method)
        out = ["--spec-type", types]
        if s.method == "draft":
            out += ["--spec-draft-model", str(s.draft_model)]
        if s.method in ("draft", "mtp"):
            out += ["--spec-draft-n-max", str(s.n_max), "--spec-draft-n-min", str(s.n_min)]
            if s.p_min is not None:
                out += ["--spec-draft-p-min", str(s.p_min)]
        if s.draft_ngl is not None and s.method == "draft":
            out += ["--spec-draft-ngl", str(s.draft_ngl)]
        return out
    if dialect in ("upstream-legacy", "ik-legacy"):
        if s.method == "mtp":
            raise LlamaspecError(f"The {dialect} dialect has no MTP speculation; use a newer pin.")
        if s.method != "draft":
            return ["--spec-type", s.method]
        out = ["-md", str(s.draft_model), "--draft-max", str(s.n_max), "--draft-min", str(s.n_min)]
        if s.p_min is not None:
            out += ["--draft-p-min", str(s.p_min)]
        if s.draft_ngl is not None:
            out += ["-ngld", str(s.draft_ngl)]
        return out
    if dialect == "ik-spec-type":
        out = []
        if s.method == "draft":
            out += ["-md", str(s.draft_model)]
            if s.draft_ngl is not None:
                out += ["-ngld", str(s.draft_ngl)]
        name = {"draft": "draft"}.get(s.method, s.method)
        params = [f"n_max={s.n_max}", f"n_min={s.n_min}"]
        if s.p_min is not None:
            params.append(f"p_min={s.p_min}")
        return [*out, "--spec-type", f"{name}:{','.join(params)}"]
    raise LlamaspecError(f"Unknown speculative CLI dialect {dialect!r}.")


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


def check_help(argv: Sequence[str], help_text: str, binary: str) -> None:
    """Refuse flags the binary's own `--help` does not list (values are not checked)."""
    known = accepted_flags(help_text)
    unknown = [a for a in argv if a.startswith("-") and not is_number(a) and a not in known]
    if unknown:
        raise LlamaspecError(
            f"{binary} does not accept {', '.join(unknown)} (not in its --help). The recipe's "
            "dialect does not match this build's pin; pick the dialect the binary speaks."
        )


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def probe_dialect(engine: str, help_text: str) -> str:
    """Tell the speculative dialect from a binary's --help (for pins engines.yaml lacks)."""
    flags = help_flags(help_text)
    if engine == "llama.cpp":
        return "upstream" if "--spec-draft-n-max" in flags else "upstream-legacy"
    return "ik-legacy" if "--draft-max" in flags else "ik-spec-type"


def server_help(server_bin: Path) -> str:
    """The binary's own --help: the truth about which flags it accepts."""
    import subprocess

    proc = subprocess.run(
        [str(server_bin), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.stdout + proc.stderr


def dialect_for(artifact: Artifact, say=None, root: Path | None = None) -> str:
    """The engine's recorded dialect at its default pin; otherwise probe the binary's --help."""
    engines = config.load_engines(root)
    engine = engines[choose("engine", artifact.manifest["engine"], engines)]
    if artifact.manifest.get("commit") == engine.pin:
        return engine.dialect
    dialect = probe_dialect(engine.name, server_help(artifact.server))
    if say is not None:
        say(
            f"dialect: {engine.name}@{(artifact.manifest.get('commit') or 'local')[:12]} is not "
            f"the default pin; its --help speaks the {dialect!r} dialect"
        )
    return dialect
