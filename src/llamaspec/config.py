"""Loading and validating every YAML file llamaspec reads, and the user's prompts files
(`verify --prompts`, JSON Lines), in one place.

Execution modules receive the frozen objects defined here, never raw dicts.
"""

from __future__ import annotations

import datetime as dt
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Literal, TypeVar, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.paths import is_packaged, project_root, user_config, user_data

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
ENGINES = ("llama.cpp", "ik_llama.cpp")


def check_full_sha(value: str) -> str:
    """A full 40-character lowercase git commit SHA."""
    if not FULL_SHA.match(value):
        raise ValueError(
            f"{value!r} is not a full 40-character commit SHA (short SHAs, tags and branch "
            "names are not accepted: they can move or be ambiguous)"
        )
    return value


def check_sha256(value: str) -> str:
    if not SHA256.match(value):
        raise ValueError(f"{value!r} is not a 64-character lowercase sha256 hex digest")
    return value


def check_relative(value: str) -> str:
    """A relative path that stays inside the directory it is resolved against."""
    parts = Path(value).parts
    if Path(value).is_absolute() or ".." in parts or not parts:
        raise ValueError(f"{value!r} must be a relative path inside the tree (no '..')")
    return value


FullSha = Annotated[str, AfterValidator(check_full_sha)]
Sha256 = Annotated[str, AfterValidator(check_sha256)]
RelPath = Annotated[str, AfterValidator(check_relative)]
Dialect = Literal["upstream", "upstream-legacy", "ik-legacy", "ik-spec-type"]


class Frozen(BaseModel):
    """Base of every config object: immutable, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PypiMirror(Frozen):
    """A PyPI source distribution that vendors an engine's exact commit."""

    package: str
    version: str
    sha256: Sha256
    subdir: RelPath


class Engine(Frozen):
    """One engine: where its source lives and how its server is built and spoken to."""

    name: str
    git_url: str
    pin: FullSha
    tag: str
    pin_date: date
    build_number: int | None = None
    server_target: str = "llama-server"
    server_dir: RelPath
    dialect: Dialect
    pypi: PypiMirror | None = None


def check_commitish(value: str) -> str:
    """A commit SHA: full (40 hex) or abbreviated (7+ hex, to be resolved by the lock)."""
    if not re.match(r"^[0-9a-f]{7,40}$", value):
        raise ValueError(f"{value!r} is not a commit SHA (7 to 40 lowercase hex digits)")
    return value


CommitIsh = Annotated[str, AfterValidator(check_commitish)]


class Upstream(Frozen):
    """The upstream pull request a patch comes from."""

    pr: int
    url: str


class PatchSource(Frozen):
    """Where a patch's diff comes from: engine commits, a project file, or a PR's head."""

    commits: tuple[CommitIsh, ...] = ()
    file: RelPath | None = None
    pr_head: bool = False
    # Files of the commits' diffs left out: a project patch of the series (`adapts`) carries
    # their change, rewritten for pins where the commits' own hunks do not apply.
    exclude: tuple[RelPath, ...] = ()

    @model_validator(mode="after")
    def _exactly_one(self) -> PatchSource:
        if sum((bool(self.commits), self.file is not None, self.pr_head)) != 1:
            raise ValueError("source needs exactly one of `commits`, `file` or `pr_head: true`")
        if self.exclude and not self.commits:
            raise ValueError("`exclude` leaves files out of `commits` diffs; it needs `commits`")
        return self


class Landed(Frozen):
    """Where a merged patch first appears, for in-base checks on trees without history."""

    release: int | None = None
    date: dt.date | None = None


class PatchEntry(Frozen):
    """A catalog entry in patches/series.yaml."""

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    engine: str
    title: str
    source: PatchSource
    upstream: Upstream | None = None
    state: Literal["merged", "open", "project"] = "project"
    landed: Landed | None = None
    default: bool = True
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    only_if_missing: RelPath | None = None
    # A project patch that carries part of a merged entry, rewritten for older pins: it is
    # applied with that entry and is in base wherever that entry is.
    adapts: str | None = None
    notes: str = ""

    @model_validator(mode="after")
    def _adapts_a_merged_entry(self) -> PatchEntry:
        if self.adapts is not None and (self.state != "project" or self.source.file is None):
            raise ValueError("`adapts` is for project patches (state: project, source: file)")
        return self


