"""Recipes → the exact llama-server command line for one engine, pin and backend.

A recipe (recipes/*.yaml) is engine-neutral; a dialect renders it. The dialect follows from
the engine and pin (engines.yaml records it for default pins; a built binary's `--help`
tells it otherwise), and rendered flags are checked against that `--help` before running.

A recipe whose speculation cannot draft on the chosen build is refused when rendered (the
speculation gate's render-time half, issue 43): spec types the dialect (pin) or the
binary's own `--help` lacks (`check_spec_types`), and a draft model loaded through
`server.extra` without a spec type that drafts with it (`draft_without_type`: upstream
llama.cpp since PR #23988 loads such a draft and never drafts, upstream issue #25345).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import yaml

from llamaspec import config
from llamaspec.config import ModelsFile, Recipe, Serving
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError, choose
from llamaspec.models import dialects, gguf_header, heads, help_check
from llamaspec.paths import project_root

# The spellings, the check against a binary's --help and the command type live in the
# dialect module.
ServerCommand = dialects.ServerCommand
check_against_help = help_check.check_against_help
CAPABILITIES = {name: d.types for name, d in dialects.DIALECTS.items()}


def find(name: str, root: Path | None = None) -> tuple[Recipe, ModelsFile]:
    """The recipe `name` from the project's recipes/ (an unknown name: did-you-mean), and the
    model catalog it was checked against (its pair and the pair's models are in it)."""
    root = root or project_root()
    catalog = config.load_models(root)
    broken: dict[str, LlamaspecError] = {}
    known = config.load_recipes(root, catalog, broken)
    if name in broken:  # the recipe asked for is the invalid one: its own error
        raise broken[name]
    return known[choose("recipe", name, known)], catalog


def load_all(
    root: Path | None = None, say=print, origins: dict[str, str] | None = None
) -> dict[str, Recipe]:
    """Every valid recipe; an invalid file is named with its error and skipped."""
    broken: dict[str, LlamaspecError] = {}
    known = config.load_recipes(root, None, broken, origins)
    for name, err in sorted(broken.items()):
        say(f"recipe {name!r} skipped (invalid): {err}")
    return known


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
    variants: Sequence[str] | None = None,
    pin: str | None = None,
    serving: Serving | None = None,
) -> ServerCommand:
    """The full llama-server argv for `recipe` (with the engine's overrides, then the
    user's `serving` settings: slots, context per slot, prompt-cache memory) in `dialect`.

    `backend` and `variants` (the artifact manifest's; None when no artifact is known)
    decide whether the build can offload: options that need a GPU or RPC are dropped with
    a note when it cannot (`dialects.OFFLOAD_ONLY`). `pin` names the engine's commit in
    refusals."""
    base, recipe = recipe, recipe.for_engine(engine)
    if serving is not None:
        recipe = recipe.model_copy(update={"server": serving.apply(recipe.server)})
    where = f"{engine} at {pin[:7]}" if pin else engine
    subject = f"Recipe {recipe.name!r}"
    d = dialects.find_dialect(dialect)
    why = dialects.refusal(d, recipe.spec.types, subject, where, recipe.server)
    if why:
        raise LlamaspecError(why)
    if draft is None and any(t in dialects.MODEL_TYPES for t in recipe.spec.types):
        raise LlamaspecError(_no_draft(base, recipe, engine, d, where))
    if why := header_refusal(recipe.spec.types, d, target, draft, subject, where):
        raise LlamaspecError(why)
    idle = draft_without_type(recipe, engine, d, where, draft is not None)
    if idle:
        raise LlamaspecError(idle)
    offload = dialects.can_offload(backend, variants, recipe.server.rpc)
    rendered = dialects.render(
        dialect,
        recipe.spec,
        recipe.server,
        draft=draft,
        target=target,
        binary=server,
        host=host,
        port=port,
        offload=offload,
        rpc_build=None if variants is None else "rpc" in variants,
        subject=subject,
        where=where,
    )
    return ServerCommand(rendered.argv, dialect, rendered.notes)


