"""Smoke-testing an image: the same smoke test as a local build, run against the image's own
llama-server (through a shim), plus the image's HEALTHCHECK against a running and a stopped
server, its labels against the manifest inside it, and its files' bytes against that
manifest's sha256s (and, when asked, against a host build of the same artifact id)."""

from __future__ import annotations

import json
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from llamaspec import env as envvars
from llamaspec.engine import backends
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact, load_artifact
from llamaspec.errors import LlamaspecError
from llamaspec.images import specs as images
from llamaspec.images import tools
from llamaspec.images.tools import ContainerTool, attempt

ROOT = "/opt/llamaspec"
MANIFEST = f"{ROOT}/manifest.json"
HEALTHCHECK_S = 60


def server_shim(
    tool: ContainerTool,
    ctr: str,
    model_dir: Path,
    where: Path,
    env: Mapping[str, str] | None = None,
) -> Path:
    """An executable `bin/llama-server` that runs the image's server with the models mounted
    at /models, so the smoke code drives the image exactly as it drives a local build."""
    argv = tool.run_argv(  # the host talks to this server: the host's network
        ctr,
        ["/opt/llamaspec/bin/llama-server"],
        [(model_dir, images.CONTAINER_MODELS)],
        env,
        network=True,
    )
    shim = where / "bin" / "llama-server"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n')
    shim.chmod(0o755)
    return shim


def labels_match_manifest(labels: Mapping[str, str], manifest: Mapping, ref: str) -> None:
    """The image's io.llamaspec.* labels must say what its manifest.json says."""
    want = images.build_labels(manifest)
    got = {k.removeprefix(images.LABEL_PREFIX): v for k, v in labels.items()}
    wrong = [k for k, v in want.items() if got.get(k) != v]
    if wrong:
        raise LlamaspecError(
            f"{ref}: labels {', '.join(wrong)} do not match the manifest inside the image."
        )


# For each name: `sha256  name`, or `->target  name` for a symbolic link.
_HASH_FILES = (
    'cd "$0" && for f in "$@"; do if [ -L "$f" ]; then '
    'printf \'%s  %s\\n\' "->$(readlink "$f")" "$f"; else sha256sum "$f"; fi; done'
)


def image_files(tool: ContainerTool, ctr: str, names: list[str]) -> dict[str, str]:
    """sha256 (or `->target` for links) of files under /opt/llamaspec inside the image."""
    proc = attempt(tool.run_argv(ctr, ["sh", "-c", _HASH_FILES, ROOT, *names]), HEALTHCHECK_S)
    out = {}
    for line in proc.stdout.splitlines():
        value, sep, name = line.partition("  ")
        if sep:
            out[name] = value
    return out


def check_files(
    tool: ContainerTool, ctr: str, manifest: Mapping, ref: str, compare_dist: Path | None
) -> dict:
    """The image's bin/ and lib/ must hold the bytes its manifest names; with `compare_dist`,
    also the bytes of the host artifact with the same id there (a second build of the same
    inputs: see docs/maintainers/reproducible.md)."""
    want = manifest.get("files_sha256")
    if not want:
        if compare_dist:
            raise LlamaspecError(
                f"{ref}: its manifest records no files_sha256 (built by an older llamaspec), so "
                "there is nothing to compare with --compare-dist; rebuild the image."
            )
        return {"checked": False}
    got = image_files(tool, ctr, sorted(want))
    wrong = repro.compare(want, got)
    if wrong:
        raise LlamaspecError(
            f"{ref}: {', '.join(wrong)} in {ROOT} do not match the sha256 the image's own "
            "manifest records; the image was changed after it was built. Rebuild or re-pull it."
        )
    out: dict = {"checked": True, "files": len(want)}
    if compare_dist:
        host = load_artifact(compare_dist, manifest["artifact_id"])
        theirs = host.manifest.get("files_sha256") or repro.shipped(host.path)
        differ = repro.compare(theirs, got)
        out["host"] = {"artifact": str(host.path), "equal": not differ, "differing": differ}
        if differ:
            raise LlamaspecError(
                f"{ref} holds other bytes than the host build {host.path} of the same artifact "
                f"id: {', '.join(differ)} differ. Both builds should be identical (same inputs, "
                "same toolchain); compare the two manifests' toolchain entries, and see "
                "docs/maintainers/reproducible.md."
            )
    return out


def healthcheck(tool: ContainerTool, ctr: str, port: int) -> bool:
    """Whether the image's HEALTHCHECK script calls the server on `port` healthy."""
    argv = ["env", f"{envvars.PORT.name}={port}", "/opt/llamaspec/bin/healthcheck.sh"]
    return attempt(tool.run_argv(ctr, argv, network=True), HEALTHCHECK_S).returncode == 0


def smoke_image(
    tool_name: str | None,
    ref: str,
    reports: Path,
    console: Console,
    root: Path | None = None,
    compare_dist: Path | None = None,
):
    """The smoke test, run against the image's own llama-server, plus its HEALTHCHECK.

    `tool_name`: the container tool asked for (None: the one found), looked for after the
    image's name is checked, so that a bad name is what is reported. `compare_dist`: a
    dist/ holding the host build of the same artifact id to compare with."""
    images.check_refs(("image", ref))
    tool = tools.detect(tool_name)
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.embedded import EMBEDDED_SHA256, embedded_model
    from llamaspec.proof.reference import reference_copy
    from llamaspec.proof.smoke import base_args, smoke
    from llamaspec.runtime.client import running

    labels = tool.labels(ref)
    model = embedded_model(console.print)
    # the F32 reference copy lives under the model directory, which the shim mounts
    reference = reference_copy(model, EMBEDDED_SHA256, console.print)
    inside_reference = Path(images.CONTAINER_MODELS) / reference.path.relative_to(model.parent)
    with (
        tool.working_container(ref) as ctr,
        tempfile.TemporaryDirectory(prefix="llamaspec-img-") as tmp,
    ):
        manifest = json.loads(tool.read_file(ctr, MANIFEST))
        labels_match_manifest(labels, manifest, ref)
        files = check_files(tool, ctr, manifest, ref, compare_dist)
        if files["checked"]:
            host = files.get("host")
            console.print(
                f"docker-smoke: {files['files']} files match the image's manifest"
                + (f"; identical to the host build {host['artifact']}" if host else "")
            )
        # without a GPU, ggml-vulkan uses a CPU device (lavapipe) only when asked to
        env = dict(backends.backend(manifest["backend"]).container_env) or None
        server = server_shim(tool, ctr, model.parent, Path(tmp), env)
        artifact = Artifact(manifest["artifact_id"], server.parent.parent, manifest, True)
        out = reports / f"docker-smoke-{manifest['artifact_id']}"
        inside_model = Path(images.CONTAINER_MODELS) / model.name
        report = smoke(
            artifact,
            dialect_for(artifact, console.print, root),
            inside_model,
            out,
            console,
            reference=inside_reference,
            reference_sha256=reference.sha256,
        )
        with running(server, base_args(inside_model), out / "logs" / "health.log") as srv:
            healthy = healthcheck(tool, ctr, srv.port)
        stopped = healthcheck(tool, ctr, srv.port)
    if not healthy or stopped:
        raise LlamaspecError(
            f"{ref}: the HEALTHCHECK script answered {'unhealthy' if not healthy else 'healthy'} "
            f"for a server that was {'running' if not healthy else 'stopped'}."
        )
    console.print(f"docker-smoke: {ref}: smoke PASSED, HEALTHCHECK ok")
    return report
