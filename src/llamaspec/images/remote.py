"""Registries: what a registry address may look like, what a registry's refusal means, and
the metadata calls (an image's digest and labels, a repository's tags) under a short
deadline of their own; only layer transfers get the long one.

`classify` reads the text a container tool or skopeo printed when a registry turned it
down and names what happened (credentials, a missing tag, a server error, TLS, no answer,
not reachable); `explain` says so in one paragraph with the fix. The texts it knows are
the tools' own (tests/unit/test_registry_errors.py holds captured ones).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from llamaspec import procs
from llamaspec.errors import LlamaspecError

# One metadata exchange with a registry (skopeo inspect, list-tags), start to end.
METADATA_S = 30
# Tags listed in a "no such tag" refusal before "… and N more".
TAGS_SHOWN = 12
# The form a registry address takes (`image_ref` appends `/llamaspec:TAG`).
FORM = "HOST[:PORT][/NAMESPACE...] in lower case, e.g. ghcr.io/OWNER or 127.0.0.1:5000/team"
_HOST = r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:.]+\])"
_PATH = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"  # a path component, as OCI names allow
_ADDRESS = re.compile(rf"{_HOST}(?::(?P<port>\d{{1,5}}))?(?:/{_PATH})*")


def loopback(ref: str) -> bool:
    """Whether `ref`'s registry is on this machine's loopback, which (as Docker's engine
    does) is spoken to over plain HTTP: a test or mirror registry there has no TLS."""
    host = ref.split("/", 1)[0].rsplit(":", 1)[0] if "/" in ref else ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def tls_flags(ref: str) -> list[str]:
    """`--tls-verify=false` for a loopback registry (buildah, skopeo), else nothing."""
    return ["--tls-verify=false"] if loopback(ref) else []


def host_of(ref_or_registry: str) -> str:
    """The registry host (with its port) of an image reference or registry address."""
    return ref_or_registry.split("/", 1)[0]


def repository_of(ref: str) -> str:
    """`HOST[:PORT]/PATH` of `HOST[:PORT]/PATH[:TAG][@DIGEST]`."""
    name = ref.split("@", 1)[0]
    head, colon, tail = name.rpartition(":")
    return head if colon and "/" not in tail else name


# --- addresses ---------------------------------------------------------------------------


def check_registry(value: str, origin: str) -> str:
    """`value` when it is a registry address `image_ref` can put `/llamaspec:TAG` after;
    else a one-paragraph refusal naming where it came from (`origin`: `--registry`,
    `LLAMASPEC_REGISTRY`, "`registry` in FILE") and the form expected."""
    if not value.strip():
        if origin == "LLAMASPEC_REGISTRY":
            fix = (
                "Unset it (`unset LLAMASPEC_REGISTRY`) to use the user config's `registry` or "
                "the published ghcr.io/llamaspec, or set it to a registry"
            )
        else:
            fix = (
                "Name a registry, or leave the option out to use LLAMASPEC_REGISTRY, the user "
                "config's `registry` or the published ghcr.io/llamaspec; a registry is"
            )
        raise LlamaspecError(
            f"{origin} is empty ({value!r}), and an empty registry is not the default one. "
            f"{fix}: {FORM}."
        )
    match = _ADDRESS.fullmatch(value)
    if match and 0 < int(match.group("port") or 1) < 65536:
        return value
    why, fixed = _malformed(value)
    hint = f" Did you mean {fixed!r}?" if fixed and _ADDRESS.fullmatch(fixed) else ""
    raise LlamaspecError(
        f"{origin} {value!r} is not a registry address: {why}. Give it as {FORM}.{hint}"
    )


def _malformed(value: str) -> tuple[str, str | None]:
    """What is wrong with a registry address, and the address it probably meant."""
    text = value.strip()
    scheme = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text)
    text = text[scheme.end() :] if scheme else text
    fixed = None if re.search(r"\s", text) else text.rstrip("/").lower()
    if scheme:
        return f"it starts with a scheme ({scheme.group(0)}), which image names have none of", fixed
    if re.search(r"\s", value):
        return "it has spaces in it", fixed
    if value != value.lower():
        return "registry addresses and image names are lower case", fixed
    if value.endswith("/"):
        return "it ends with '/'", fixed
    if ".." in value or "//" in value or "/." in value:
        return "it has an empty or dot-only part ('..', '//')", None
    port = re.match(r"^[^/]*:(\d+)", value)
    if port and not 0 < int(port.group(1)) < 65536:
        return f"port {port.group(1)} is not between 1 and 65535", None
    if "@" in value or re.search(r"/[^/]*:", value):
        return "it names an image (a tag or digest), not a registry", None
    return "it has characters an image name cannot have", None


# --- what a registry's answer means ------------------------------------------------------

Kind = Literal["unreachable", "timeout", "tls", "server", "authfile", "auth", "missing", "other"]

# Checked in this order; the first kind with a word in the (lower-cased) text wins.
_WORDS: tuple[tuple[Kind, tuple[str, ...]], ...] = (
    ("authfile", ("checking authfile",)),
    (
        "unreachable",
        (
            "no such host",
            "dial tcp",
            "connection refused",
            "network is unreachable",
            "no route to host",
            "temporary failure in name resolution",
            "could not resolve",
            "connect: ",
        ),
    ),
    (
        "timeout",
        (
            "context deadline exceeded",
            "i/o timeout",
            "tls handshake timeout",
            "client.timeout exceeded",
            "timeout awaiting response headers",
            "did not finish within",
        ),
    ),
    (
        "tls",
        (
            "x509:",
            "tls:",
            "certificate",
            "server gave http response to https client",
        ),
    ),
)
_SERVER = re.compile(
    r"(status code from registry|unexpected http status:?|status code|http code:?)\s*5\d\d"
    r"|\b5\d\d (internal server error|bad gateway|service unavailable|gateway timeout)",
    re.I,
)
_AUTH = (
    "unauthorized",
    "authentication required",
    "invalid username/password",
    "incorrect username or password",
    "denied",
    "no basic auth credentials",
    "403 forbidden",
    "docker login",
)
_MISSING = ("manifest unknown", "name unknown", "not found", "404")


def classify(output: str) -> Kind:
    """What a registry's refusal, as a tool printed it, means."""
    text = output.lower()
    for kind, words in _WORDS:
        if any(w in text for w in words):
            return kind
    if _SERVER.search(output):
        return "server"
    if any(w in text for w in _AUTH):
        return "auth"
    if any(w in text for w in _MISSING):
        return "missing"
    return "other"


