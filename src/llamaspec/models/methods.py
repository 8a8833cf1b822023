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


def methods_for(dialect: str, help_text: str, draft: Path, has_mtp: bool) -> list[Method | str]:
    """The methods this binary supports; unsupported ones come back as a reason string."""
    out: list[Method | str] = []
    wanted: list[tuple[str, tuple[str, ...], dict]] = [
        ("draft", ("draft",), {"draft_n_max": 8, "draft_p_min": 0.0}),
        *((name, (name,), {}) for name in ("ngram-simple", "ngram-map-k", "ngram-mod")),
        ("draft+ngram-mod", ("draft", "ngram-mod"), {"draft_n_max": 8, "draft_p_min": 0.0}),
    ]
    for name, types, settings in wanted:
        if any(t.startswith("ngram") and not offers(help_text, t) for t in types):
            out.append(f"{name}: not in this binary's --spec-type list")
            continue
        try:
            argv = render_method(dialect, help_text, types, settings, draft)
        except LlamaspecError as exc:
            out.append(f"{name}: {exc.message.split('. ')[0]}")
            continue
        out.append(Method(name, tuple(argv)))
    if has_mtp:
        out.append(
            Method(
                "mtp", tuple(render_method(dialect, help_text, ("mtp",), {"draft_n_max": 1}, draft))
            )
        )
    else:
        out.append("mtp: the model has no MTP heads")
    return out


def render_method(
    dialect: str, help_text: str, types: Sequence[str], settings: dict, draft: Path
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
