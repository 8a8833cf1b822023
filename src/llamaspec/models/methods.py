"""The speculative methods a build offers, learnt from its own `--help`.

dialects spells the flags and server_help reads a binary's `--help` (which flags it
accepts, which spec types `--spec-type` lists); this module turns that into the methods a
build can run (`methods_for`, each a `Method`: a name and the server arguments that turn it
on), the user's choice among them (`choose_methods`), and the determinism flags the build
has (`determinism_args`). verify sweeps these methods and smoke picks from them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects
from llamaspec.models.server_help import accepted_flags, help_flags, spec_type_choices


@dataclass(frozen=True)
class Method:
    """A speculative method and the server arguments that turn it on."""

    name: str
    argv: tuple[str, ...]


# The control: the same server with no speculation. Its parallel mode measures the engine's
# own batch invariance, which tells a speculation bug from plain batch variance.
PLAIN = Method("plain", ())

# ngram-mod's defaults (48/64-token matches) draft nothing on short outputs: shorter ones.
NGRAM_MOD_KNOBS = {"ngram_mod_n_min": 4, "ngram_mod_n_max": 16, "ngram_mod_n_match": 8}


def determinism_args(help_text: str) -> list[str]:
    """FACTS: separate KV caches per slot, and flash attention off on CPU."""
    out = ["--no-kv-unified"] if "--no-kv-unified" in help_flags(help_text) else []
    if takes_fa_value(help_text):
        out += ["-fa", "off"]
    return out


def takes_fa_value(help_text: str) -> bool:
    """`-fa on|off|auto` (upstream `[on|off|auto]`, ik_llama.cpp `(auto|on|off|0|1)`)."""
    return re.search(r"--flash-attn\s*[\[(][^\])]*\boff\b", help_text) is not None


def offers(help_text: str, spec_type: str) -> bool:
    """Whether the binary's --help lists `spec_type` under --spec-type (either engine's way)."""
    listed = spec_type_choices(help_text)
    return spec_type in listed if listed is not None else spec_type in help_text


# Every method verify knows: its name, the spec types it stacks and their settings. A model
# runs those whose types it can exercise (`types` of methods_for).
KNOWN: tuple[tuple[str, tuple[str, ...], dict], ...] = (
    ("draft", ("draft",), {"draft_n_max": 8, "draft_p_min": 0.0}),
    *((name, (name,), {}) for name in sorted(dialects.NGRAM_TYPES)),
    ("draft+ngram-mod", ("draft", "ngram-mod"), {"draft_n_max": 8, "draft_p_min": 0.0}),
    ("mtp", ("mtp",), {"draft_n_max": 3, "draft_p_min": 0.0}),
    ("assistant", ("assistant",), {"draft_n_max": 3, "draft_p_min": 0.0}),
    ("eagle3", ("eagle3",), {"draft_n_max": 8, "draft_p_min": 0.0}),
    ("dflash", ("dflash",), {"draft_n_max": 8, "draft_p_min": 0.0}),
    ("dspark", ("dspark",), {"draft_n_max": 8, "draft_p_min": 0.0}),
)
METHOD_NAMES: tuple[str, ...] = tuple(name for name, _, _ in KNOWN)
# What the embedded model (a plain target that drafts for itself) exercises.
EMBEDDED_TYPES = ("draft", *sorted(dialects.NGRAM_TYPES))


def offered(dialect: str, help_text: str, spec_type: str) -> str | None:
    """None when this binary offers `spec_type` (llamaspec's name), else why not."""
    d = dialects.DIALECTS[dialect]
    if spec_type not in d.types:
        return f"{d.engine} at {d.pins} (dialect {d.name!r}) has no {spec_type}"
    name = d.type_names.get(spec_type)
    if name is not None and not offers(help_text, name):
        return f"{name} is not in this binary's --spec-type list"
    switch = d.switches.get(spec_type)
    if switch is not None and switch not in help_flags(help_text):
        return f"this binary has no {switch} switch"
    return None


def methods_for(
    dialect: str, help_text: str, draft: Path | None, types: Sequence[str] = EMBEDDED_TYPES
) -> list[Method | str]:
    """The methods a model that exercises `types` runs on this binary (`draft`: the draft
    model file, None for a target that drafts with its own heads); a method the binary
    cannot run comes back as a reason string ("name: why")."""
    out: list[Method | str] = []
    for name, needs, settings in KNOWN:
        if not set(needs) <= set(types):
            continue
        why = next((w for t in needs if (w := offered(dialect, help_text, t))), None)
        if why is not None:
            out.append(f"{name}: {why}")
            continue
        try:
            argv = render_method(dialect, help_text, needs, settings, draft)
        except LlamaspecError as exc:
            out.append(f"{name}: {exc.message.split('. ')[0]}")
            continue
        out.append(Method(name, tuple(argv)))
    return out


def render_method(
    dialect: str, help_text: str, types: Sequence[str], settings: dict, draft: Path | None
) -> list[str]:
    """`types` with `settings` in `dialect`; ngram-mod with shorter matches where the
    binary accepts the flags that set them."""
    spec = config.SpecSettings(types=tuple(types), **settings)
    if "ngram-mod" in types:
        tuned = spec.model_copy(update=NGRAM_MOD_KNOBS)
        argv = list(dialects.render(dialect, tuned, draft=draft).argv)
        if {a for a in argv if a.startswith("-")} <= accepted_flags(help_text):
            return argv
    return list(dialects.render(dialect, spec, draft=draft).argv)


def choose_methods(
    available: Sequence[Method | str], wanted: Sequence[str] | None, binary: Path
) -> list[Method | str]:
    """All available methods when none are named; `plain` only when asked for."""
    if not wanted:
        return list(available)
    offered = [PLAIN, *(m for m in available if isinstance(m, Method))]
    known = [m.name for m in offered]
    unknown = [m for m in wanted if m not in known]
    if unknown:
        raise LlamaspecError(
            f"{binary} does not support speculative method(s) {', '.join(unknown)}; it "
            f"supports: {', '.join(known)} (plain: no speculation, the control)."
        )
    return [m for m in offered if m.name in wanted]
