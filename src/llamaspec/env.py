"""Every `LLAMASPEC_*` environment variable, declared once: its name, what it changes and
its default. The docs' reference page (reference/environment.md) is rendered from this table
when the site is built, and a unit test (tests/unit/test_env.py) fails when the code reads a
variable the table lacks or the table names one nothing reads.

Each variable has a kind (`seconds`, a directory, a file, a URL, one of some words, a
pattern, or free text) and `check` refuses, when a command starts, a value its kind rules
out: one paragraph naming the variable, whatever the command (tests/unit/test_generated_sweep.py
sets each to garbage of its kind). No value may hold a control character or run past
LONGEST characters.

A base module: of llamaspec's, it imports only `errors` and `pathcheck`."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from llamaspec import pathcheck
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
    kind: str = "text"  # one of KINDS: what `check` holds the value to
    choices: tuple[str, ...] = ()  # kind "choice": the words it takes (any case)
    pattern: str = ""  # kind "pattern": a regular expression the whole value matches
    form: str = ""  # kind "pattern": the form in words, for the refusal


CACHE = EnvVar(
    "LLAMASPEC_CACHE",
    "The cache directory: engine sources, build trees, ccache, downloaded models and "
    "toolkits, reference copies, image build logs. Must be writable.",
    "the platform's user cache dir (`~/.cache/llamaspec` on Linux)",
    kind="writable-dir",
)
DATA = EnvVar(
    "LLAMASPEC_DATA",
    "The user data directory of an installed llamaspec used outside a checkout: the lock, "
    "tuned recipes, `dist/` and `reports/`.",
    "the platform's user data dir (`~/.local/share/llamaspec` on Linux)",
    kind="writable-dir",
)
CONFIG_DIR = EnvVar(
    "LLAMASPEC_CONFIG_DIR",
    "The user config directory: your own `models.yaml` (models and pairs) and "
    "`recipes/*.yaml`, read over the project's. Only read, never written.",
    "the platform's user config dir (`~/.config/llamaspec` on Linux)",
    kind="dir",
)
CONFIG = EnvVar(
    "LLAMASPEC_CONFIG",
    "The user config file (build defaults, `registry`). When set, the file must exist.",
    "`config.yaml` in the platform's user config dir (`~/.config/llamaspec/config.yaml`), "
    "whatever `LLAMASPEC_CONFIG_DIR` says",
    kind="file",
)
ROOT = EnvVar(
    "LLAMASPEC_ROOT",
    "Where the catalogs (`engines.yaml`, `models.yaml`, `patches/`, `recipes/`) live. "
    "Inside an image the entrypoint reads it as the install root.",
    "the checkout holding `engines.yaml` (the working directory or a parent), else the "
    "catalogs installed with the package; `/opt/llamaspec` in an image",
    kind="dir",
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
    kind="url",
)
PYPI_URL = EnvVar(
    "LLAMASPEC_PYPI_URL",
    "The PyPI JSON API `bump` asks whether an engine's source mirror has a newer sdist.",
    "`https://pypi.org/pypi`",
    kind="url",
)
REGISTRY = EnvVar(
    "LLAMASPEC_REGISTRY",
    "The registry `docker pull` pulls from when `--registry` is not given; it wins over the "
    "user config's `registry`.",
    "the user config's `registry`, else `ghcr.io/llamaspec`",
    kind="pattern",
    pattern=r"[a-z0-9\[][a-z0-9.:_\[\]/-]*",  # the shape; images/remote.py checks the rest
    form="a registry address, HOST[:PORT][/NAMESPACE...] in lower case (ghcr.io/llamaspec)",
)
SOURCE_URL = EnvVar(
    "LLAMASPEC_SOURCE_URL",
    "The repository URL an image build writes into its `org.opencontainers.image.source` label.",
    "`pyproject.toml`'s `[project.urls]` Source, else the checkout's git remote `origin` "
    "(as an https URL)",
    kind="url",
)
SIGNER_REPO = EnvVar(
    "LLAMASPEC_SIGNER_REPO",
    "The GitHub repository (`OWNER/REPO`) whose `docker.yml` workflow must have signed an image "
    "`docker pull` accepts (a fork that publishes under another name sets it).",
    "`OWNER/llamaspec` for a `ghcr.io/OWNER` registry, else `llamaspec/llamaspec`",
    kind="pattern",
    pattern=r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+",
    form="a GitHub repository, OWNER/REPO (llamaspec/llamaspec)",
)
CA_BUNDLE = EnvVar(
    "LLAMASPEC_CA_BUNDLE",
    "A CA bundle (a TLS-inspecting proxy's CA in it) handed to an image's build stage as a "
    "secret, never stored in a layer.",
    "`PIP_CERT`, else `SSL_CERT_FILE`, else `REQUESTS_CA_BUNDLE`, else "
    "`/etc/ssl/certs/ca-certificates.crt` where it exists",
    kind="file",
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
    kind="pattern",
    pattern=r"[A-Za-z0-9.:_\[\]-]+",
    form="an address to listen on, a name or an IPv4 or IPv6 address (0.0.0.0)",
)
PORT = EnvVar(
    "LLAMASPEC_PORT",
    "The port llama-server listens on in a container, when neither `--port` nor "
    "`LLAMA_ARG_PORT` is given; the health check falls back to it.",
    "`8080`",
    IMAGE,
    kind="port",
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
    kind="choice",
    choices=("off", "warn", "fail"),
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
    kind="count",
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
    if _unlike(var, raw):  # the same rule `check` holds every seconds variable to
        raise LlamaspecError(
            f"The environment variable {var.name} is {raw!r}, which is not a number of "
            f"seconds greater than 0 (it says how long llamaspec waits for a server it "
            f"started to answer /health). Set it to a plain number such as "
            f"`{var.name}=1800`, or unset it for the default ({var.default.split()[0]})."
        )
    return float(raw)


KINDS = ("text", "seconds", "writable-dir", "dir", "file", "url", "choice", "pattern", "port")
KINDS += ("count",)  # the last two: read inside an image (docker/entrypoint.sh checks them)
LONGEST = 4096  # characters: no path, URL or name llamaspec reads is longer
# control characters, line and paragraph separators, and the direction overrides that make
# text read other than it is
UNSEEN = "\x7f\x85\u2028\u2029\u202a-\u202e\u2066-\u2069"
CONTROL = re.compile(f"[\x00-\x1f{UNSEEN}]")
_URL = re.compile(r"https?://[^\s/?#@]+(/[^\s]*)?")


def check() -> None:
    """Refuse, before a command does anything, a variable whose value its kind rules out;
    empty counts as unset (as `get` reads it)."""
    for var in VARIABLES:
        value = os.environ.get(var.name, "")
        if var.read_by != LLAMASPEC or value == "":
            continue
        if why := _unlike(var, value):
            raise LlamaspecError(
                f"The environment variable {var.name} is {_shown(value)}, which {why}. "
                f"Set it to {_wanted(var)}, or unset it (`unset {var.name}`) for the "
                f"default ({var.default.rstrip('.')})."
            )


def _shown(value: str) -> str:
    return repr(value if len(value) <= 200 else f"{value[:200]}…")


def _unlike(var: EnvVar, value: str) -> str | None:
    """Why `value` is not one `var`'s kind takes, or None."""
    if CONTROL.search(value):
        return "holds a control character (a line break, NUL, a direction override or the like)"
    if len(value) > LONGEST:
        return f"runs to {len(value):,} characters, more than the {LONGEST:,} any value takes"
    if var.kind == "seconds":
        number = float(value) if _NUMBER.fullmatch(value) else math.nan
        return None if math.isfinite(number) and number > 0 else "is not a number above 0"
    if var.kind == "port":
        ok = value.isascii() and value.isdigit() and len(value) <= 5 and 0 < int(value) < 65536
        return None if ok else "is not a port, a whole number from 1 to 65535"
    if var.kind == "count":
        ok = value.isascii() and value.isdigit() and len(value) <= 9
        return None if ok else "is not a whole number of 0 or more"
    if var.kind == "url":
        return None if _URL.fullmatch(value) else "is not an http:// or https:// URL"
    if var.kind == "choice":
        return None if value.lower() in var.choices else f"is not one of {', '.join(var.choices)}"
    if var.kind == "pattern":
        return None if re.fullmatch(var.pattern, value) else f"is not {var.form}"
    if var.kind in pathcheck.KINDS:
        return pathcheck.why_not(Path(value), var.kind)
    return None


