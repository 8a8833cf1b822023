"""models.yaml: the model files (where each GGUF comes from and how to verify it) and the
pairs (a target and its speculation partner), merged with the user's own models.yaml."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
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


def derived_name(source_file: str, source_sha256: str, dtype: str = "f32") -> str:
    """The file name of the `dtype` copy of a GGUF whose sha256 is `source_sha256`: a derived
    model's `file`, and the strict tier's reference copy (the two are one file)."""
    return f"{PurePosixPath(source_file).stem}-{source_sha256[:16]}-{dtype}.gguf"


class ModelFile(Frozen):
    """One GGUF model: where it comes from, what it is, and how to verify it.

    `source: derived` is a model made here rather than downloaded: the full-precision copy
    (`dtype`, F32 only) of the model `derived_from`, made on first use by models/derived.py
    and checked against `sha256` (when given) after it is made."""

    source: Literal["hf", "embedded", "derived"] = "hf"
    repo: RepoId | None = None
    derived_from: Handle | None = None
    dtype: Literal["f32"] | None = None
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
        derived = self.source == "derived"
        if derived and (self.derived_from is None or self.dtype is None):
            raise ValueError("a derived model needs `derived_from` (a model) and `dtype: f32`")
        if not derived and (self.derived_from is not None or self.dtype is not None):
            raise ValueError("`derived_from` and `dtype` belong to `source: derived` only")
        if derived and (self.repo or self.revision or isinstance(self.sha256, tuple)):
            raise ValueError(
                "a derived model is made here, not downloaded: drop `repo` and `revision` "
                "(and give one sha256: the copy is a single file)"
            )
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
    """A matched target and its speculation partner (a draft model, MTP heads or n-grams).

    A draft that is not smaller than its target is refused before anything runs (each
    draft token would cost what a target token costs), unless the pair says `plumbing:
    true`: kept to prove the draft path works, never to be faster (a model drafting for
    itself); such a pair gets a warning instead."""

    target: Handle
    draft: Handle | None = None
    spec: Literal["draft", "mtp", "ngram"] = "draft"
    plumbing: bool = False
    notes: str = ""
    reported: str = ""

    @model_validator(mode="after")
    def _draft_matches_spec(self) -> Pair:
        if self.spec == "draft" and self.draft is None:
            raise ValueError("spec 'draft' needs a `draft` model")
        if self.spec != "draft" and self.draft is not None:
            raise ValueError(f"spec {self.spec!r} uses no draft model; drop `draft`")
        if self.plumbing and self.draft is None:
            raise ValueError("`plumbing` is for a pair with a draft model; drop it")
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
    for name, model in parsed.models.items():
        if model.source == "derived":
            _check_derived(name, model, parsed, where)
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


def _check_derived(name: str, model: ModelFile, parsed: ModelsFile, where: str) -> None:
    """A derived model is made from one verified file: a model under `models:` that is not
    derived itself, a single file whose sha256 models.yaml records; its `file` is the name
    the copy gets (`derived_name`)."""
    handle = str(model.derived_from)
    source = parsed.models.get(handle)
    if source is None:
        raise LlamaspecError(
            f"{where}: model {name!r} is derived from {handle!r}, which is not under "
            f"`models:`.{did_you_mean(handle, parsed.models)}"
        )
    if source.source == "derived" or len(source.parts) > 1 or not isinstance(source.sha256, str):
        raise LlamaspecError(
            f"{where}: model {name!r} is derived from {handle!r}, but a copy is made from one "
            "verified file: a downloaded or embedded model (not another derived one), in one "
            "part, whose `sha256` models.yaml records."
        )
    want = derived_name(source.file, source.sha256, str(model.dtype))
    if model.file != want:
        raise LlamaspecError(
            f"{where}: model {name!r} is the {model.dtype} copy of {handle!r}, which is made "
            f"as {want}; write `file: {want}`."
        )