def last_line(output: str) -> str:
    """The line of a tool's output that says why (its last non-empty one), unwrapped from
    skopeo's `level=fatal msg="…"`."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[-1]
    m = re.search(r'level=fatal msg="(.*)"\s*$', line)
    return m.group(1).replace('\\"', '"') if m else line


def explain(kind: Kind, host: str, said: str, push: bool = False) -> str:
    """The paragraph for a registry's refusal of `kind` (not `missing`, which says which
    tags there are, nor `unreachable`): what happened and what to do."""
    named = re.search(r"stat (\S+): no such file", said)
    said = f" ({said})" if said else ""
    login = f"buildah login {' '.join(tls_flags(host + '/'))} {host}".replace("  ", " ")
    if kind == "authfile":
        auth_file = named.group(1) if named else os.environ.get("REGISTRY_AUTH_FILE", "")
        return (
            f"REGISTRY_AUTH_FILE names {auth_file or 'a file'}, which does not exist{said}. "
            f"Log in to create it (`{login}`), or unset REGISTRY_AUTH_FILE to use the default "
            "credentials file."
        )
    if kind == "auth":
        need = "write:packages" if push else "read:packages"
        return (
            f"The registry {host} refused access without valid credentials{said}. Log in "
            f"first: `docker login {host}` for docker, `{login}` for buildah and "
            "skopeo (they keep credentials in ${XDG_RUNTIME_DIR}/containers/auth.json, or in "
            "the file REGISTRY_AUTH_FILE names); on ghcr.io the password is a GitHub token with "
            f"{need}. Stored credentials that expired get the same answer: log in again. "
            "Registries answer this way also for a repository that does not exist or is "
            "private, so check the name too."
        )
    if kind == "server":
        return (
            f"The registry {host} answered with a server error{said}: the registry failed, "
            "not the request. Try again later; if it persists, its operator has to look "
            "(its status page or logs)."
        )
    if kind == "tls":
        return (
            f"The TLS connection to the registry {host} failed{said}: its certificate is not "
            "trusted here, or it does not speak TLS on that port. Trust its CA (docker: "
            f"/etc/docker/certs.d/{host}/ca.crt; buildah and skopeo: "
            f"/etc/containers/certs.d/{host}/ca.crt) or use its TLS port; only a registry on "
            "loopback is spoken to over plain HTTP."
        )
    if kind == "timeout":
        return (
            f"The registry {host} did not answer within {METADATA_S} s{said}: something "
            "accepted the connection (or a firewall or proxy held it) and sent nothing back. "
            "Check that the address is a registry and that no proxy holds the connection, "
            "then try again."
        )
    return f"The registry {host} refused the request{said}."


def push_error(output: str, ref: str) -> LlamaspecError:
    """What a failed push means, in one paragraph."""
    kind, said, host = classify(output), last_line(output), host_of(ref)
    if kind == "unreachable":
        return LlamaspecError(
            f"Cannot reach the registry {host} to push {ref} ({said or 'no answer'}). Check "
            "the address, the network or proxy."
        )
    if kind == "missing":
        return LlamaspecError(
            f"The registry {host} has no repository to push {ref} to ({said}): create it "
            "there, or push to a namespace you own (`--registry HOST/NAMESPACE`)."
        )
    if kind == "other":
        return LlamaspecError(f"Cannot push {ref}: {said or 'the push failed'}.")
    return LlamaspecError(f"Cannot push {ref}. " + explain(kind, host, said, push=True))


# --- metadata: skopeo under a short deadline ---------------------------------------------


class RemoteError(Exception):
    """skopeo could not read from a registry (its output says why)."""


@dataclass(frozen=True)
class RemoteImage:
    """What a registry says about a tag: the manifest digest it points at, and the labels
    of the image's config (no layer is downloaded)."""

    digest: str
    labels: Mapping[str, str]


