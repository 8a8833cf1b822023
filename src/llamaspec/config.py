"""Loading and validating every YAML file llamaspec reads, in one place.

Execution modules receive the frozen objects defined here, never raw dicts.
"""

from __future__ import annotations

import datetime as dt
import re
from datetime import date
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from .errors import LlamaspecError, did_you_mean
from .paths import project_root

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

    @model_validator(mode="after")
    def _exactly_one(self) -> PatchSource:
        if sum((bool(self.commits), self.file is not None, self.pr_head)) != 1:
            raise ValueError("source needs exactly one of `commits`, `file` or `pr_head: true`")
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
    notes: str = ""


class EnginesFile(Frozen):
    engines: dict[str, Engine]


class SeriesFile(Frozen):
    patches: tuple[PatchEntry, ...] = ()


class ModelsFile(Frozen):
    pairs: dict[str, dict] = Field(default_factory=dict)


M = TypeVar("M", bound=BaseModel)


def _read_yaml(path: Path) -> object:
    if not path.is_file():
        raise LlamaspecError(
            f"{path} does not exist. llamaspec reads it from the project checkout; run it from "
            "the repository root or set LLAMASPEC_ROOT to the checkout."
        )
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise LlamaspecError(
            f"{path} is not valid YAML{where}: {problem}. Fix the file (a missing colon, a bad "
            "indent or an unclosed quote is the usual cause) and run again."
        ) from None


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
    raw = _read_yaml(path)
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
    parsed = parse(SeriesFile, _read_yaml(path), str(path))
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
    for entry in parsed.patches:
        for other in (*entry.requires, *entry.conflicts):
            if other not in seen:
                raise LlamaspecError(
                    f"{path}: patch {entry.id!r} names {other!r} in requires/conflicts, which is "
                    f"not in the catalog.{did_you_mean(other, seen)}"
                )
    return parsed.patches


def load_models(root: Path | None = None) -> ModelsFile:
    path = (root or project_root()) / "models.yaml"
    return parse(ModelsFile, _read_yaml(path), str(path))