class CudaWheelFile(Frozen):
    """One platform's file of a pinned CUDA wheel (llamaspec.lock `cuda_toolkit`)."""

    file: str
    sha256: Sha256
    size: int = Field(gt=0)
    unpacked: int = Field(gt=0)  # bytes once unzipped (the disk check adds these up)


class CudaWheel(Frozen):
    name: str
    version: str
    files: dict[str, CudaWheelFile]  # machine (`x86_64`) → its wheel


class CudaToolkitLock(Frozen):
    """The PyPI wheels a CUDA toolkit root is assembled from, and the driver it needs."""

    release: str
    driver_min: int = Field(gt=0)  # the oldest NVIDIA driver that runs this CUDA major
    wheels: tuple[CudaWheel, ...]


class EnginesFile(Frozen):
    engines: dict[str, Engine]


class Defect(Frozen):
    """A known defect of an engine at some pins: what goes wrong and what fixes it."""

    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    engine: str
    pins: tuple[FullSha, ...] = Field(min_length=1)
    symptom: Literal["short-output", "corrupt-output", "crash", "parallel-divergence"]
    targets: Literal["all", "hybrid"] = "all"  # which targets show it
    summary: str
    upstream_issue: Upstream | None = None
    fixed_by: str = ""  # a catalog patch id, or an upstream PR/commit when not in the catalog
    reproduced: str = ""  # where and how this project saw it
    # short-output only, and required there: the least fraction of the plain output (in
    # tokens, or characters where only text is compared) that a cut-short output keeps. A
    # shorter output is not this defect, and fails.
    min_kept: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _min_kept_for_short_output(self) -> Defect:
        if (self.symptom == "short-output") != (self.min_kept is not None):
            raise ValueError(
                "`min_kept` (a fraction between 0 and 1) is needed by short-output defects, "
                "and by no other symptom"
            )
        return self


class SeriesFile(Frozen):
    patches: tuple[PatchEntry, ...] = ()
    defects: tuple[Defect, ...] = ()


HANDLE = r"^[a-z0-9][a-z0-9._-]*$"
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
SpecType = Literal[
    "draft",
    "mtp",
    "eagle3",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
]
SPEC_TYPES: tuple[str, ...] = get_args(SpecType)


def check_repo_id(value: str) -> str:
    """A Hugging Face repo id: `owner/name`, letters, digits, `-`, `_`, `.` only."""
    if not HF_REPO.match(value) or "--" in value or ".." in value or value.endswith("."):
        raise ValueError(
            f"{value!r} is not a Hugging Face repo id (owner/name with letters, digits, '-', "
            "'_' and '.'; no '--' or '..')"
        )
    return value


def check_gguf_file(value: str) -> str:
    check_relative(value)
    if not value.endswith(".gguf"):
        raise ValueError(f"{value!r} is not a .gguf file name")
    return value


RepoId = Annotated[str, AfterValidator(check_repo_id)]
GgufFile = Annotated[str, AfterValidator(check_gguf_file)]
Handle = Annotated[str, Field(pattern=HANDLE)]


class ModelFile(Frozen):
    """One GGUF model: where it comes from, what it is, and how to verify it."""

    source: Literal["hf", "embedded"] = "hf"
    repo: RepoId | None = None
    file: GgufFile
    revision: FullSha | None = None
    size: int | None = Field(default=None, gt=0)
    sha256: Sha256 | tuple[Sha256, ...] | None = None
    approx_gb: float | None = Field(default=None, gt=0)
    tokenizer: str
    license: str
    params: str = ""
    quant: str = ""
    mtp: bool = False
    hybrid: bool = False
    gated: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ModelFile:
        if self.source == "hf" and self.repo is None:
            raise ValueError("a model from Hugging Face needs `repo`")
        if isinstance(self.sha256, tuple) and len(self.sha256) != len(self.parts):
            raise ValueError(
                f"sha256 lists {len(self.sha256)} digests for {len(self.parts)} split parts"
            )
        return self

    @property
    def parts(self) -> tuple[str, ...]:
        """Every file of the model: one, or all parts of a split GGUF (`-0000i-of-0000n`)."""
        m = SPLIT.match(self.file)
        if not m:
            return (self.file,)
        count = int(m["count"])
        return tuple(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1))

    def part_sha256(self, index: int) -> str | None:
        if isinstance(self.sha256, tuple):
            return self.sha256[index]
        return self.sha256 if index == 0 and len(self.parts) == 1 else None


