"""recipes/NAME.yaml: a pair plus engine-neutral speculative and server settings, per-engine
overrides, and what was measured or reported; read from the project, tune's output and the
user config dir."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, ValidationError, model_validator

from llamaspec.config.engines import ENGINES
from llamaspec.config.loader import Frozen, RelPath, parse, read_yaml
from llamaspec.config.models import Handle, ModelsFile, load_models
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.netaddr import RPC_ENDPOINT_PATTERN, RpcEndpoint, endpoint_key
from llamaspec.paths import is_packaged, project_root, user_config, user_data

SpecType = Literal[
    "draft",
    "mtp",
    "eagle3",
    "assistant",
    "dflash",
    "dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
]
SPEC_TYPES: tuple[str, ...] = get_args(SpecType)


class SpecSettings(Frozen):
    """Engine-neutral speculative settings of a recipe."""

    types: tuple[SpecType, ...] = Field(min_length=1)
    draft_n_max: int = Field(default=16, ge=1, le=256)
    draft_n_min: int = Field(default=0, ge=0, le=256)
    draft_p_min: float | None = Field(default=None, ge=0, le=1)
    draft_gpu_layers: int | Literal["all", "auto"] | None = None
    draft_cache_type_k: str | None = None
    draft_cache_type_v: str | None = None
    draft_device: str | None = None
    ngram_mod_n_min: int | None = Field(default=None, ge=1)
    ngram_mod_n_max: int | None = Field(default=None, ge=1)
    ngram_mod_n_match: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _ranges(self) -> SpecSettings:
        if self.draft_n_min > self.draft_n_max:
            raise ValueError("draft_n_min is larger than draft_n_max")
        if len(set(self.types)) != len(self.types):
            raise ValueError("a spec type is listed twice")
        if {"mtp", "assistant"} <= set(self.types):
            raise ValueError(
                "mtp (the target's own heads) and assistant (an MTP drafter file) are one "
                "engine method (draft-mtp); keep one"
            )
        return self


class Placement(Frozen):
    """Where a recipe's models go when it names rpc hosts. Each entry is `local` (this
    host's CPU: the layers not offloaded stay there), one of the recipe's `rpc` endpoints
    (that host's rpc-server device) or a device name of this host's build (`CUDA0`,
    `Vulkan0`). `target` lists the devices its offloaded layers are spread over
    (`gpu_layers` says how many layers leave the CPU); `draft` is the one device the draft
    model goes to."""

    target: tuple[str, ...] = ()
    draft: str | None = None


class ServerSettings(Frozen):
    """Engine-neutral server settings of a recipe."""

    ctx: int | None = Field(default=None, ge=0)
    parallel: int | None = Field(default=None, ge=1)
    gpu_layers: int | Literal["all", "auto"] | None = None
    flash_attn: Literal["on", "off", "auto"] | None = None
    ctx_checkpoints: int | None = Field(default=None, ge=0)
    checkpoint_min_step: int | None = Field(default=None, ge=1)
    # host memory for the prompt cache, MiB (upstream --cache-ram: -1 no limit, 0 off; the
    # pinned server's default is 8192)
    cache_ram: int | None = Field(default=None, ge=-1)
    rpc: tuple[RpcEndpoint, ...] = ()
    placement: Placement | None = None
    # a chat template built into the engine, by name (e.g. `gemma`), for a model whose GGUF
    # has none (the server would fall back to ChatML)
    chat_template: Annotated[str, Field(pattern=r"^[a-z][a-z0-9._-]*$")] | None = None
    extra: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _placement(self) -> ServerSettings:
        keys = [endpoint_key(e) for e in self.rpc]
        twice = [e for i, e in enumerate(self.rpc) if keys[i] in keys[:i]]
        if twice:
            raise ValueError(
                f"rpc host {twice[0]} is listed twice (llama-server would make two RPC devices "
                "of one server); list each host once"
            )
        if self.placement is None:
            return self
        named = [*self.placement.target, *([self.placement.draft] if self.placement.draft else [])]
        for where in named:
            if where in self.rpc or where == "local":
                continue
            if re.match(RPC_ENDPOINT_PATTERN, where) and not re.match(r"^[A-Za-z]+\d+$", where):
                raise ValueError(
                    f"placement names {where!r}, which is not in `rpc` "
                    f"({', '.join(self.rpc) or 'empty'}); add it there or name `local`"
                )
            if not re.match(r"^[A-Za-z][A-Za-z0-9_]*$", where):
                raise ValueError(
                    f"placement entry {where!r} is neither `local`, an rpc endpoint of this "
                    "recipe, nor a device name such as CUDA0"
                )
        return self


class Crossover(Frozen):
    """Where speculation stops paying with many clients, from a bench report measured at
    several client counts (perf.crossover): the lowest count where it loses, None when it
    won at every count measured."""

    clients: int | None = Field(ge=1)
    measured: tuple[int, ...] = Field(min_length=2)  # the client counts the report measured
    report: RelPath


class Measured(Frozen):
    """What this project measured itself, and the report that holds the numbers.

    Figures taken from elsewhere belong in `Reported`, never here."""

    hardware: str = Field(min_length=1)
    engine: str = Field(min_length=1)  # engine and commit, e.g. "llama.cpp 0c1e570"
    artifact: str = ""  # the artifact id benched
    date: dt.date | None = None
    result: str = Field(min_length=1)
    report: RelPath
    crossover: Crossover | None = None  # speed by client count, where it was measured


class Reported(Frozen):
    """A figure published elsewhere: where, on what setup, and what it was."""

    source: str = Field(min_length=1)  # a URL, or a sentence saying no source was found
    setup: str = Field(min_length=1)
    result: str = Field(min_length=1)


@dataclass(frozen=True)
class Serving:
    """How a user serves a recipe, over its own server settings: slots, context per slot,
    prompt-cache memory, the busy-slot limit on drafting (None: the recipe's)."""

    slots: int | None = None
    slot_ctx: int | None = None
    cache_ram: int | None = None
    # --spec-busy-max: draft only while at most this many slots are busy (0: no limit);
    # None: from the recipe's measured crossover (runtime/serve.busy_max)
    busy_max: int | None = None

    def apply(self, server: ServerSettings) -> ServerSettings:
        """`server` with these settings: `slots` slots of `slot_ctx` tokens each (default:
        the recipe's context per slot, so more slots keep each slot's context)."""
        update: dict = {}
        if self.slots is not None or self.slot_ctx is not None:
            slots = self.slots or server.parallel or 1
            per_slot = self.slot_ctx or (
                server.ctx // (server.parallel or 1) if server.ctx else None
            )
            update = {"parallel": slots, "ctx": per_slot * slots if per_slot else server.ctx}
        if self.cache_ram is not None:
            update["cache_ram"] = self.cache_ram
        return server.model_copy(update=update) if update else server


class Recipe(Frozen):
    """recipes/NAME.yaml: a pair plus engine-neutral settings and per-engine overrides."""

    name: Handle
    pair: Handle
    description: str
    spec: SpecSettings
    server: ServerSettings = ServerSettings()
    engines: dict[str, dict] = Field(default_factory=dict)
    measured: Measured | None = None
    reported: Reported | None = None

    @model_validator(mode="after")
    def _one_draft_device(self) -> Recipe:
        placed = self.server.placement is not None and self.server.placement.draft is not None
        if placed and self.spec.draft_device is not None:
            raise ValueError(
                "both spec.draft_device and server.placement.draft say where the draft goes; "
                "keep one"
            )
        return self

    def for_engine(self, engine: str) -> Recipe:
        """This recipe with the engine's overrides (keys of spec/server) applied."""
        override = self.engines.get(engine) or {}
        if not override:
            return self
        spec = {k: v for k, v in override.items() if k in SpecSettings.model_fields}
        server = {k: v for k, v in override.items() if k in ServerSettings.model_fields}
        return self.model_copy(
            update={
                "spec": SpecSettings.model_validate({**self.spec.model_dump(), **spec}),
                "server": ServerSettings.model_validate({**self.server.model_dump(), **server}),
                "engines": {},
            }
        )


def load_recipes(
    root: Path | None = None,
    models: ModelsFile | None = None,
    broken: dict[str, LlamaspecError] | None = None,
    origins: dict[str, str] | None = None,
) -> dict[str, Recipe]:
    """recipes/*.yaml → {name: Recipe}; the name is the file's stem, the pair must exist.

    Read in order, a later one winning on a shared name: the project's (checkout or
    package), the recipes tune wrote under the user data dir (installed package only), the
    user's own (user config dir). `origins` gets where each came from.

    Without `broken`, the first invalid file is the error. With it, an invalid file is
    recorded there under its stem and skipped: one bad file does not stop the commands that
    do not need it (`recipes.find` raises its error for that recipe)."""
    root = root or project_root()
    models = models or load_models(root)
    recipes: dict[str, Recipe] = {}
    sources = [(root / "recipes", "package" if is_packaged(root) else "checkout")]
    if is_packaged(root):
        sources.append((user_data() / "recipes", "tuned"))
    sources.append((user_config() / "recipes", "user"))
    for folder, _ in sources:
        if folder.exists() and not folder.is_dir():
            raise LlamaspecError(
                f"{folder} is a file; recipes live in a folder of that name (one YAML file "
                "per recipe). Move the file away, or make the folder."
            )
    found = [(p, origin) for d, origin in sources for p in sorted(d.glob("*.yaml"))]
    seen: dict[str, str] = {}
    for path, origin in found:
        seen[path.stem] = f"{origin} (over {seen[path.stem]})" if path.stem in seen else origin
        recipes.pop(path.stem, None)
        if broken is not None:
            broken.pop(path.stem, None)
        try:
            recipe = _load_recipe(path, models)
        except LlamaspecError as err:
            if broken is None:
                raise
            broken[path.stem] = err
            continue
        recipes[recipe.name] = recipe
    if origins is not None:
        origins.update(seen)
    return recipes


def _load_recipe(path: Path, models: ModelsFile) -> Recipe:
    """One recipe file, checked against the pairs and engines."""
    raw = read_yaml(path)
    if isinstance(raw, dict):
        raw = {"name": path.stem, **raw}
    recipe = parse(Recipe, raw, str(path))
    if recipe.name != path.stem:
        raise LlamaspecError(
            f"{path}: `name: {recipe.name}` differs from the file name; drop `name` or "
            f"rename the file to {recipe.name}.yaml."
        )
    if recipe.pair not in models.pairs:
        raise LlamaspecError(
            f"{path}: recipe {recipe.name!r} is for pair {recipe.pair!r}, which models.yaml "
            f"does not list.{did_you_mean(recipe.pair, models.pairs)}"
        )
    for engine, override in recipe.engines.items():
        if engine not in ENGINES:
            raise LlamaspecError(
                f"{path}: `engines:` names {engine!r}.{did_you_mean(engine, ENGINES)} "
                f"Known engines: {', '.join(ENGINES)}."
            )
        allowed = {*SpecSettings.model_fields, *ServerSettings.model_fields}
        for key in override or {}:
            if key not in allowed:
                raise LlamaspecError(
                    f"{path}: engines.{engine}.{key} is not a recipe setting."
                    f"{did_you_mean(key, allowed)}"
                )
        try:
            recipe.for_engine(engine)
        except ValidationError as exc:
            raise LlamaspecError(
                f"{path}: the {engine} override is invalid: "
                + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            ) from None
    return recipe
