"""The server's speculation counters, read from its Prometheus `/metrics` page.

llama-server started with `--metrics` (or LLAMA_ARG_ENDPOINT_METRICS=1) serves `/metrics`
in the Prometheus text format. `parse` reads that format strictly (a line it cannot read is
an error, not a skipped sample); `spec_counters` picks what the speculation gate and the cost
model need: upstream's `llamacpp:spec_decode_*` counters (draft tokens, accepted tokens,
verification steps, accepted tokens per draft position; the last one appears only after the
first speculative step) and `llamacpp:tokens_predicted_total`. ik_llama.cpp exports no
speculation counters: its `SpecCounters.available` is False, and callers count drafts from a
reply's `timings.draft_n` or the server log instead (and say which).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import httpx

from llamaspec.runtime import loopback

__all__ = [
    "PREFIX",
    "MetricsFormatError",
    "Samples",
    "SpecCounters",
    "flag",
    "parse",
    "read",
    "spec_counters",
]

PREFIX = "llamacpp:"
DRAFT_TOKENS = PREFIX + "spec_decode_num_draft_tokens_total"
ACCEPTED = PREFIX + "spec_decode_num_accepted_tokens_total"
DRAFTS = PREFIX + "spec_decode_num_drafts_total"
PER_POS = PREFIX + "spec_decode_num_accepted_tokens_per_pos_total"
PREDICTED = PREFIX + "tokens_predicted_total"

# name{labels} value [timestamp]: the text exposition format, version 0.0.4
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?[ \t]+(\S+)(?:[ \t]+(-?\d+))?[ \t]*$")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_SPECIAL = {"+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}

Labels = tuple[tuple[str, str], ...]
Samples = Mapping[str, Mapping[Labels, float]]


class MetricsFormatError(ValueError):
    """A `/metrics` page that is not in the Prometheus text format."""


def _labels(text: str, line: str) -> Labels:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m or m.end() == pos:
            raise MetricsFormatError(f"unreadable labels in /metrics line {line!r}")
        value = re.sub(r"\\.", lambda e: _ESCAPES.get(e.group(0), e.group(0)), m.group(2))
        out.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(out))


def _value(text: str, line: str) -> float:
    if text in _SPECIAL:
        return _SPECIAL[text]
    try:
        return float(text)
    except ValueError:
        raise MetricsFormatError(f"unreadable value {text!r} in /metrics line {line!r}") from None


def parse(text: str) -> dict[str, dict[Labels, float]]:
    """Every sample of a Prometheus text page: name → {sorted (label, value) pairs → value}.
    Comments (`# HELP`, `# TYPE`, others) and blank lines carry no samples."""
    out: dict[str, dict[Labels, float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise MetricsFormatError(f"unreadable /metrics line {line!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        key = _labels(labels, line) if labels else ()
        out.setdefault(name, {})[key] = _value(value, line)
    return out


@dataclass(frozen=True)
class SpecCounters:
    """The speculation counters of one `/metrics` reading (or the difference of two).

    `available`: the server exports speculation counters at all (upstream does, always, once
    `--metrics` is on; ik_llama.cpp does not)."""

    drafts: float = 0.0  # verification steps that had a draft
    drafted: float = 0.0  # draft tokens
    accepted: float = 0.0  # draft tokens the target accepted
    per_pos: tuple[float, ...] = ()  # steps accepting at least i + 1 tokens
    predicted: float = 0.0  # tokens generated (llamacpp:tokens_predicted_total)
    available: bool = False

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_pos), len(other.per_pos))
        mine = self.per_pos + (0.0,) * (n - len(self.per_pos))
        theirs = other.per_pos + (0.0,) * (n - len(other.per_pos))
        return SpecCounters(
            self.drafts - other.drafts,
            self.drafted - other.drafted,
            self.accepted - other.accepted,
            tuple(a - b for a, b in zip(mine, theirs, strict=True)),
            self.predicted - other.predicted,
            self.available and other.available,
        )

    def describe(self) -> str:
        """The counters in words, as the gate quotes them."""
        if not self.available:
            return "no speculation counters (the server exports none)"
        return (
            f"{self.predicted:g} tokens generated, {self.drafts:g} drafts, {self.drafted:g} "
            f"draft tokens, {self.accepted:g} accepted (llamacpp:spec_decode_*)"
        )


def spec_counters(samples: Samples) -> SpecCounters:
    """The speculation counters of a parsed page; missing ones count 0 (per-position counts
    appear after the first speculative step)."""

    def plain(name: str) -> float:
        return samples.get(name, {}).get((), 0.0)

    positions: dict[int, float] = {}
    for labels, value in samples.get(PER_POS, {}).items():
        pos = dict(labels).get("position", "")
        if pos.isdigit():
            positions[int(pos)] = value
    per_pos = tuple(positions.get(i, 0.0) for i in range(max(positions) + 1)) if positions else ()
    return SpecCounters(
        plain(DRAFTS),
        plain(DRAFT_TOKENS),
        plain(ACCEPTED),
        per_pos,
        plain(PREDICTED),
        available=DRAFTS in samples or DRAFT_TOKENS in samples,
    )


def read(url: str, timeout: float = 10) -> SpecCounters | None:
    """The counters of the server at `url` (e.g. http://127.0.0.1:8080); None when it serves
    no `/metrics` (started without `--metrics`), cannot be reached, or serves another format."""
    try:
        reply = loopback.get(url.rstrip("/") + "/metrics", timeout)
    except httpx.HTTPError:
        return None
    if reply.status_code != 200:
        return None
    try:
        return spec_counters(parse(reply.text))
    except MetricsFormatError:
        return None


def flag(args: Sequence[str], help_flags: Collection[str]) -> list[str]:
    """`--metrics` where a binary has it (its --help's flags) and `args` lack it."""
    return ["--metrics"] if "--metrics" in help_flags and "--metrics" not in args else []
