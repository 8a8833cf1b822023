"""The built-in reference models verify can serve, by name, and whether a build can run them.

Each `Family` names the module that writes it, the engine whose pinned loader takes it and
the spec types its methods exercise. `pair_for` refuses, before anything is written or
served, a family the build cannot run (another engine, or a type its `--help` lacks).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass

from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.methods import offered
from llamaspec.proof.refmodels import RefPair, Say

NGRAM = tuple(sorted(dialects.NGRAM_TYPES))


@dataclass(frozen=True)
class Family:
    """A reference model family: `verify --model NAME`."""

    name: str
    module: str  # llamaspec.proof.refmodels.<module>
    func: str  # its function returning the RefPair
    engines: tuple[str, ...]  # the engines whose pinned loaders take it
    types: tuple[str, ...]  # what its methods exercise (models.methods.methods_for)
    what: str  # one line for help texts and the coverage table
    arch: str = ""  # the target's general.architecture (the coverage table names it)
    draft_arch: str = ""  # the draft file's, where the pair has one


UPSTREAM = ("llama.cpp",)
FAMILIES: tuple[Family, ...] = (
    Family(
        name="mtp", module="mtp", func="pair", engines=UPSTREAM, types=("mtp",), arch="hy_v3",
        what="a random-weight hy_v3 target with an MTP (NextN) layer; its own head drafts",
    ),
    Family(
        name="gemma4", module="gemma4", func="pair", engines=UPSTREAM, types=("assistant",),
        arch="gemma4", draft_arch="gemma4-assistant",
        what="a random-weight Gemma 4 target and its assistant drafter (draft-mtp with -md)",
    ),
    Family(
        name="eagle3", module="eagle3", func="pair", engines=UPSTREAM, types=("eagle3",),
        arch="llama", draft_arch="eagle3",
        what="a random-weight llama target and an EAGLE-3 draft reading its hidden states",
    ),
    Family(
        name="dflash", module="dflash", func="pair", engines=UPSTREAM, types=("dflash",),
        arch="llama", draft_arch="dflash",
        what="a random-weight llama target and a DFlash block drafter",
    ),
    Family(
        name="dspark", module="dflash", func="dspark_pair", engines=UPSTREAM, types=("dspark",),
        arch="llama", draft_arch="dflash",
        what="the DFlash target and a DSpark drafter (a DFlash backbone with a Markov head)",
    ),
    Family(
        name="glm4moe-mtp", module="glm4moe", func="pair",
        engines=("ik_llama.cpp", "llama.cpp"), types=("mtp",), arch="glm4moe",
        what="a random-weight GLM-4.5-style (glm4moe) target with an MTP (NextN) layer",
    ),
    Family(
        name="qwen35-mtp", module="qwen35", func="pair", engines=UPSTREAM, types=("mtp",),
        arch="qwen35",
        what="a random-weight Qwen3.6-27B-style dense hybrid (qwen35: gated delta net + "
        "attention) with an MTP (NextN) layer; recurrent-state rollback on every rejection",
    ),
    Family(
        name="qwen35moe-mtp", module="qwen35", func="moe_pair", engines=UPSTREAM, types=("mtp",),
        arch="qwen35moe",
        what="a random-weight Qwen3.5/3.6-style MoE hybrid (qwen35moe: gated delta net + "
        "attention + experts) with an MTP (NextN) layer",
    ),
)  # fmt: skip
BY_NAME = {f.name: f for f in FAMILIES}


def runnable(family: Family, engine: str, dialect: str, help_text: str) -> str | None:
    """None when this build can serve `family`, else why not (one sentence)."""
    if engine not in family.engines:
        return (
            f"the {family.name} reference model is written for {' and '.join(family.engines)}'s "
            f"loader; this build is {engine}"
        )
    for t in family.types:
        why = offered(dialect, help_text, t)
        if why is not None:
            return why
    if not _available(family):
        return f"no {family.name} reference model is shipped in this version"
    return None


def _available(family: Family) -> bool:
    try:
        module = importlib.import_module(f"llamaspec.proof.refmodels.{family.module}")
    except ModuleNotFoundError:
        return False
    return hasattr(module, family.func)


def refusal(
    name: str,
    engine: str,
    dialect: str,
    help_text: str,
    *,
    build: str = "this build",
    also: Sequence[str] = (),
) -> str | None:
    """Why `build` cannot serve family `name`, as one paragraph naming the built-in models it
    can run (`also`, then the families); None when it can."""
    family = BY_NAME[name]
    why = runnable(family, engine, dialect, help_text)
    if why is None:
        return None
    can = [*also, *usable(engine, dialect, help_text)]
    return (
        f"verify --model {name} ({family.what}) cannot run on {build}: {why}. Built-in models "
        f"it can run: {', '.join(can) or 'none'}. Nothing was written or started."
    )


def pair_for(
    name: str, engine: str, dialect: str, help_text: str, say: Say | None = None
) -> RefPair:
    """The family's files (written once into the cache), or a one-paragraph refusal."""
    why = refusal(name, engine, dialect, help_text)
    if why is not None:
        raise LlamaspecError(why)
    family = BY_NAME[name]
    module = importlib.import_module(f"llamaspec.proof.refmodels.{family.module}")
    return getattr(module, family.func)(say=say)


def usable(engine: str, dialect: str, help_text: str) -> list[str]:
    """The reference families this build can serve."""
    return [f.name for f in FAMILIES if runnable(f, engine, dialect, help_text) is None]
