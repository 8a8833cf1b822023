"""Every `LLAMASPEC_*` environment variable, declared once: its name, what it changes and
its default. The docs' reference page (reference/environment.md) is rendered from this table
when the site is built, and a unit test (tests/unit/test_env.py) fails when the code reads a
variable the table lacks or the table names one nothing reads.

A variable of kind `seconds` is read through `seconds` and checked by `check` when a
command starts: a value that is not a positive finite number is one paragraph naming it.

A base module: of llamaspec's, it imports only `errors`."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

from llamaspec.errors import LlamaspecError

LLAMASPEC = "llamaspec"  # read by the llamaspec command (and the nox sessions)
IMAGE = "image"  # read inside a built image (docker/entrypoint.sh, docker/healthcheck.sh)


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: `default` is text for readers, not a value to parse."""

    name: str
    meaning: str
    default: str
    read_by: str = LLAMASPEC
    kind: str = "text"  # "seconds": a positive finite number, checked by `check`


CACHE = EnvVar(
    "LLAMASPEC_CACHE",
    "The cache directory: engine sources, build trees, ccache, downloaded models and "
    "toolkits, reference copies, image build logs. Must be writable.",
    "the platform's user cache dir (`~/.cache/llamaspec` on Linux)",
)
DATA = EnvVar(
    "LLAMASPEC_DATA",
    "The user data directory of an installed llamaspec used outside a checkout: the lock, "
    "tuned recipes, `dist/` and `reports/`.",
    "the platform's user data dir (`~/.local/share/llamaspec` on Linux)",
)
CONFIG_DIR = EnvVar(
    "LLAMASPEC_CONFIG_DIR",
    "The user config directory: your own `models.yaml` (models and pairs) and "
    "`recipes/*.yaml`, read over the project's. Only read, never written.",
    "the platform's user config dir (`~/.config/llamaspec` on Linux)",
)
CONFIG = EnvVar(
    "LLAMASPEC_CONFIG",
    "The user config file (build defaults, `registry`). When set, the file must exist.",
    "`config.yaml` in the platform's user config dir (`~/.config/llamaspec/config.yaml`), "
    "whatever `LLAMASPEC_CONFIG_DIR` says",
)
ROOT = EnvVar(
    "LLAMASPEC_ROOT",
    "Where the catalogs (`engines.yaml`, `models.yaml`, `patches/`, `recipes/`) live. "
    "Inside an image the entrypoint reads it as the install root.",
    "the checkout holding `engines.yaml` (the working directory or a parent), else the "
    "catalogs installed with the package; `/opt/llamaspec` in an image",
)
SERVER_READY_TIMEOUT = EnvVar(
    "LLAMASPEC_SERVER_READY_TIMEOUT",
    "Seconds to wait for a llama-server that llamaspec started (smoke, verify, bench, tune) "
    "to answer `/health` before giving up: a number greater than 0 (`1800`, `2.5`); empty "
    "is unset.",
    "900 (a Vulkan smoke test sets 3600 for itself when unset)",
    kind="seconds",
)
SMOKE_STRICT_ON_SOFTWARE = EnvVar(
    "LLAMASPEC_SMOKE_STRICT_ON_SOFTWARE",
    "Any non-empty value runs the smoke test's F32 comparison even when the only Vulkan "
    "device is a software one (lavapipe, SwiftShader), where it costs minutes of shader "
    "compiles.",
    "unset: skipped there",
)
DEBIAN_MIRROR = EnvVar(
    "LLAMASPEC_DEBIAN_MIRROR",
    "The Debian mirror the Vulkan headers (`spirv-headers`) and `docker base` (debootstrap) "
    "download from.",
    "`http://deb.debian.org/debian`",
)
PYPI_URL = EnvVar(
    "LLAMASPEC_PYPI_URL",
    "The PyPI JSON API `bump` asks whether an engine's source mirror has a newer sdist.",
    "`https://pypi.org/pypi`",
)
REGISTRY = EnvVar(
    "LLAMASPEC_REGISTRY",
    "The registry `docker pull` pulls from when `--registry` is not given; it wins over the "
    "user config's `registry`.",
    "the user config's `registry`, else `ghcr.io/llamaspec`",
)
SOURCE_URL = EnvVar(
    "LLAMASPEC_SOURCE_URL",
    "The repository URL an image build writes into its `org.opencontainers.image.source` label.",
    "`pyproject.toml`'s `[project.urls]` Source, else the checkout's git remote `origin` "
    "(as an https URL)",
)
SIGNER_REPO = EnvVar(
    "LLAMASPEC_SIGNER_REPO",
    "The GitHub repository (`OWNER/REPO`) whose `docker.yml` workflow must have signed an image "
    "`docker pull` accepts (a fork that publishes under another name sets it).",
    "`OWNER/llamaspec` for a `ghcr.io/OWNER` registry, else `llamaspec/llamaspec`",
)
CA_BUNDLE = EnvVar(
    "LLAMASPEC_CA_BUNDLE",
    "A CA bundle (a TLS-inspecting proxy's CA in it) handed to an image's build stage as a "
    "secret, never stored in a layer.",
    "`PIP_CERT`, else `SSL_CERT_FILE`, else `REQUESTS_CA_BUNDLE`, else "
    "`/etc/ssl/certs/ca-certificates.crt` where it exists",
)
BUILDX_CACHE = EnvVar(
    "LLAMASPEC_BUILDX_CACHE",
    "A docker buildx cache (`type=gha,scope=NAME`, `type=local,src=DIR`, ...): image builds "
    "with docker read it (`--cache-from`) and write it (`--cache-to`, `mode=max`). The "
    "publishing workflow sets it; buildah ignores it.",
    "unset: buildx's own cache only",
)
HOST = EnvVar(
    "LLAMASPEC_HOST",
    "The address llama-server listens on in a container, when neither `--host` nor "
    "`LLAMA_ARG_HOST` is given.",
    "`0.0.0.0`",
    IMAGE,
)
PORT = EnvVar(
    "LLAMASPEC_PORT",
    "The port llama-server listens on in a container, when neither `--port` nor "
    "`LLAMA_ARG_PORT` is given; the health check falls back to it.",
    "`8080`",
    IMAGE,
)
PORT_FILE = EnvVar(
    "LLAMASPEC_PORT_FILE",
    "Where the entrypoint writes the port it started llama-server on, and the health check "
    "reads it.",
    "`/tmp/llamaspec.port`",
    IMAGE,
)
SPEC_GATE = EnvVar(
    "LLAMASPEC_SPEC_GATE",
    "The speculation gate of `serve` and of an image's health check (a draft model or MTP "
    "head loaded, nothing drafted): `off` leaves it out (no `--metrics` added, no watcher, "
    "no check); in an image, `fail` makes the container unhealthy instead of only saying so.",
    "`warn`: `serve` and the health check print the gate's paragraph",
)
GATE_FILE = EnvVar(
    "LLAMASPEC_GATE_FILE",
    "Where the entrypoint writes what speculation is loaded (and the likely cause and fix of "
    "a draft that drafts nothing), and the health check reads it.",
    "`/tmp/llamaspec.gate`",
    IMAGE,
)
GATE_TOKENS = EnvVar(
    "LLAMASPEC_GATE_TOKENS",
    "How many generated tokens the health check waits for before it judges a loaded draft "
    "that has drafted nothing.",
    "`64`",
    IMAGE,
)
GATE_LOG = EnvVar(
    "LLAMASPEC_GATE_LOG",
    "Where the health check writes the speculation gate's paragraph once (besides its own "
    "output, which `docker inspect` shows).",
    "`/proc/1/fd/2`: the server's stderr, which `docker logs` shows",
    IMAGE,
)

