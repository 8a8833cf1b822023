"""The ground every schema stands on: YAML read strictly (a key given twice is an error),
the frozen base model, the field types the schemas share (commit SHAs, sha256 digests,
relative paths), and `parse`, which turns pydantic's errors into one paragraph naming the
file, the key and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from llamaspec.errors import LlamaspecError, did_you_mean

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


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


class Frozen(BaseModel):
    """Base of every config object: immutable, and unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


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
