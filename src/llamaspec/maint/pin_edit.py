"""Pin edit: move an engine's pin in engines.yaml and llamaspec.lock for a bump's plan.

Both files are edited as text (comments and layout stay), the engines.yaml edit is checked by
parsing it back, and each file is replaced atomically.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path

import yaml

from llamaspec import config
from llamaspec import lock as lockfile
from llamaspec.config import Engine
from llamaspec.errors import LlamaspecError
from llamaspec.maint.bump import Plan


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)


def _scalar(value: object) -> str:
    """A YAML scalar for engines.yaml: plain where YAML reads it back as the same text."""
    if isinstance(value, dt.date):
        return value.isoformat()
    text = str(value)
    if isinstance(value, int):
        return text
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@+/-]*", text) and yaml.safe_load(text) == text:
        return text
    return json.dumps(text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _significant(line: str) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#")


def edit_engines_text(text: str, name: str, new: Engine) -> str:
    """engines.yaml with `name`'s pin, tag, pin_date, build_number and dialect set to `new`'s,
    and its `pypi` block removed when `new` has none; every other line is left as it was."""
    lines = text.splitlines(keepends=True)
    start = next(
        (
            i
            for i, ln in enumerate(lines)
            if re.match(rf"^\s+['\"]?{re.escape(name)}['\"]?:\s*(#.*)?$", ln)
        ),
        None,
    )
    if start is None:
        raise LlamaspecError(f"engines.yaml has no entry for {name}; nothing to bump.")
    own = _indent(lines[start])
    end = start + 1
    while end < len(lines) and (not _significant(lines[end]) or _indent(lines[end]) > own):
        end += 1
    while end > start + 1 and not _significant(lines[end - 1]):
        end -= 1  # trailing blank lines and comments belong to what follows
    block = lines[start + 1 : end]
    child = min((_indent(ln) for ln in block if _significant(ln)), default=own + 2)
    values = {
        "pin": new.pin,
        "tag": new.tag,
        "pin_date": new.pin_date,
        "build_number": new.build_number,
        "dialect": new.dialect,
    }
    has_number = any(ln.startswith(f"{' ' * child}build_number:") for ln in block)
    out: list[str] = []
    skip_deeper = False
    for ln in block:
        if skip_deeper:
            if not _significant(ln) or _indent(ln) > child:
                continue
            skip_deeper = False
        m = re.match(rf"^( {{{child}}})([A-Za-z_]+):([ \t]*)([^#\n]*?)([ \t]*#[^\n]*)?(\n?)$", ln)
        key = m.group(2) if m else None
        if key == "pypi" and new.pypi is None:
            skip_deeper = True
            continue
        if m and key in values:
            value = values.pop(key)
            if value is None:
                continue
            gap, comment = m.group(3) or " ", m.group(5) or ""
            ln = f"{m.group(1)}{key}:{gap}{_scalar(value)}{comment}{m.group(6)}"
        out.append(ln)
        if key == "pin_date" and values.get("build_number") is not None and not has_number:
            number = values.pop("build_number")
            out.append(f"{' ' * child}build_number: {number}\n")
    missing = {k: v for k, v in values.items() if v is not None}
    if missing:
        raise LlamaspecError(
            f"engines.yaml's {name} entry has no {', '.join(missing)} line to update; add it by "
            "hand (see the other engine's entry) and run again."
        )
    return "".join([*lines[: start + 1], *out, *lines[end:]])


def edit_lock_text(text: str, name: str, pin: str) -> str | None:
    """llamaspec.lock with `name`'s engine pin line set to `pin` (None: no such line)."""
    pattern = re.compile(rf"^(\s+['\"]?{re.escape(name)}['\"]?:[ \t]*)[0-9a-f]{{40}}[ \t]*$", re.M)
    section = re.search(r"^engines:[^\n]*\n((?:[ \t]+[^\n]*\n?|\n)*)", text, re.M)
    if section is None:
        return None
    body = section.group(1)
    edited, n = pattern.subn(lambda m: m.group(1) + pin, body, count=1)
    if n != 1:
        return None
    return text[: section.start(1)] + edited + text[section.end(1) :]


def check_edit(before: str, after: str, name: str, new: Engine) -> None:
    """The edited engines.yaml parses, says what `new` says, and no other engine moved."""
    old_data = config.load_yaml_text(before, "engines.yaml")
    new_data = config.load_yaml_text(after, "engines.yaml (as bump would write it)")
    assert isinstance(old_data, dict) and isinstance(new_data, dict)
    mine = {"name": name, **new_data["engines"][name]}
    parsed = config.parse(Engine, mine, "engines.yaml (as bump would write it)")
    want = new.model_dump()
    if parsed.model_dump() != want:
        raise LlamaspecError(
            f"Editing engines.yaml for {name} gave {parsed.model_dump()} instead of {want}; "
            "nothing was written. Update the entry by hand."
        )
    others_before = {k: v for k, v in old_data["engines"].items() if k != name}
    others_after = {k: v for k, v in new_data["engines"].items() if k != name}
    if others_before != others_after:
        raise LlamaspecError("Editing engines.yaml would change another engine; nothing written.")


def apply(root: Path, p: Plan) -> list[str]:
    """Write engines.yaml and llamaspec.lock for the candidate; both are prepared first."""
    engines_path = root / "engines.yaml"
    before = engines_path.read_text(encoding="utf-8")
    after = edit_engines_text(before, p.engine.name, p.candidate)
    check_edit(before, after, p.engine.name, p.candidate)
    lock_path = root / lockfile.LOCK
    lock_text = lock_path.read_text(encoding="utf-8") if lock_path.is_file() else ""
    new_lock = edit_lock_text(lock_text, p.engine.name, p.new.commit)
    write_atomic(engines_path, after)
    if new_lock is not None:
        write_atomic(lock_path, new_lock)
    else:  # no pin line to edit: the lock is rewritten from its data
        data = lockfile.load_project(root)
        data["engines"] = {**data["engines"], p.engine.name: p.new.commit}
        lockfile.save(root, data)
    return ["engines.yaml", lockfile.LOCK]


__all__ = ["apply", "check_edit", "edit_engines_text", "edit_lock_text", "write_atomic"]