VARIABLES: tuple[EnvVar, ...] = (
    CACHE,
    DATA,
    CONFIG_DIR,
    CONFIG,
    ROOT,
    SERVER_READY_TIMEOUT,
    SMOKE_STRICT_ON_SOFTWARE,
    DEBIAN_MIRROR,
    PYPI_URL,
    REGISTRY,
    SOURCE_URL,
    SIGNER_REPO,
    CA_BUNDLE,
    BUILDX_CACHE,
    HOST,
    PORT,
    PORT_FILE,
    SPEC_GATE,
    GATE_FILE,
    GATE_TOKENS,
    GATE_LOG,
)
BY_NAME = {v.name: v for v in VARIABLES}

_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


def raw(var: EnvVar) -> str | None:
    """`var`'s value as set (an empty one included: some refuse it), None when unset."""
    return os.environ.get(var.name)


def get(var: EnvVar) -> str | None:
    """`var`'s value, None when it is unset or empty: every `LLAMASPEC_*` read goes through
    here with the declaration, never with its name written out (a unit test keeps it so)."""
    return os.environ.get(var.name) or None


def seconds(var: EnvVar, default: float) -> float:
    """`var`'s value as seconds (`default` when unset or empty); a value that is not a
    plain positive number (`abc`, `nan`, `-1`, `0`, `1e999`) is a LlamaspecError."""
    raw = os.environ.get(var.name, "")
    if raw == "":
        return default
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not (math.isfinite(value) and value > 0):
        raise LlamaspecError(
            f"The environment variable {var.name} is {raw!r}, which is not a number of "
            f"seconds greater than 0 (it says how long llamaspec waits for a server it "
            f"started to answer /health). Set it to a plain number such as "
            f"`{var.name}=1800`, or unset it for the default ({var.default.split()[0]})."
        )
    return value


def check() -> None:
    """Refuse, before a command does anything, a variable whose value its kind rules out."""
    for var in VARIABLES:
        if var.kind == "seconds" and var.read_by == LLAMASPEC:
            seconds(var, 1.0)


def _table(variables: list[EnvVar]) -> list[str]:
    out = ["| Variable | What it changes | When unset |", "| --- | --- | --- |"]
    for v in variables:
        cells = (f"`{v.name}`", v.meaning, v.default)
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def markdown() -> str:
    """The docs' page: one table for the llamaspec command, one for inside an image."""
    out = [
        "# Environment variables",
        "",
        "Generated from `src/llamaspec/env.py` when the site is built. A command-line option "
        "that says the same thing wins over the environment.",
        "",
        "## llamaspec",
        "",
        *_table([v for v in VARIABLES if v.read_by == LLAMASPEC]),
        "",
        "## Inside an image",
        "",
        "Read by the image's entrypoint and health check (`docker run -e NAME=VALUE`).",
        "",
        *_table([v for v in VARIABLES if v.read_by == IMAGE]),
        "",
    ]
    return "\n".join(out)