def header_refusal(
    types: Sequence[str],
    d: dialects.Dialect,
    target: Path | str,
    draft: Path | str | None,
    subject: str,
    where: str,
) -> str | None:
    """What the GGUF headers say against this run, where the files are on disk (a path that
    is not, e.g. a placeholder or a container path, is not read): `mtp` needs the target's
    own heads (and, on ik_llama.cpp, an architecture it loads them for); a draft file made
    for EAGLE-3 or as a Gemma 4 assistant needs that spec type, and those types need such
    a file."""
    target_path = Path(target)
    if "mtp" in types and target_path.is_file():
        info = gguf_header.read_local_split(target_path)
        why = heads.mtp_heads_refusal(info, subject, str(target_path))
        if why:
            return why
        if d.mtp_archs is not None and info.arch not in d.mtp_archs:
            return (
                f"{subject} speculates with the target's own MTP heads, but {where} (dialect "
                f"{d.name!r}: {d.pins}) does not offer MTP for architecture {info.arch!r} of "
                f"{target_path.name}; it loads MTP heads for {', '.join(sorted(d.mtp_archs))} "
                "only. What would work: upstream llama.cpp (dialect 'upstream', spec type "
                "draft-mtp); or a recipe with a draft model or n-grams."
            )
    if draft is None or not Path(draft).is_file():
        return None
    kind = heads.draft_kind(gguf_header.read_local(Path(draft)))
    made_for = heads.MADE_FOR
    if kind in made_for and kind not in types and any(t in dialects.MODEL_TYPES for t in types):
        return (
            f"{subject} asks for spec type(s) {', '.join(types)}, but its draft "
            f"{Path(draft).name} is {made_for[kind]}, which only spec type {kind} can run. "
            f"Use a recipe with `types: [{kind}]`, or a draft model of the target's family."
        )
    wanted = [t for t in types if t in made_for and t != kind]
    if wanted:
        return (
            f"{subject} asks for spec type {wanted[0]}, but its draft {Path(draft).name} is not "
            f"{made_for[wanted[0]]} (its header's architecture says otherwise). Use the draft "
            f"published for this target as {made_for[wanted[0]]}."
        )
    return None


def draft_without_type(
    recipe: Recipe, engine: str, d: dialects.Dialect, where: str, pair_draft: bool = True
) -> str | None:
    """Why `recipe` (with `engine`'s overrides applied) would load a draft model that never
    drafts in dialect `d`, or None: its `server.extra` names a draft model, its types read
    none, and the dialect drafts with a draft model only when a spec type says so."""
    flags = [a for a in recipe.server.extra if a.partition("=")[0] in dialects.DRAFT_MODEL_FLAGS]
    if not flags or any(t in dialects.MODEL_TYPES for t in recipe.spec.types):
        return None
    if "draft" in d.by_model:  # older pins: the draft model alone drafts
        return None
    types = ", ".join(recipe.spec.types)
    draft = (
        f"take {flags[0]} out of `extra` (the pair's draft model is passed for you)"
        if pair_draft
        else f"use a pair with a draft model instead of {flags[0]} in `extra` (pair "
        f"{recipe.pair!r} has none)"
    )
    return (
        f"Recipe {recipe.name!r} loads a draft model through `server.extra` ({flags[0]}) but "
        f"its spec types ({types}) include none that drafts with one, so on {where} (dialect "
        f"{d.name!r}) the server would load the draft and never draft with it (upstream "
        "llama.cpp since PR #23988, upstream issue #25345): every token would come from the "
        f"target alone. Add `draft` to `spec: types:`"
        + (f" (override `types` under `engines: {engine}:` if only this engine needs it)")
        + f" and {draft}; or remove the draft model from `extra`."
    )


