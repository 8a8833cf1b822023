"""Loading and validating every file llamaspec reads, in one place: this package is the
facade (`from llamaspec import config`; `config.load_recipes()`, `config.Recipe`) over one
module per schema and the strict YAML loader they share.

- `config.loader`: YAML read strictly (a duplicated key is an error), the frozen base model
  (`Frozen`), the field types the schemas share, `parse` and its one-paragraph errors
- `config.engines`: engines.yaml, and the CUDA toolkit wheels llamaspec.lock pins
- `config.patches`: patches/series.yaml, the patch catalog and the known defects
- `config.models`: models.yaml, model files and pairs
- `config.recipes`: recipes/NAME.yaml
- `config.prompts`: the user's prompts files for `verify --prompts` (JSON Lines)
- `config.user`: the user's own build defaults (config.yaml in the user config dir)
- `config.schemas`: the JSON Schemas of recipes, models.yaml and the user config, committed
  under docs/reference/schemas/ (`nox -s schemas` writes them)

Execution modules receive the frozen objects defined here, never raw dicts.

May import: llamaspec.errors, llamaspec.paths.
"""

from __future__ import annotations

from llamaspec.config.engines import (
    ENGINES,
    CudaToolkitLock,
    CudaWheel,
    CudaWheelFile,
    Engine,
    EnginesFile,
    HistoryPin,
    PypiMirror,
    known_pins,
    load_engines,
    record_for,
)
from llamaspec.config.loader import (
    FULL_SHA,
    SHA256,
    Frozen,
    load_yaml_text,
    parse,
    read_yaml,
)
from llamaspec.config.models import ModelFile, ModelsFile, Pair, derived_name, load_models
from llamaspec.config.patches import (
    Defect,
    Landed,
    PatchEntry,
    PatchSource,
    SeriesFile,
    Upstream,
    load_defects,
    load_series,
)
from llamaspec.config.prompts import MAX_N_PREDICT, ChatMessage, PromptLine, load_prompts
from llamaspec.config.recipes import (
    SPEC_TYPES,
    Crossover,
    Measured,
    Placement,
    Recipe,
    Reported,
    ServerSettings,
    Serving,
    SpecSettings,
    load_recipes,
)

__all__ = [
    "ENGINES",
    "FULL_SHA",
    "MAX_N_PREDICT",
    "SHA256",
    "SPEC_TYPES",
    "ChatMessage",
    "Crossover",
    "CudaToolkitLock",
    "CudaWheel",
    "CudaWheelFile",
    "Defect",
    "Engine",
    "EnginesFile",
    "Frozen",
    "HistoryPin",
    "Landed",
    "Measured",
    "ModelFile",
    "ModelsFile",
    "Pair",
    "PatchEntry",
    "PatchSource",
    "Placement",
    "PromptLine",
    "PypiMirror",
    "Recipe",
    "Reported",
    "SeriesFile",
    "ServerSettings",
    "Serving",
    "SpecSettings",
    "Upstream",
    "derived_name",
    "known_pins",
    "load_defects",
    "load_engines",
    "load_models",
    "load_prompts",
    "load_recipes",
    "load_series",
    "load_yaml_text",
    "parse",
    "read_yaml",
    "record_for",
]
