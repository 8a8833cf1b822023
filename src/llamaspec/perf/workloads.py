"""Built-in bench workloads, one per Spec-Bench category plus code editing.

Spec-Bench (Xia et al., 2024) measures speculative decoding on multi-turn conversation,
translation, summarization, question answering, mathematical reasoning and
retrieval-augmented generation, greedy, one request at a time. These prompts are written
for llamaspec in the same spirit, small enough for a 2-core CPU, each with a fixed token
budget (requests set `ignore_eos`, so both runs generate exactly the budget).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llamaspec.errors import LlamaspecError, did_you_mean


@dataclass(frozen=True)
class Workload:
    """A named prompt (or several turns, each carrying the history) and its token budget."""

    name: str
    category: str
    turns: tuple[str, ...]
    n_predict: int  # tokens per turn

    @property
    def budget(self) -> int:
        return self.n_predict * len(self.turns)

    def prompt(self, history: str, turn: int) -> str:
        """The text sent for `turn`; a conversation carries the turns and answers so far."""
        if len(self.turns) == 1:
            return self.turns[0]
        return f"{history}User: {self.turns[turn]}\nAssistant:"


# A ~1.8 kB Python module, copied back verbatim by the copy-heavy workload.
INVENTORY_MODULE = '''"""A small inventory of parts, with prices and stock levels."""

from dataclasses import dataclass, field


@dataclass
class Part:
    code: str
    name: str
    price: float
    stock: int = 0
    tags: list[str] = field(default_factory=list)

    def value(self) -> float:
        """What the parts in stock are worth."""
        return self.price * self.stock


class Inventory:
    def __init__(self) -> None:
        self.parts: dict[str, Part] = {}

    def add(self, part: Part) -> None:
        if part.code in self.parts:
            raise KeyError(f"part {part.code} is already listed")
        self.parts[part.code] = part

    def restock(self, code: str, count: int) -> int:
        part = self.parts[code]
        part.stock += count
        return part.stock

    def take(self, code: str, count: int) -> int:
        part = self.parts[code]
        if count > part.stock:
            raise ValueError(f"only {part.stock} of {code} left")
        part.stock -= count
        return part.stock

    def remove(self, code: str) -> Part:
        return self.parts.pop(code)

    def low_stock(self, limit: int = 5) -> list[Part]:
        return [part for part in self.parts.values() if part.stock < limit]

    def total_value(self) -> float:
        return sum(part.value() for part in self.parts.values())

    def tagged(self, tag: str) -> list[Part]:
        return [part for part in self.parts.values() if tag in part.tags]

    def cheapest(self, count: int = 3) -> list[Part]:
        return sorted(self.parts.values(), key=lambda part: part.price)[:count]


def load(rows: list[tuple[str, str, float, int]]) -> Inventory:
    inventory = Inventory()
    for code, name, price, stock in rows:
        inventory.add(Part(code, name, price, stock))
    return inventory
'''

_ARTICLE = (
    "The town council met on Tuesday to decide the future of the old railway bridge over the "
    "river. Built in 1894, the bridge carried freight trains until the line closed in 1971 and "
    "has been fenced off since a storm damaged two of its piers in 2019. Engineers told the "
    "council that repairing the piers and the deck would cost about 2.4 million, and that the "
    "repaired bridge could carry pedestrians and cyclists for at least another fifty years. "
    "Demolition would cost 900,000 and would remove a listed landmark. Several residents spoke "
    "in favour of repair, pointing out that the nearest crossing is three kilometres "
    "downstream and that children from the east bank walk along the main road to school. A "
    "local business group offered 300,000 towards the work if the bridge reopens within three "
    "years. The council voted seven to two to seek a regional heritage grant for the rest of "
    "the cost and to decide again in the spring, once the grant decision is known."
)

_MANUAL = (
    "Section 4.2, Battery care. Charge the battery fully before first use; this takes about "
    "five hours. Store the unit between 10 and 25 degrees Celsius. If the unit will not be used "
    "for more than a month, charge the battery to about half and switch the unit off. Do not "
    "leave the battery fully discharged: below 5 percent the protection circuit disconnects it, "
    "and it must then be woken with the supplied charger for at least thirty minutes before "
    "normal charging resumes. Replace the battery after about 800 charge cycles or when the "
    "running time falls below half of the original. Section 4.3, Cleaning. Wipe the housing "
    "with a dry cloth. Never use solvents, and keep water away from the charging port."
)

_CODE_TO_EDIT = """def parse_scores(lines):
    result = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, score = line.split(",")
        result[name.strip()] = int(score)
    return result


