"""Drafts that read the target's hidden states, judged from GGUF headers like any draft.

Three kinds, as the engine runs them (upstream llama.cpp at the default pin 0c1e570):

- **MTP heads in the target's own file** (spec type `mtp`, `draft-mtp`): the loader needs
  `<arch>.nextn_predict_layers` > 0 and the per-block `blk.N.nextn.*` tensors
  (src/llama-arch.cpp). Plain conversions of MTP models often keep the key and drop the
  tensors (llama.cpp issue #28196).
- **EAGLE-3 heads** (architecture `eagle3`, spec type `eagle3`): exactly three extract
  layers (`eagle3.target_layers`), none past the target's last block; the fused input width
  `eagle3.target_hidden_size` equal to the target's hidden size; a `d2t` map into the
  target's vocab (src/models/eagle3.cpp, the draft-eagle3 code in common/speculative.cpp).
- **Gemma 4 assistants** (architecture `gemma4-assistant`, spec type `assistant`, which
  upstream runs as `draft-mtp` with the assistant as the draft model): a `gemma4` target (the
  assistant shares its KV cache, src/llama-model.cpp) whose output width equals the
  assistant's `embedding_length_out` (src/models/gemma4-assistant.cpp; the draft-mtp code
  asserts the widths match).

`check` is `compat.check` (the vocab rules) plus these; `explain` words a refusal.
"""

from __future__ import annotations

from llamaspec.models.compat import Rule, Verdict
from llamaspec.models.compat import check as check_vocab
from llamaspec.models.compat import explain as explain_vocab
from llamaspec.models.gguf_header import TokenizerInfo

EAGLE3_ARCH = "eagle3"
ASSISTANT_ARCH = "gemma4-assistant"
EAGLE3_LAYERS = 3  # the engine's eagle3 encoder reads exactly three target layers
# the spec type each hidden-state draft architecture needs, and how messages name it
KINDS = {EAGLE3_ARCH: "eagle3", ASSISTANT_ARCH: "assistant"}
MADE_FOR = {"eagle3": "an EAGLE-3 head", "assistant": "a Gemma 4 assistant drafter"}


def mtp_ready(info: TokenizerInfo) -> bool:
    """Whether the engine can run `draft-mtp` on the file's own heads: both the key and the
    `blk.N.nextn.*` tensors (`TokenizerInfo.has_mtp` is either: what the file claims)."""
    return (info.mtp_layers or 0) > 0 and bool(info.nextn_blocks)


def mtp_summary(info: TokenizerInfo) -> str:
    """The header's MTP evidence, in words."""
    blocks = ", ".join(map(str, info.nextn_blocks)) or "none"
    layers = "absent" if info.mtp_layers is None else info.mtp_layers
    return (
        f"{info.arch}.nextn_predict_layers = {layers}, {info.nextn_tensors} nextn tensors, "
        f"blk.N.nextn.* in block(s) {blocks}"
    )


def mtp_heads_refusal(info: TokenizerInfo, subject: str, where: str) -> str | None:
    """Why `draft-mtp` on the target's own heads cannot run on this file, or None."""
    if mtp_ready(info):
        return None
    return (
        f"{subject} speculates with the target's own MTP heads, but {where} has none the "
        f"engine can load ({mtp_summary(info)}; it needs nextn_predict_layers > 0 and "
        "blk.N.nextn.* tensors). Plain conversions of MTP models often leave them out "
        "(llama.cpp issue #28196). Use a GGUF converted with its MTP layers kept (a repo "
        "with -MTP- in its name), or a recipe with a draft model or n-grams."
    )


def draft_kind(draft: TokenizerInfo) -> str:
    """The spec type a draft file is for, from its architecture: `eagle3`, `assistant`, or
    `draft` (a small model of the target's family)."""
    return KINDS.get(draft.arch, "draft")


def width(info: TokenizerInfo) -> int | None:
    """The engine's `n_embd_out`: `embedding_length_out` where set, else the hidden size."""
    return info.embd_out or info.dim("embedding_length")


def eagle3_rules(target: TokenizerInfo, draft: TokenizerInfo) -> list[Rule]:
    layers, n_layer = draft.target_layers, target.dim("block_count")
    embd = target.dim("embedding_length")
    rules = [
        Rule(
            "eagle3 layers",
            len(layers) == EAGLE3_LAYERS
            and (n_layer is None or all(0 <= x <= n_layer for x in layers)),
            f"eagle3.target_layers {list(layers) or 'absent'} "
            + (f"vs target block_count {n_layer} " if n_layer is not None else "")
            + f"(needs {EAGLE3_LAYERS} layer ids, each ≤ the target's block count)",
        ),
        Rule(
            "eagle3 hidden size",
            draft.target_hidden is not None and draft.target_hidden == embd,
            f"eagle3.target_hidden_size {draft.target_hidden} vs target embedding_length "
            f"{embd}: the head was trained on a "
            + ("model of this width" if draft.target_hidden == embd else "different model"),
        ),
    ]
    if draft.d2t is not None:
        rules.append(
            Rule(
                "eagle3 d2t",
                draft.d2t <= target.n_vocab,
                f"d2t maps {draft.d2t} draft tokens into the target's {target.n_vocab}",
            )
        )
    return rules


def assistant_rules(target: TokenizerInfo, draft: TokenizerInfo) -> list[Rule]:
    return [
        Rule(
            "assistant target arch",
            target.arch == "gemma4",
            f"target architecture {target.arch!r} (a gemma4-assistant drafts for 'gemma4')",
        ),
        Rule(
            "assistant width",
            draft.embd_out is not None and draft.embd_out == width(target),
            f"gemma4-assistant.embedding_length_out {draft.embd_out} vs the target's hidden "
            f"size {width(target)} (the engine needs them equal)",
        ),
    ]


def check(target: TokenizerInfo, draft: TokenizerInfo) -> Verdict:
    """The engine's vocab rules (`compat.check`) for the draft's kind, and for an EAGLE-3
    head or a Gemma 4 assistant the rules above."""
    kind = draft_kind(draft)
    verdict = check_vocab(target, draft, kind)
    extra = {"eagle3": eagle3_rules, "assistant": assistant_rules}.get(kind)
    if extra is None:
        return verdict
    return Verdict(verdict.target, verdict.draft, (*verdict.rules, *extra(target, draft)))


def explain(verdict: Verdict) -> str:
    """One paragraph: why the pair is refused (a head made for another target named as
    such), or that it is accepted."""
    if not any(r.name.startswith(("eagle3", "assistant")) for r in verdict.failed):
        return explain_vocab(verdict)
    failed = "; ".join(f"{r.name}: {r.detail}" for r in verdict.failed)
    return (
        f"{verdict.draft} cannot draft for {verdict.target}: it was made for another target "
        f"({failed}). An EAGLE-3 head or a Gemma 4 assistant only works with the model it was "
        "trained on; pick the draft published for this target."
    )