class Pair(Frozen):
    """A matched target and its speculation partner (a draft model, MTP heads or n-grams)."""

    target: Handle
    draft: Handle | None = None
    spec: Literal["draft", "mtp", "ngram"] = "draft"
    notes: str = ""
    reported: str = ""

    @model_validator(mode="after")
    def _draft_matches_spec(self) -> Pair:
        if self.spec == "draft" and self.draft is None:
            raise ValueError("spec 'draft' needs a `draft` model")
        if self.spec != "draft" and self.draft is not None:
            raise ValueError(f"spec {self.spec!r} uses no draft model; drop `draft`")
        return self


class ModelsFile(Frozen):
    models: dict[Annotated[str, Field(pattern=HANDLE)], ModelFile] = Field(default_factory=dict)
    pairs: dict[Annotated[str, Field(pattern=HANDLE)], Pair] = Field(default_factory=dict)


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
        return self


RPC_ENDPOINT = r"^[A-Za-z0-9_.:\[\]-]+:\d{1,5}$"


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
    rpc: tuple[Annotated[str, Field(pattern=RPC_ENDPOINT)], ...] = ()
    placement: Placement | None = None
    extra: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _placement(self) -> ServerSettings:
        if self.placement is None:
            return self
        if len(set(self.rpc)) != len(self.rpc):
            raise ValueError("an rpc host is listed twice")
        named = [*self.placement.target, *([self.placement.draft] if self.placement.draft else [])]
        for where in named:
            if where in self.rpc or where == "local":
                continue
            if re.match(RPC_ENDPOINT, where) and not re.match(r"^[A-Za-z]+\d+$", where):
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


class Measured(Frozen):
    """What this project measured itself, and the report that holds the numbers.

    Figures taken from elsewhere belong in `Reported`, never here."""

    hardware: str = Field(min_length=1)
    engine: str = Field(min_length=1)  # engine and commit, e.g. "llama.cpp 0c1e570"
    artifact: str = ""  # the artifact id benched
    date: dt.date | None = None
    result: str = Field(min_length=1)
    report: RelPath


class Reported(Frozen):
    """A figure published elsewhere: where, on what setup, and what it was."""

    source: str = Field(min_length=1)  # a URL, or a sentence saying no source was found
    setup: str = Field(min_length=1)
    result: str = Field(min_length=1)


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


M = TypeVar("M", bound=BaseModel)


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error.

    Plain PyYAML keeps the last value silently, so a duplicated pair in models.yaml would
    drop the first without a word. Keys merged in with `<<` may still be overridden."""


def _unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[object, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below says so
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"duplicate key {key!r} (first given at line {first + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load_yaml_text(text: str, source: str) -> object:
    """Parse YAML text (duplicate keys refused); errors name `source`, the line and column."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        fix = (
            "Keep one of the two entries (rename or remove the other)"
            if problem.startswith("duplicate key")
            else "Fix the file (a missing colon, a bad indent or an unclosed quote is the "
            "usual cause)"
        )
        raise LlamaspecError(
            f"{source} is not valid YAML{where}: {problem}. {fix} and run again."
        ) from None


