"""The user's own build defaults: a YAML file in the user config dir.

Precedence: command line > this file > engine/backend profile (and its variants).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import BeforeValidator, Field, StrictBool, StrictInt, WithJsonSchema

from llamaspec import env
from llamaspec.config.loader import Frozen, parse, read_yaml
from llamaspec.errors import LlamaspecError


def _cmake_value(value: object) -> str:
    """YAML reads ON/OFF/yes as booleans; CMake wants the words back."""
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"{value!r} is not a CMake value (a string, number or ON/OFF)")


# the JSON Schema says what the file may hold (YAML's ON is a boolean, 86 a number), not
# the string it becomes
CMakeValue = Annotated[
    str,
    BeforeValidator(_cmake_value),
    WithJsonSchema({"type": ["string", "number", "boolean"]}, mode="validation"),
]


class BackendDefaults(Frozen):
    """Defaults for one backend; they override the file's top-level ones."""

    defines: dict[str, CMakeValue] = Field(default_factory=dict)
    variants: tuple[str, ...] | None = None
    cuda_arch: CMakeValue | None = None


class UserConfig(Frozen):
    """`config.yaml`: jobs, variants, defines and CUDA archs, overall or per backend; the
    registry `docker pull` uses."""

    jobs: Annotated[StrictInt, Field(gt=0)] | None = None  # `jobs: yes` is not 1
    variants: tuple[str, ...] = ()
    defines: dict[str, CMakeValue] = Field(default_factory=dict)
    cuda_arch: CMakeValue | None = None
    backends: dict[Literal["cpu", "cuda", "vulkan"], BackendDefaults] = Field(default_factory=dict)
    # `host[:port]/path`, e.g. ghcr.io/llamaspec or 127.0.0.1:5000/team
    registry: Annotated[str, Field(pattern=r"^[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)*$")] | None = None
    # `docker pull` refuses an image whose signature it cannot verify (cosign missing too)
    require_signature: StrictBool = False

    def for_backend(self, backend: str) -> BackendDefaults:
        """The file's defaults for `backend`, per-backend entries winning."""
        own = self.backends.get(backend)  # type: ignore[call-overload]
        if own is None:
            return BackendDefaults(
                defines=self.defines, variants=self.variants or None, cuda_arch=self.cuda_arch
            )
        return BackendDefaults(
            defines={**self.defines, **own.defines},
            variants=own.variants if own.variants is not None else (self.variants or None),
            cuda_arch=own.cuda_arch or self.cuda_arch,
        )


def config_path() -> Path:
    """LLAMASPEC_CONFIG, else `<user config dir>/llamaspec/config.yaml`."""
    given = env.get(env.CONFIG)
    return Path(given) if given else Path(platformdirs.user_config_dir("llamaspec")) / "config.yaml"


def load(path: Path | None = None) -> tuple[UserConfig, Path | None]:
    """The validated user config and where it came from (None: no file, all defaults)."""
    named = path is not None or bool(env.get(env.CONFIG))
    path = path or config_path()
    if named and not path.exists():
        raise LlamaspecError(
            f"LLAMASPEC_CONFIG names {path}, which does not exist. Point it at your config.yaml "
            "or unset it to use the default location."
        )
    if path.is_dir():
        raise LlamaspecError(
            f"The user config {path} is a directory; "
            + (
                "point LLAMASPEC_CONFIG at the config.yaml file inside it, or unset it."
                if named
                else "remove it or put a config.yaml file there."
            )
        )
    if not path.exists():
        return UserConfig(), None
    raw = read_yaml(path)
    return parse(UserConfig, raw if raw is not None else {}, str(path)), path
