"""The one error type users see, and the did-you-mean helper every validator uses."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LlamaspecError(Exception):
    """A failure with a one-paragraph explanation meant for the user (no traceback)."""

    def __init__(self, message: str, *, details: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message if not self.details else f"{self.message}\n\n{self.details}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean X?' for the closest choice, or '' when nothing is close."""
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in choices}
        close = [lowered[m] for m in difflib.get_close_matches(word.lower(), lowered, n=1)]
    return f" Did you mean {close[0]!r}?" if close else ""


def choose(kind: str, word: str, choices: Iterable[str]) -> str:
    """Return `word` if it is one of `choices`, else raise an error with a did-you-mean."""
    choices = sorted(choices)
    if word in choices:
        return word
    raise LlamaspecError(
        f"Unknown {kind} {word!r}.{did_you_mean(word, choices)} "
        f"Known {kind}s: {', '.join(choices) or '(none)'}."
    )


def missing_extra(extra: str, package: str, needed_for: str) -> LlamaspecError:
    """The error for an optional dependency that is not installed, naming the extra to add.

    `raise missing_extra("smoke", "openai", "The smoke test's OpenAI endpoint check") from None`
    inside `except ImportError:` around the lazy import.
    """
    return LlamaspecError(
        f"{needed_for} needs the Python package {package!r}, which is not installed. Install it "
        f"with `pip install 'llamaspec[{extra}]'` (in a checkout: `pip install -e '.[{extra}]'`; "
        f"the nox sessions that need it install it themselves), then run again."
    )