def check_spec_types(cmd: ServerCommand, recipe: Recipe, help_text: str, build: str) -> None:
    """Refuse a rendered recipe whose spec types the binary's own `--help` does not list
    (`--spec-type` values): on that build the recipe could not draft as written."""
    lacking, choices = help_check.spec_types_lacking(cmd, help_text)
    if lacking:
        raise help_check.spec_type_refusal(
            cmd.dialect,
            lacking,
            choices,
            build,
            f"Recipe {recipe.name!r}",
            "; or override `types` for this engine under `engines:` in the recipe",
        )


def _no_draft(base: Recipe, recipe: Recipe, engine: str, d: dialects.Dialect, where: str) -> str:
    """A recipe that needs a draft model on a pair without one: say where the need came from."""
    free = sorted(d.types - dialects.MODEL_TYPES)
    offers = (
        f"{where} (dialect {d.name!r}) offers the draft-free types {', '.join(free)}"
        if free
        else f"{where} (dialect {d.name!r}: {d.pins}) has no draft-free spec types"
    )
    if recipe.spec.types != base.spec.types:
        lacking = [t for t in base.spec.types if t not in d.types]
        return (
            f"Recipe {recipe.name!r} asks for {', '.join(base.spec.types)}"
            + (f", which {where} lacks ({offers})" if lacking else f"; {offers}")
            + f". Its `engines: {engine}: types:` override switches to "
            f"{', '.join(recipe.spec.types)}, but pair {recipe.pair!r} has no draft model. What "
            "would work: a recipe with a draft model"
            + (f", or {d.later}" if lacking and d.later else "")
            + ("" if lacking else "; or drop the override")
            + "."
        )
    return (
        f"Recipe {recipe.name!r} drafts with a draft model, but pair {recipe.pair!r} has none. "
        f"Use a pair with a draft, or a draft-free spec type; {offers}."
    )


def render_for(
    recipe: Recipe,
    artifact: Artifact,
    dialect: str,
    target: Path | str,
    draft: Path | str | None,
    help_text: str | None = None,
) -> dialects.ServerCommand:
    """`render` for a built artifact: its binary, backend, variants and pin decide the argv;
    with the binary's `help_text`, its spec types are checked against it (`check_spec_types`)."""
    m = artifact.manifest
    cmd = render(
        recipe,
        m["engine"],
        dialect,
        target,
        draft,
        server=str(artifact.server),
        backend=m.get("backend", "cpu"),
        variants=m.get("variants") or [],
        pin=m.get("commit"),
    )
    if help_text is not None:
        check_spec_types(cmd, recipe, help_text, f"build {artifact.id}")
    return cmd


def llama_swap(
    name: str, cmd: ServerCommand, ttl: int | None = None, aliases: Sequence[str] = ()
) -> str:
    """A llama-swap `models:` entry; llama-swap fills in ${PORT}."""
    argv = list(cmd.argv)
    argv[argv.index("--port") + 1] = "${PORT}"
    command = " ".join(a if a == "${PORT}" else shlex.quote(a) for a in argv)
    return llama_swap_entry(name, command, ttl, aliases)


def llama_swap_entry(
    name: str, command: str, ttl: int | None, aliases: Sequence[str], stop: str | None = None
) -> str:
    """The entry with what llama-swap's model schema knows: cmd, cmdStop (a container is
    stopped by name: killing `docker run` may leave it running), the health endpoint, idle
    ttl in seconds, aliases."""
    model: dict[str, object] = {"cmd": command}
    if stop:
        model["cmdStop"] = stop
    model["checkEndpoint"] = "/health"
    if ttl is not None:
        model["ttl"] = ttl
    if aliases:
        model["aliases"] = list(dict.fromkeys(aliases))
    return yaml.safe_dump({"models": {name: model}}, sort_keys=False, width=1 << 16)


def describe(recipes: Sequence[Recipe]) -> list[tuple[str, str, str, str]]:
    return [(r.name, r.pair, ",".join(r.spec.types), r.description) for r in recipes]
