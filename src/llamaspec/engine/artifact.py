"""The artifact record: a built llama-server under dist/<id>/ and how to find one."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llamaspec.errors import LlamaspecError

RPC_SERVER_NAMES = ("rpc-server", "ggml-rpc-server")  # the target's name varies by tree


@dataclass(frozen=True)
class Artifact:
    """A built llama-server with its libraries and manifest under dist/<id>/."""

    id: str
    path: Path
    manifest: dict
    reused: bool

    @property
    def server(self) -> Path:
        return self.path / "bin" / "llama-server"


def check_dist(dist: Path) -> Path:
    """Refuse an output folder that is a file or cannot be written, before any work.

    Nothing is left behind: a missing folder is not created yet, only shown creatable."""
    fix = "give --dist a directory you can write to"
    existing = dist.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = f"--dist {dist}" + ("" if existing == dist.absolute() else f" (its {existing})")
        raise LlamaspecError(f"{what} is a file, not a directory; {fix}.")
    try:
        probe = Path(tempfile.mkdtemp(prefix=".llamaspec-probe-", dir=existing))
    except OSError as exc:
        raise LlamaspecError(
            f"--dist {dist} cannot be written ({exc.strerror or exc} in {existing}); {fix}."
        ) from None
    probe.rmdir()
    return dist


def load_artifact(dist: Path, artifact_id: str) -> Artifact:
    """An existing artifact by id (or unique id prefix) from `dist`."""
    if not artifact_id or any(c in artifact_id for c in "/\\*?[]") or ".." in artifact_id:
        raise LlamaspecError(
            f"--artifact {artifact_id!r} is not an artifact id: give the name (or a unique "
            f"prefix of it) of a directory in {dist}, without path separators, '..' or "
            "wildcards, e.g. llamacpp-cpu-0123456789ab."
        )
    matches = [p for p in dist.glob(f"{artifact_id}*") if (p / "manifest.json").is_file()]
    if len(matches) != 1:
        known = sorted(p.name for p in dist.glob("*") if (p / "manifest.json").is_file())
        what = "matches several artifacts" if matches else "is not an artifact"
        raise LlamaspecError(
            f"{artifact_id!r} {what} in {dist}. Built artifacts: {', '.join(known) or '(none)'}; "
            "build one with `llamaspec build`."
        )
    path = matches[0]
    return Artifact(path.name, path, read_manifest(path / "manifest.json"), True)


def read_manifest(path: Path) -> dict:
    """An artifact's manifest.json; one paragraph when it is not one llamaspec wrote."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "it is not valid JSON"
        raise LlamaspecError(
            f"{path} cannot be read ({why}): the artifact is damaged. Remove {path.parent} and "
            "build it again (`llamaspec build`), or name another with --artifact."
        ) from None
    if not isinstance(data, dict):
        raise LlamaspecError(
            f"{path} is not an artifact manifest (a JSON object): the artifact is damaged. "
            f"Remove {path.parent} and build it again (`llamaspec build`), or name another "
            "with --artifact."
        )
    return data


def newest_artifact(dist: Path, engine: str | None = None) -> str:
    """The id of the most recently built artifact in `dist` (of `engine` when given)."""
    found = sorted(
        (
            p
            for p in dist.glob("*/manifest.json")
            if engine is None or read_manifest(p).get("engine") == engine
        ),
        key=lambda p: p.stat().st_mtime,
    )
    if not found:
        which = f"{engine} " if engine else ""
        hint = f" --engine {engine}" if engine else ""
        raise LlamaspecError(
            f"No {which}artifact in {dist}/; build one first (`llamaspec build{hint}`) or "
            "pass --artifact."
        )
    return found[-1].parent.name
