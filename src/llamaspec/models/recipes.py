"""Recipes → the exact llama-server command line for one engine, pin and backend.

A recipe (recipes/*.yaml) is engine-neutral; a dialect renders it. The dialect follows from
the engine and pin (engines.yaml records it for default pins; a built binary's `--help`
tells it otherwise), and rendered flags are checked against that `--help` before running.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from llamaspec.config import SPEC_TYPES, Recipe
from llamaspec.errors import LlamaspecError
from llamaspec.models.dialects import accepted_flags, is_number

# What each dialect can express (engine-neutral spec type names).
CAPABILITIES: dict[str, frozenset[str]] = {
    "upstream": frozenset(SPEC_TYPES),
    "upstream-legacy": frozenset(
        {"draft", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"}
    ),
    # ik_llama.cpp at its default pin (55d3c05) has draft models only: no --spec-type.
    "ik-legacy": frozenset({"draft"}),
    "ik-spec-type": frozenset({"draft", "mtp", "ngram-simple", "ngram-map-k", "ngram-mod"}),
}
UPSTREAM_TYPE = {"draft": "draft-simple", "mtp": "draft-mtp", "eagle3": "draft-eagle3"}


@dataclass(frozen=True)
class ServerCommand:
    """argv for llama-server, the dialect it is written in, and notes on what was left out."""

    argv: tuple[str, ...]
    dialect: str
    notes: tuple[str, ...] = ()

    def shell(self) -> str:
        return shlex.join(self.argv)


def _why_not(recipe: Recipe, dialect: str, engine: str) -> None:
    can = CAPABILITIES.get(dialect)
    if can is None:
        raise LlamaspecError(f"Unknown speculative CLI dialect {dialect!r}.")
    lacking = [t for t in recipe.spec.types if t not in can]
    if lacking:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} asks for spec type {', '.join(lacking)}, which {engine} "
            f"in the {dialect!r} dialect does not offer (it offers: {', '.join(sorted(can))}). "
            "Pick another recipe, override `types` for this engine under `engines:` in the "
            "recipe, or build a pin that has it."
        )
    legacy = dialect in ("upstream-legacy", "ik-legacy")
    if legacy and len(recipe.spec.types) > 1:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} stacks {', '.join(recipe.spec.types)}, but the {dialect!r} "
            "dialect runs one speculative method at a time. Override `types` for this engine."
        )
    if dialect.startswith("ik") and (
        recipe.server.ctx_checkpoints is not None or recipe.server.checkpoint_min_step is not None
    ):
        raise LlamaspecError(
            f"Recipe {recipe.name!r} sets context checkpoints, which {engine} ({dialect!r}) "
            "has no flags for. Set `ctx_checkpoints: null` under `engines: {ik_llama.cpp: ...}`."
        )


def render(
    recipe: Recipe,
    engine: str,
    dialect: str,
    target: Path | str,
    draft: Path | str | None,
    *,
    server: str = "llama-server",
    backend: str = "cpu",
    host: str = "127.0.0.1",
    port: int | str = 8080,
) -> ServerCommand:
    """The full llama-server argv for `recipe` (with the engine's overrides) in `dialect`."""
    recipe = recipe.for_engine(engine)
    _why_not(recipe, dialect, engine)
    spec, srv = recipe.spec, recipe.server
    notes: list[str] = []
    offload = backend != "cpu" or bool(srv.rpc)
    argv: list[str] = [server, "-m", str(target), "--host", host, "--port", str(port)]
    if srv.ctx is not None:
        argv += ["-c", str(srv.ctx)]
    if srv.parallel is not None:
        argv += ["-np", str(srv.parallel)]
    if srv.gpu_layers is not None:
        if offload:
            argv += ["-ngl", str(srv.gpu_layers)]
        else:
            notes.append("GPU layers dropped: a CPU build has nothing to offload to")
    if srv.flash_attn is not None:
        argv += ["-fa", srv.flash_attn]
    if srv.ctx_checkpoints is not None:
        argv += ["--ctx-checkpoints", str(srv.ctx_checkpoints)]
    if srv.checkpoint_min_step is not None:
        argv += ["--checkpoint-min-step", str(srv.checkpoint_min_step)]
    if srv.rpc:
        argv += ["--rpc", ",".join(srv.rpc)]
    uses_draft = "draft" in spec.types or "eagle3" in spec.types
    if uses_draft and draft is None:
        raise LlamaspecError(
            f"Recipe {recipe.name!r} drafts with a draft model, but its pair has none. Use a "
            "pair with a draft, or a draft-free spec type (mtp, ngram-mod)."
        )
    draft_ngl = spec.draft_gpu_layers if offload else None
    if spec.draft_gpu_layers is not None and not offload:
        notes.append("draft GPU layers dropped: a CPU build has nothing to offload to")
    if dialect == "upstream":
        argv += ["--spec-type", ",".join(UPSTREAM_TYPE.get(t, t) for t in spec.types)]
        if uses_draft:
            argv += ["--spec-draft-model", str(draft)]
        if uses_draft or "mtp" in spec.types:
            argv += ["--spec-draft-n-max", str(spec.draft_n_max)]
            argv += ["--spec-draft-n-min", str(spec.draft_n_min)]
            if spec.draft_p_min is not None:
                argv += ["--spec-draft-p-min", str(spec.draft_p_min)]
        if uses_draft:
            argv += _opt("--spec-draft-ngl", draft_ngl)
            argv += _opt("--spec-draft-type-k", spec.draft_cache_type_k)
            argv += _opt("--spec-draft-type-v", spec.draft_cache_type_v)
            argv += _opt("--spec-draft-device", spec.draft_device)
        if "ngram-mod" in spec.types:
            argv += _opt("--spec-ngram-mod-n-min", spec.ngram_mod_n_min)
            argv += _opt("--spec-ngram-mod-n-max", spec.ngram_mod_n_max)
            argv += _opt("--spec-ngram-mod-n-match", spec.ngram_mod_n_match)
    elif dialect in ("upstream-legacy", "ik-legacy"):
        (kind,) = spec.types
        if kind != "draft":
            argv += ["--spec-type", kind]
        else:
            argv += ["-md", str(draft), "--draft-max", str(spec.draft_n_max)]
            argv += ["--draft-min", str(spec.draft_n_min)]
            argv += _opt("--draft-p-min", spec.draft_p_min)
            argv += _opt("-ngld", draft_ngl)
            argv += _opt("-ctkd", spec.draft_cache_type_k)
            argv += _opt("-ctvd", spec.draft_cache_type_v)
            argv += _opt("-devd", spec.draft_device)
    else:  # ik-spec-type: --spec-type TYPE:key=val,... repeated to stack methods
        if uses_draft:
            argv += ["-md", str(draft)]
            argv += _opt("-ngld", draft_ngl)
            argv += _opt("-ctkd", spec.draft_cache_type_k)
            argv += _opt("-ctvd", spec.draft_cache_type_v)
        for kind in spec.types:
            params = [f"n_max={spec.draft_n_max}", f"n_min={spec.draft_n_min}"]
            if spec.draft_p_min is not None:
                params.append(f"p_min={spec.draft_p_min}")
            argv += ["--spec-type", f"{kind}:{','.join(params)}"]
    argv += list(srv.extra)
    return ServerCommand(tuple(argv), dialect, tuple(notes))


def _opt(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]


def spec_type_choices(help_text: str) -> set[str] | None:
    """The values `--spec-type` lists in an upstream --help (None when not listed)."""
    m = re.search(r"--spec-type\s+([a-z0-9-]+(?:,[a-z0-9-]+)+)", help_text)
    return set(m.group(1).split(",")) if m else None


def check_against_help(cmd: ServerCommand, help_text: str, binary: str) -> None:
    """Refuse a command the binary would reject: unknown flags, or spec types it lacks."""
    known = accepted_flags(help_text)
    unknown = [a for a in cmd.argv[1:] if a.startswith("-") and a not in known and not is_number(a)]
    if unknown:
        raise LlamaspecError(
            f"{binary} does not accept {', '.join(unknown)} (not in its --help, or marked "
            f"removed there). The {cmd.dialect!r} dialect does not match this build's pin; "
            "rebuild at a pin that has these flags or pass --dialect for this binary."
        )
    choices = spec_type_choices(help_text)
    if choices is not None and "--spec-type" in cmd.argv:
        wanted = cmd.argv[cmd.argv.index("--spec-type") + 1].split(",")
        lacking = [w for w in wanted if w.split(":")[0] not in choices]
        if lacking:
            raise LlamaspecError(
                f"{binary} does not offer spec type {', '.join(lacking)} (its --spec-type "
                f"accepts {', '.join(sorted(choices))}). Pick another recipe or a newer pin."
            )


def llama_swap(name: str, cmd: ServerCommand) -> str:
    """A llama-swap `models:` entry; llama-swap fills in ${PORT}."""
    argv = list(cmd.argv)
    argv[argv.index("--port") + 1] = "${PORT}"
    command = " ".join(a if a == "${PORT}" else shlex.quote(a) for a in argv)
    entry = {"models": {name: {"cmd": command, "checkEndpoint": "/health"}}}
    return yaml.safe_dump(entry, sort_keys=False, width=1 << 16)


def describe(recipes: Sequence[Recipe]) -> list[tuple[str, str, str, str]]:
    return [(r.name, r.pair, ",".join(r.spec.types), r.description) for r in recipes]