def _wanted(var: EnvVar) -> str:
    return {
        "seconds": f"a plain number of seconds such as `{var.name}=1800`",
        "writable-dir": "a directory you can write into (created when missing)",
        "dir": "a directory that exists",
        "file": "a file that exists",
        "url": "an http:// or https:// URL",
        "choice": " or ".join(var.choices),
        "port": "a port from 1 to 65535",
        "count": "a whole number such as 64",
        "pattern": var.form,
    }.get(var.kind, "a value without control characters")


def _table(variables: list[EnvVar], takes: bool = False) -> list[str]:
    head = ("Variable", "What it changes", "When unset", *(("Takes",) if takes else ()))
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for v in variables:
        cells = (f"`{v.name}`", v.meaning, v.default, *((_wanted(v),) if takes else ()))
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
        "Each is checked when a command starts: a value it does not take (the last column; "
        f"none takes a control character or over {LONGEST:,} characters) is one paragraph "
        "naming it, before any work. An empty value counts as unset.",
        "",
        *_table([v for v in VARIABLES if v.read_by == LLAMASPEC], takes=True),
        "",
        "## Inside an image",
        "",
        "Read by the image's entrypoint and health check (`docker run -e NAME=VALUE`). The "
        "entrypoint refuses a value one does not take (the last column; none takes a control "
        "character) with a sentence naming it, before the server starts.",
        "",
        *_table([v for v in VARIABLES if v.read_by == IMAGE], takes=True),
        "",
    ]
    return "\n".join(out)
