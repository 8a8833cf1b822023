"""The built-in prompts of verify and smoke: short, code, prose, rewrite and chat.

A user's own prompts replace them (`verify --prompts FILE`, JSON Lines read by
config.load_prompts through proof.suite).
"""

from __future__ import annotations

from collections.abc import Sequence

from llamaspec.errors import choose
from llamaspec.runtime.client import Prompt

CHAT_TURNS = (
    "Write a quicksort in C with comments.",
    "Now write merge sort in the same style.",
    "Write a benchmark harness that compares both on 100, 1000 and 10000 elements.",
    "Extract the timing code into a reusable benchmark() function.",
)

CHAT_HISTORY = tuple(
    (turn, f"Here is the {what}, in C99, with a comment above every step.")
    for turn, what in zip(CHAT_TURNS[:-1], ("quicksort", "merge sort", "harness"), strict=True)
)

REWRITE_SOURCE = """def total_price(items, tax_rate):
    total = 0
    for item in items:
        total = total + item.price * item.quantity
    total = total + total * tax_rate
    return total


def average_price(items):
    total = 0
    for item in items:
        total = total + item.price
    return total / len(items)
"""

CODE = Prompt(
    "code",
    "Write a C function that reverses a singly linked list in place. Put a short comment "
    "above every step, then a main() that builds a list of five nodes, reverses it and "
    "prints the values.\n\n```c\n#include <stdio.h>\n#include <stdlib.h>\n",
)
PROSE = Prompt(
    "prose",
    "The printing press changed how ideas travelled across Europe. Before it, books were "
    "copied by hand, which made them rare and expensive. In a few sentences, explain what "
    "changed for ordinary readers in the fifty years after 1450:\n\n",
)
REWRITE = Prompt(
    "rewrite",
    "Rewrite this Python code, renaming `items` to `products`, and keep everything else "
    f"exactly as it is.\n\n```python\n{REWRITE_SOURCE}```\n\n```python\n",
    96,
)
VERIFY_PROMPTS: tuple[Prompt, ...] = (
    Prompt("short", "The capital of France is", 32),
    CODE,
    PROSE,
    REWRITE,
    Prompt(
        "chat",
        "".join(f"User: {turn}\nAssistant: {reply}\n" for turn, reply in CHAT_HISTORY)
        + f"User: {CHAT_TURNS[-1]}\nAssistant:",
        64,
    ),
)

# verify's fast check (bump, tune, draft measurements): two prompts, sequential.
FAST_PROMPTS = (CODE, REWRITE)


def choose_prompts(names: Sequence[str]) -> tuple[Prompt, ...]:
    """The built-in prompts named (all when none), with a did-you-mean for unknown names."""
    by_name = {p.name: p for p in VERIFY_PROMPTS}
    if not names:
        return VERIFY_PROMPTS
    wanted = {choose("prompt", n, by_name) for n in names}
    return tuple(p for p in VERIFY_PROMPTS if p.name in wanted)
