"""The user's prompts for `verify --prompts FILE`: JSON Lines, one text or chat per line,
every problem reported in the file's own terms."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

from llamaspec.config.loader import Frozen
from llamaspec.errors import LlamaspecError, did_you_mean

MAX_N_PREDICT = 1024  # verify asks the oracle once per emitted token; a slot holds 4096
PROMPT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"
PROMPT_KEY_HINTS = {
    "prompt": "text",
    "content": "text",
    "max_tokens": "n_predict",
    "tokens": "n_predict",
    "n_tokens": "n_predict",
    "chat": "messages",
}
PROMPT_FORMAT = (
    'Each line is one JSON object: {"text": "...", "n_predict": 64}, or a chat: '
    '{"messages": [{"role": "user", "content": "..."}], "n_predict": 64}; "name" is '
    f"optional and n_predict (tokens to generate, 1 to {MAX_N_PREDICT}) defaults to 64."
)


class ChatMessage(Frozen):
    """One turn of a chat prompt."""

    role: Literal["system", "user", "assistant"]
    content: Annotated[str, Field(strict=True, min_length=1)]


class PromptLine(Frozen):
    """One line of a prompts file: a text or a chat, and how many tokens to generate."""

    name: Annotated[str, Field(pattern=PROMPT_NAME)] | None = None
    text: Annotated[str, Field(strict=True)] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    n_predict: Annotated[int, Field(strict=True)] = 64

    @model_validator(mode="after")
    def _one_prompt(self) -> PromptLine:
        if (self.text is None) == (self.messages is None):
            raise ValueError(
                "give `text` (a prompt) or `messages` (a chat)"
                + (", not both" if self.text is not None else "; the line has neither")
            )
        if self.text is not None and not self.text.strip():
            raise ValueError("`text` is empty")
        if self.messages is not None:
            roles = [m.role for m in self.messages]
            if not roles:
                raise ValueError("`messages` is empty; give at least one user message")
            if "system" in roles[1:]:
                raise ValueError("a `system` message may only come first")
            if roles[-1] != "user":
                raise ValueError(
                    f"the last message is from {roles[-1]!r}; end the chat with a `user` "
                    "message (the model answers it)"
                )
        if not 1 <= self.n_predict <= MAX_N_PREDICT:
            raise ValueError(
                f"n_predict is {self.n_predict}; give 1 to {MAX_N_PREDICT} tokens to generate "
                "(verify checks every emitted token with one oracle request)"
            )
        return self


def _prompt_problem(err: dict) -> str:
    """One pydantic error of a prompts-file line, in the file's own terms."""
    import json

    loc = tuple(err["loc"])
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    field = loc[-1] if loc and not isinstance(loc[-1], int) else None
    if err["type"] == "extra_forbidden":
        key = str(field)
        known = ChatMessage.model_fields if len(loc) > 1 else PromptLine.model_fields
        better = PROMPT_KEY_HINTS.get(key) if len(loc) == 1 else None
        hint = f" Did you mean {better!r}?" if better else did_you_mean(key, known)
        return f"unknown key {where!r}" + (f" ({hint.strip().lower()})" if hint else "")
    if err["type"] == "missing":
        return f"missing key {where!r}"
    got = json.dumps(err.get("input"))[:40]
    if field == "n_predict":
        return f"n_predict must be a whole number from 1 to {MAX_N_PREDICT}, not {got}"
    if field == "name":
        return (
            f"name must be 1 to 40 letters, digits, '.', '_' or '-' starting with a letter or "
            f"digit (it names the prompt in reports), not {got}"
        )
    if field in ("text", "content"):
        return f"{where} must be a string, not {got}"
    if loc and loc[0] == "messages" and field != "role":
        return (
            f'{where} must be a list of {{"role": ..., "content": ...}} objects, not {got}'
            if len(loc) == 1
            else f'{where} must be a {{"role": ..., "content": ...}} object, not {got}'
        )
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def load_prompts(path: Path) -> tuple[PromptLine, ...]:
    """A JSON Lines prompts file → its validated lines (blank lines skipped); every problem
    is one paragraph naming the file, the line (and column for JSON syntax) and the fix."""
    import json

    if path.is_dir():
        raise LlamaspecError(f"--prompts {path} is a directory; give a JSON Lines file.")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LlamaspecError(
            f"--prompts {path} does not exist. Give a JSON Lines file (an example ships at "
            "docs/examples/prompts.jsonl)."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise LlamaspecError(f"--prompts {path} cannot be read ({why}). {PROMPT_FORMAT}") from None
    lines: list[PromptLine] = []
    problems: list[str] = []
    named: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            whole = (
                " (the file looks like one JSON document spread over lines: write one "
                "object per line)"
                if not lines and not problems and line.strip() in ("[", "{", "[{")
                else ""
            )
            problems.append(f"line {number}, column {exc.colno}: not JSON ({exc.msg}){whole}")
            continue
        if not isinstance(raw, dict):
            kind = {list: "an array", str: "a string"}.get(type(raw), "a bare value")
            problems.append(f"line {number}: {kind}, not a JSON object")
            continue
        try:
            parsed = PromptLine.model_validate(raw)
        except ValidationError as exc:
            problems.append(
                f"line {number}: " + "; ".join(_prompt_problem(e) for e in exc.errors())
            )
            continue
        name = parsed.name or f"line-{number}"
        if name in named:
            problems.append(f"line {number}: name {name!r} is already used on line {named[name]}")
            continue
        named[name] = number
        lines.append(parsed.model_copy(update={"name": name}))
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more lines" if len(problems) > 5 else ""
        )
        raise LlamaspecError(
            f"--prompts {path} is not a valid prompts file: {shown}. {PROMPT_FORMAT} Fix these "
            "lines and run again."
        )
    if not lines:
        raise LlamaspecError(f"--prompts {path} holds no prompts (it is empty). {PROMPT_FORMAT}")
    return tuple(lines)
