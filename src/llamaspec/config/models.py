"""models.yaml: the model files (where each GGUF comes from and how to verify it) and the
pairs (a target and its speculation partner), merged with the user's own models.yaml."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from llamaspec.config.loader import Frozen, FullSha, Sha256, check_relative, parse, read_yaml
from llamaspec.errors import LlamaspecError, did_you_mean
from llamaspec.paths import project_root, user_config

HANDLE = r"^[a-z0-9][a-z0-9._-]*$"
HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")


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


def load_models(root: Path | None = None) -> ModelsFile:
    """models.yaml → the catalog, with every pair's models checked to exist."""
    path = (root or project_root()) / "models.yaml"
    raw, where = read_yaml(path), str(path)
    user = user_config() / "models.yaml"
    if user.exists() and not user.is_file():
        raise LlamaspecError(
            f"{user} is not a file; the user's models.yaml must be a YAML file (or absent)."
        )
    if user.is_file():  # the user's own models and pairs; theirs win on a shared name
        mine = read_yaml(user)
        if not isinstance(raw, dict) or not isinstance(mine, dict):
            bad = user if isinstance(raw, dict) else path
            raise LlamaspecError(f"{bad} must be a mapping with `models:` and `pairs:`.")
        if isinstance(mine, dict) and (unknown := set(mine) - {"models", "pairs"}):
            first = sorted(map(str, unknown))[0]
            raise LlamaspecError(
                f"{user}: unknown top-level key {first!r}; the file holds `models:` and "
                f"`pairs:` only.{did_you_mean(first, ['models', 'pairs'])}"
            )
        for key, file in ((k, f) for k in ("models", "pairs") for f in (user, path)):
            value = (mine if file == user else raw).get(key)
            if value is not None and not isinstance(value, dict):
                raise LlamaspecError(
                    f"{file}: `{key}:` must be a mapping of names to entries (name: {{...}}), "
                    f"not a {type(value).__name__}; see docs/guides/pairs-and-recipes.md for "
                    "the form."
                )
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