def _skopeo(skopeo: str, command: str, ref: str) -> str:
    """`skopeo COMMAND docker://REF` with METADATA_S for the whole exchange; its stdout."""
    argv = [skopeo, "--command-timeout", f"{METADATA_S}s", command, *tls_flags(ref)]
    try:
        proc = procs.run(
            [*argv, f"docker://{ref}"],
            timeout=METADATA_S + 10,
            check=False,
            what=f"skopeo {command}",
        )
    except LlamaspecError as err:  # the deadline: skopeo did not stop by itself
        raise RemoteError(err.message) from None
    if proc.returncode != 0:
        raise RemoteError(proc.stderr or proc.stdout or f"skopeo exited {proc.returncode}")
    return proc.stdout


def inspect(ref: str, which: Callable[[str], str | None] = shutil.which) -> RemoteImage | None:
    """The digest and labels of `ref` in its registry (`skopeo inspect`: manifest and
    config only); None where skopeo is not installed."""
    skopeo = which("skopeo")
    if not skopeo:
        return None
    data = _json(_skopeo(skopeo, "inspect", ref), "inspect", ref)
    digest = data.get("Digest") or ""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise RemoteError(f"skopeo inspect named no manifest digest for {ref} ({digest!r})")
    return RemoteImage(digest, data.get("Labels") or {})


def list_tags(repository: str, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The tags of `repository` (`skopeo list-tags`); RemoteError when they cannot be read
    (skopeo missing included)."""
    skopeo = which("skopeo")
    if not skopeo:
        raise RemoteError("skopeo is not installed")
    tags = _json(_skopeo(skopeo, "list-tags", repository), "list-tags", repository).get("Tags")
    return sorted(t for t in tags or [] if isinstance(t, str))


def _json(text: str, command: str, ref: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise RemoteError(f"skopeo {command} printed no JSON object for {ref}: {text[:200]!r}")
    return data


def tags_sentence(repository: str, tags: Sequence[str] | None, why: str = "") -> str:
    """Which tags `repository` has, for a "no such tag" refusal."""
    if tags is None:
        how = f"`skopeo list-tags docker://{repository}`"
        return f"See the tags of {repository} ({how}{'; ' + why if why else ''})."
    if not tags:
        return f"{repository} has no tags there at all (is the namespace right?)."
    more = len(tags) - TAGS_SHOWN
    shown = ", ".join(tags[:TAGS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    return f"The tags there: {shown}."