def read_yaml(path: Path) -> object:
    if not path.exists():
        raise LlamaspecError(
            f"{path} does not exist. llamaspec reads it from the project checkout; run it from "
            "the repository root or set LLAMASPEC_ROOT to the checkout."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise LlamaspecError(f"{path} is a directory, not a YAML file; name the file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise LlamaspecError(
            f"{path} cannot be read ({why}). Check its permissions and contents."
        ) from None
    return load_yaml_text(text, str(path))


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """The valid keys at the place `loc` points to, for did-you-mean."""
    current: object = model
    for part in loc[:-1]:
        if isinstance(part, int) or not isinstance(current, type):
            continue
        field = current.model_fields.get(str(part)) if issubclass(current, BaseModel) else None
        if field is None:
            continue
        ann = field.annotation
        for candidate in (ann, *getattr(ann, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def parse(model: type[M], data: object, source: str) -> M:
    """Validate `data` into `model`, turning pydantic errors into one clear paragraph."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            where = ".".join(str(p) for p in loc) or "(top level)"
            if err["type"] == "extra_forbidden":
                hint = did_you_mean(str(loc[-1]), _field_names(model, loc))
                problems.append(f"unknown key {where!r}.{hint}")
            elif err["type"] == "missing":
                problems.append(f"missing key {where!r}")
            else:
                problems.append(f"{where}: {err['msg']}")
        raise LlamaspecError(
            f"{source} is invalid: " + "; ".join(problems) + ". Fix these entries and run again."
        ) from None


def load_engines(root: Path | None = None) -> dict[str, Engine]:
    """engines.yaml → {name: Engine}; each entry's `name` comes from its key."""
    path = (root or project_root()) / "engines.yaml"
    raw = read_yaml(path)
    if isinstance(raw, dict) and isinstance(raw.get("engines"), dict):
        raw = {
            **raw,
            "engines": {
                k: {"name": k, **v} if isinstance(v, dict) else v for k, v in raw["engines"].items()
            },
        }
    parsed = parse(EnginesFile, raw, str(path))
    for name in parsed.engines:
        if name not in ENGINES:
            raise LlamaspecError(
                f"{path} defines engine {name!r}, which llamaspec does not know how to build."
                f"{did_you_mean(name, ENGINES)} Known engines: {', '.join(ENGINES)}."
            )
    return dict(parsed.engines)


def load_series(root: Path | None = None) -> tuple[PatchEntry, ...]:
    """patches/series.yaml → the ordered patch catalog, with engines and ids checked."""
    root = root or project_root()
    path = root / "patches" / "series.yaml"
    parsed = parse(SeriesFile, read_yaml(path), str(path))
    seen: set[str] = set()
    for entry in parsed.patches:
        if entry.id in seen:
            raise LlamaspecError(f"{path}: patch id {entry.id!r} appears twice; ids are unique.")
        seen.add(entry.id)
        if entry.engine not in ENGINES:
            raise LlamaspecError(
                f"{path}: patch {entry.id!r} is for engine {entry.engine!r}, which does not exist."
                f"{did_you_mean(entry.engine, ENGINES)} Known engines: {', '.join(ENGINES)}."
            )
    by_id = {entry.id: entry for entry in parsed.patches}
    for entry in parsed.patches:
        for other in (*entry.requires, *entry.conflicts, *filter(None, [entry.adapts])):
            if other not in seen:
                raise LlamaspecError(
                    f"{path}: patch {entry.id!r} names {other!r} in requires/conflicts/adapts, "
                    f"which is not in the catalog.{did_you_mean(other, seen)}"
                )
            if by_id[other].engine != entry.engine:
                raise LlamaspecError(
                    f"{path}: patch {entry.id!r} ({entry.engine}) names {other!r}, a patch for "
                    f"{by_id[other].engine}; requires/conflicts/adapts stay within one engine."
                )
        if entry.adapts is not None:
            _check_adapts(path, entry, by_id)
    return parsed.patches


def _check_adapts(path: Path, entry: PatchEntry, by_id: dict[str, PatchEntry]) -> None:
    """An adapting patch follows its merged entry in catalog order and is required by it."""
    target = by_id[str(entry.adapts)]
    order = list(by_id)
    if target.state != "merged" or not target.source.commits:
        raise LlamaspecError(
            f"{path}: patch {entry.id!r} adapts {target.id!r}, which is not a merged commit "
            "entry; `adapts` rewrites part of engine commits for older pins."
        )
    if order.index(entry.id) < order.index(target.id) or entry.id not in target.requires:
        raise LlamaspecError(
            f"{path}: patch {entry.id!r} adapts {target.id!r}: list it after {target.id!r} and "
            f"in {target.id!r}'s requires, so selecting {target.id!r} brings it along."
        )


def load_defects(root: Path | None = None) -> tuple[Defect, ...]:
    """The known defects recorded beside the patch catalog (patches/series.yaml)."""
    root = root or project_root()
    path = root / "patches" / "series.yaml"
    parsed = parse(SeriesFile, read_yaml(path), str(path))
    patch_ids = {p.id: p.engine for p in parsed.patches}
    for d in parsed.defects:
        if d.engine not in ENGINES:
            raise LlamaspecError(
                f"{path}: defect {d.id!r} is for engine {d.engine!r}."
                f"{did_you_mean(d.engine, ENGINES)}"
            )
        # one word is a catalog patch id (free text, with spaces, names a fix elsewhere)
        if d.fixed_by and " " not in d.fixed_by.strip() and patch_ids.get(d.fixed_by) != d.engine:
            raise LlamaspecError(
                f"{path}: defect {d.id!r} is fixed_by {d.fixed_by!r}, which is not a catalog "
                f"patch for {d.engine}.{did_you_mean(d.fixed_by, patch_ids)} Name a patch id, or "
                "describe the fix in words."
            )
    return parsed.defects


def load_models(root: Path | None = None) -> ModelsFile:
    """models.yaml → the catalog, with every pair's models checked to exist."""
    path = (root or project_root()) / "models.yaml"
    raw, where = read_yaml(path), str(path)
    user = user_config() / "models.yaml"
    if user.is_file():  # the user's own models and pairs; theirs win on a shared name
        mine = read_yaml(user)
        if not isinstance(raw, dict) or not isinstance(mine, dict):
            bad = user if isinstance(raw, dict) else path
            raise LlamaspecError(f"{bad} must be a mapping with `models:` and `pairs:`.")
        raw = {
            **raw,
            **{k: {**(raw.get(k) or {}), **(mine.get(k) or {})} for k in ("models", "pairs")},
        }
        where = f"{path} with {user}"
    parsed = parse(ModelsFile, raw, where)
    for name, pair in parsed.pairs.items():
        for role in ("target", "draft"):
            handle = getattr(pair, role)
            if handle is not None and handle not in parsed.models:
                raise LlamaspecError(
                    f"{where}: pair {name!r} names {role} model {handle!r}, which is not under "
                    f"`models:`.{did_you_mean(handle, parsed.models)}"
                )
        if pair.spec == "mtp" and not parsed.models[pair.target].mtp:
            raise LlamaspecError(
                f"{where}: pair {name!r} uses MTP speculation, but model {pair.target!r} is not "
                "marked `mtp: true` (it has no built-in MTP heads)."
            )
    return parsed


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


# --- the user's prompts for `verify --prompts FILE` (JSON Lines) ---

MAX_N_PREDICT = 1024  # verify asks the oracle once per emitted token; a slot holds 4096
PROMPT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$"
PROMPT_KEY_HINTS = {
    "prompt": "text",
    "content": "text",
    "max_tokens": "n_predict",
    "tokens": "n_predict",
    "n_tokens": "n_predict",
    "chat": "messages",
}
PROMPT_FORMAT = (
    'Each line is one JSON object: {"text": "...", "n_predict": 64}, or a chat: '
    '{"messages": [{"role": "user", "content": "..."}], "n_predict": 64}; "name" is '
    f"optional and n_predict (tokens to generate, 1 to {MAX_N_PREDICT}) defaults to 64."
)


class ChatMessage(Frozen):
    """One turn of a chat prompt."""

    role: Literal["system", "user", "assistant"]
    content: Annotated[str, Field(strict=True, min_length=1)]


class PromptLine(Frozen):
    """One line of a prompts file: a text or a chat, and how many tokens to generate."""

    name: Annotated[str, Field(pattern=PROMPT_NAME)] | None = None
    text: Annotated[str, Field(strict=True)] | None = None
    messages: tuple[ChatMessage, ...] | None = None
    n_predict: Annotated[int, Field(strict=True)] = 64

    @model_validator(mode="after")
    def _one_prompt(self) -> PromptLine:
        if (self.text is None) == (self.messages is None):
            raise ValueError(
                "give `text` (a prompt) or `messages` (a chat)"
                + (", not both" if self.text is not None else "; the line has neither")
            )
        if self.text is not None and not self.text.strip():
            raise ValueError("`text` is empty")
        if self.messages is not None:
            roles = [m.role for m in self.messages]
            if not roles:
                raise ValueError("`messages` is empty; give at least one user message")
            if "system" in roles[1:]:
                raise ValueError("a `system` message may only come first")
            if roles[-1] != "user":
                raise ValueError(
                    f"the last message is from {roles[-1]!r}; end the chat with a `user` "
                    "message (the model answers it)"
                )
        if not 1 <= self.n_predict <= MAX_N_PREDICT:
            raise ValueError(
                f"n_predict is {self.n_predict}; give 1 to {MAX_N_PREDICT} tokens to generate "
                "(verify checks every emitted token with one oracle request)"
            )
        return self


def _prompt_problem(err: dict) -> str:
    """One pydantic error of a prompts-file line, in the file's own terms."""
    import json

    loc = tuple(err["loc"])
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    field = loc[-1] if loc and not isinstance(loc[-1], int) else None
    if err["type"] == "extra_forbidden":
        key = str(field)
        known = ChatMessage.model_fields if len(loc) > 1 else PromptLine.model_fields
        better = PROMPT_KEY_HINTS.get(key) if len(loc) == 1 else None
        hint = f" Did you mean {better!r}?" if better else did_you_mean(key, known)
        return f"unknown key {where!r}" + (f" ({hint.strip().lower()})" if hint else "")
    if err["type"] == "missing":
        return f"missing key {where!r}"
    got = json.dumps(err.get("input"))[:40]
    if field == "n_predict":
        return f"n_predict must be a whole number from 1 to {MAX_N_PREDICT}, not {got}"
    if field == "name":
        return (
            f"name must be 1 to 40 letters, digits, '.', '_' or '-' starting with a letter or "
            f"digit (it names the prompt in reports), not {got}"
        )
    if field in ("text", "content"):
        return f"{where} must be a string, not {got}"
    if loc and loc[0] == "messages" and field != "role":
        return (
            f'{where} must be a list of {{"role": ..., "content": ...}} objects, not {got}'
            if len(loc) == 1
            else f'{where} must be a {{"role": ..., "content": ...}} object, not {got}'
        )
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def load_prompts(path: Path) -> tuple[PromptLine, ...]:
    """A JSON Lines prompts file → its validated lines (blank lines skipped); every problem
    is one paragraph naming the file, the line (and column for JSON syntax) and the fix."""
    import json

    if path.is_dir():
        raise LlamaspecError(f"--prompts {path} is a directory; give a JSON Lines file.")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LlamaspecError(
            f"--prompts {path} does not exist. Give a JSON Lines file (an example ships at "
            "docs/examples/prompts.jsonl)."
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise LlamaspecError(f"--prompts {path} cannot be read ({why}). {PROMPT_FORMAT}") from None
    lines: list[PromptLine] = []
    problems: list[str] = []
    named: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            whole = (
                " (the file looks like one JSON document spread over lines: write one "
                "object per line)"
                if not lines and not problems and line.strip() in ("[", "{", "[{")
                else ""
            )
            problems.append(f"line {number}, column {exc.colno}: not JSON ({exc.msg}){whole}")
            continue
        if not isinstance(raw, dict):
            kind = {list: "an array", str: "a string"}.get(type(raw), "a bare value")
            problems.append(f"line {number}: {kind}, not a JSON object")
            continue
        try:
            parsed = PromptLine.model_validate(raw)
        except ValidationError as exc:
            problems.append(
                f"line {number}: " + "; ".join(_prompt_problem(e) for e in exc.errors())
            )
            continue
        name = parsed.name or f"line-{number}"
        if name in named:
            problems.append(f"line {number}: name {name!r} is already used on line {named[name]}")
            continue
        named[name] = number
        lines.append(parsed.model_copy(update={"name": name}))
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; and {len(problems) - 5} more lines" if len(problems) > 5 else ""
        )
        raise LlamaspecError(
            f"--prompts {path} is not a valid prompts file: {shown}. {PROMPT_FORMAT} Fix these "
            "lines and run again."
        )
    if not lines:
        raise LlamaspecError(f"--prompts {path} holds no prompts (it is empty). {PROMPT_FORMAT}")
    return tuple(lines)
