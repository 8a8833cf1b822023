"""The strict comparison of one output with its reference: identical, or how it differs.

proof.verify, proof.traffic and proof.smoke compare outputs this way; a tier then judges
the case (`Judge`: the strict tier adds the per-token gaps of a failure)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llamaspec.proof.defects import Defect
from llamaspec.proof.verify_report import Case
from llamaspec.runtime.client import Completion, Prompt, Server

# A tier's verdict on one output: the case as compared, judged (a new Case).
Judge = Callable[[Case, Prompt, Completion], Case]


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first item where `a` and `b` differ (the shorter one's length when one
    is a prefix of the other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def continuation(server: Server, c: Completion, pos: int) -> str:
    """A little context, then ⟦what the run chose⟧ from `pos` on."""
    before, after = c.tokens[max(0, pos - 8) : pos], c.tokens[pos : pos + 12]
    if c.tokens and isinstance(c.tokens[0], str):
        return f"…{''.join(map(str, before))}⟦{''.join(map(str, after))}⟧…"
    return f"…{server.detokenize(before)}⟦{server.detokenize(after)}⟧…"  # type: ignore[arg-type]


def compare(
    prompt: Prompt,
    mode: str,
    ref: Completion,
    spec: Completion,
    ref_server: Server,
    defect: Defect | None,
) -> Case:
    """Strict comparison: identical, or a failure of a named kind (short, longer, different).

    A short output is excused as `defect` (a catalogued short-output defect) only when it
    shows exactly that symptom; otherwise the case says why not."""
    pos = first_difference(ref.tokens, spec.tokens)
    if pos is None:
        return Case(prompt.name, mode, "identical")
    if pos == len(spec.tokens):
        kind = "short"
    elif pos == len(ref.tokens):
        kind = "longer"
    else:
        kind = "different"
    known, note = None, ""
    if defect is not None:
        why = defect.not_short_output(
            ref.tokens, spec.tokens, spec.tokens_predicted, prompt.n_predict
        )
        if why is None:
            kind, known = "known-defect", defect.describe()
        else:
            note = f"not the catalogued defect {defect.id}: {why}"
    return Case(
        prompt.name,
        mode,
        kind,
        pos,
        reference=continuation(ref_server, ref, pos) if pos < len(ref.tokens) else "(ended)",
        speculative=continuation(ref_server, spec, pos) if pos < len(spec.tokens) else "(ended)",
        defect=known,
        note=note,
    )