def best(result):
    top_name = None
    top_score = -1
    for name in result:
        if result[name] > top_score:
            top_name = name
            top_score = result[name]
    return top_name, top_score
"""

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "conversation",
            "multi-turn conversation",
            (
                "I am planning a vegetable garden on a small balcony that gets sun in the "
                "morning. Which vegetables should I start with, and why?",
                "Good. How often should I water them in summer, and how do I tell when a pot "
                "is too dry?",
                "Now write the plan as a short weekly checklist I can pin on the door.",
            ),
            96,
        ),
        Workload(
            "translation",
            "translation",
            (
                "Translate into French, sentence by sentence, keeping the meaning exact.\n\n"
                "English: The library opens at nine in the morning and closes at six in the "
                "evening. Members may borrow up to five books at a time for three weeks. Books "
                "can be renewed twice online unless another member has reserved them. Late "
                "returns cost twenty cents a day.\n\nFrench:",
            ),
            128,
        ),
        Workload(
            "summarization",
            "summarization",
            (f"Article:\n{_ARTICLE}\n\nSummarize the article in three sentences.\n\nSummary:",),
            96,
        ),
        Workload(
            "qa",
            "question answering",
            (
                "Question: Why does a metal spoon feel colder than a wooden spoon at the same "
                "room temperature? Explain in plain words.\n\nAnswer:",
            ),
            96,
        ),
        Workload(
            "math",
            "mathematical reasoning",
            (
                "Solve step by step, then give the final answer on its own line.\n\nA "
                "bakery sells muffins for 2.50 each or a box of six for 12.00. Ana needs 20 "
                "muffins for a party. What is the least she can pay, and how many boxes and "
                "single muffins should she buy?\n\nSolution:",
            ),
            128,
        ),
        Workload(
            "rag",
            "retrieval-augmented generation",
            (
                f"Use only the document below. Quote the sentences that answer the question, "
                f"word for word, then answer in one sentence.\n\nDocument:\n{_MANUAL}\n\n"
                "Question: How should the battery be stored for a long break, and what happens "
                "if it runs completely flat?\n\nQuoted sentences:",
            ),
            128,
        ),
        Workload(
            "copy",
            "retrieval-augmented generation (copy-heavy)",
            (
                f"```python\n{INVENTORY_MODULE}```\n\n"
                "Here is the same module again, unchanged:\n\n```python\n",
            ),
            256,
        ),
        Workload(
            "code-edit",
            "code edit/rewrite",
            (
                "Rewrite this Python code with type hints and a docstring on each function. "
                "Keep the logic exactly as it is.\n\n"
                f"```python\n{_CODE_TO_EDIT}```\n\n```python\n",
            ),
            192,
        ),
    )
}

DEFAULT = tuple(WORKLOADS)
# What `tune` optimises for unless told otherwise: one workload where drafts from the
# context pay off, one where they mostly do not, and a conversation.
TUNE_MIX = ("copy", "code-edit", "qa")


def select(names: Iterable[str] | None) -> tuple[Workload, ...]:
    """The named workloads in the order given (all of them when none are named)."""
    names = list(names or DEFAULT)
    chosen = []
    for name in names:
        if name not in WORKLOADS:
            raise LlamaspecError(
                f"Unknown workload {name!r}.{did_you_mean(name, WORKLOADS)} Built-in workloads: "
                f"{', '.join(WORKLOADS)}. Pass --workload NAME (repeatable) or leave it out for "
                "all of them."
            )
        if WORKLOADS[name] not in chosen:
            chosen.append(WORKLOADS[name])
    return tuple(chosen)


def describe(workloads: Sequence[Workload]) -> list[dict]:
    return [
        {"name": w.name, "category": w.category, "turns": len(w.turns), "n_predict": w.n_predict}
        for w in workloads
    ]
