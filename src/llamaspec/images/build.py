"""Building an image, in two phases, with whichever container tool `tools.detect` chose.

Phase one builds the `manifest` target and reads the manifest.json the build stage wrote;
phase two builds the `runtime` target with labels computed from it (the runtime stage
refuses labels that do not match its own tree), then checks the labels the image carries.
The build stage is cached between the phases (buildx cache, `buildah --layers`).
`build_requested` is `docker build` whole: an `ImageRequest` (the command's options) made
into a validated image spec (from its inputs, or from the manifest of the artifact it
carries), built with the container tool it names or finds. Also here: the bake file that
declares the same builds for `docker buildx bake`, and `push_record` (a build record's tags
pushed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from llamaspec import config, env, procs
from llamaspec.config import Engine
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.images import artifact as from_artifact
from llamaspec.images import registry
from llamaspec.images import specs as images
from llamaspec.images.tools import BUILD_S, ContainerTool, attempt, detect
from llamaspec.paths import cache_dir, is_packaged, project_root

LOG_TAIL = 40  # lines of a failed build's log shown
_URL_LINE = re.compile(r'^"?([A-Za-z][\w .-]*?)"?\s*=\s*"(https://[^"]+)"')  # Name = "https://…"


@dataclass(frozen=True)
class BuiltImage:
    """What `build_image` made: its references, labels and the manifest inside."""

    spec: images.ImageSpec
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    manifest: Mapping
    tool: str
    seconds: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "spec": self.spec.model_dump(),
            "tags": list(self.tags),
            "labels": dict(self.labels),
            "artifact_id": self.manifest["artifact_id"],
            "binary_sha256": self.manifest.get("binary_sha256"),
            "reproducible": self.manifest.get("reproducible"),
            "tool": self.tool,
            "seconds": dict(self.seconds),
        }


def load_record(path: Path) -> dict:
    """The JSON that `docker build --out` wrote (`BuiltImage.to_json`)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise LlamaspecError(
            f"Cannot read the build record {path} ({err}); give the file that "
            "`llamaspec docker build --out FILE` wrote."
        ) from None
    tags = record.get("tags") if isinstance(record, dict) else None
    if not tags or not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise LlamaspecError(
            f"{path} is not a build record (no tags, or an empty one); give the file that "
            "`llamaspec docker build --out FILE` wrote."
        )
    return record


def push_record(path: Path, tool: str = "auto") -> tuple[str, str]:
    """`docker push`: every tag the build record at `path` names, pushed with the container
    tool `tool` names (or finds); the reference to sign (`<repository>@sha256:…`) and the
    record's first tag."""
    record = load_record(path)
    ref = registry.push(detect(tool), record["tags"])
    return ref, record["tags"][0]


def _git(root: Path, *args: str) -> str | None:
    """git's answer in `root`, or None (no git, not a repository)."""
    git = shutil.which("git")
    if not git:
        return None
    proc = attempt([git, *args], 30, cwd=root)
    return proc.stdout.strip() if proc.returncode == 0 else None


def revision(root: Path) -> str:
    """The commit of this repository the image is built from (`+dirty` with local changes)."""
    head = _git(root, "rev-parse", "HEAD")
    if not head:
        return "unknown"
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if dirty else "")


def source_url(root: Path) -> str:
    """Where this project's source lives, for `org.opencontainers.image.source`:
    LLAMASPEC_SOURCE_URL (the publishing workflow sets it), else pyproject.toml's
    `[project.urls]` (Source, else Repository, else Homepage), else the git remote `origin`
    when it is a GitHub repository."""
    if given := env.get(env.SOURCE_URL):
        return given
    if url := project_url(root / "pyproject.toml") or _installed_url(root / "pyproject.toml"):
        return url
    url = _git(root, "remote", "get-url", "origin") or ""
    if url.startswith("git@github.com:"):
        url = "https://github.com/" + url.removeprefix("git@github.com:")
    return url.removesuffix(".git") if url.startswith("https://github.com/") else ""


def _installed_url(pyproject: Path) -> str:
    """An installed package (no pyproject.toml): the Source URL of its metadata."""
    if pyproject.exists():
        return ""
    from importlib import metadata

    try:
        entries = metadata.metadata("llamaspec").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return ""
    urls = {k.strip().lower(): v.strip() for k, _, v in (e.partition(",") for e in entries)}
    return next((urls[k] for k in ("source", "repository", "homepage") if k in urls), "")


def project_url(pyproject: Path) -> str:
    """The https URL pyproject.toml gives in `[project.urls]` under Source, Repository or
    Homepage (the first there), or "" (no file, no such table, or unreadable)."""
    try:
        text = pyproject.read_text()
    except OSError:
        return ""
    urls: dict[str, str] = {}
    table = False
    for line in text.splitlines():  # a [project.urls] table of `Name = "https://…"` lines
        stripped = line.strip()
        if stripped.startswith("["):
            table = stripped == "[project.urls]"
        elif table and (m := _URL_LINE.match(stripped)):
            urls[m.group(1).strip().lower()] = m.group(2)
    return next((urls[k] for k in ("source", "repository", "homepage") if k in urls), "")


def all_build_args(spec: images.ImageSpec, tree: str = "build") -> dict[str, str]:
    """Every build argument; TREE names the stage the runtime tree comes from (`build`, or
    `artifact`: staged from dist/). Always given: buildah resolves a stage name in
    `FROM ${TREE}` only from a build argument, not from the ARG's default."""
    runtime, build = images.BASES[spec.backend]
    return {"BASE_IMAGE": runtime, "BUILD_IMAGE": build, "TREE": tree, **spec.build_args()}


def ca_bundle() -> Path | None:
    """A CA bundle the host's Python tools are told to use (a TLS-inspecting proxy's CA is
    in it), passed to the build stage as the `ca` secret: never stored in a layer."""
    for var in ("LLAMASPEC_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if (value := os.environ.get(var)) and Path(value).is_file():
            return Path(value)
    system = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian/Ubuntu: what the host trusts
    return system if system.is_file() else None


def run_logged(cmd: Sequence[str], log: Path, console: Console, what: str) -> None:
    """Run one build target, its output into `log`; on failure show the end of it."""
    console.print(f"docker-build: {what}: {' '.join(cmd[:3])} … (log: {log})")
    with log.open("w") as fh, procs.popen(cmd, timeout=BUILD_S, check=False, what=what) as out:
        for line in out.lines():
            fh.write(line)
    if out.returncode != 0:
        text = log.read_text(errors="replace").splitlines()
        raise LlamaspecError(
            f"The image build failed ({what}, exit {out.returncode}); full log: {log}.",
            details="\n".join(text[-LOG_TAIL:]),
        )


def check_built_labels(got: Mapping[str, str], want: Mapping[str, str], ref: str) -> None:
    """The labels an image carries must be the ones computed from its manifest."""
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    if wrong:
        raise LlamaspecError(f"{ref} was built but its labels are wrong: {wrong}")


def context_root(root: Path, stack: contextlib.ExitStack) -> Path:
    """The build context: `root` itself in a checkout, else (the catalogs installed with
    the package, or a folder llamaspec may not write) a copy in a temporary folder, removed
    with `stack`, so that staging an artifact never writes into the installed package."""
    if not is_packaged(root) and os.access(root, os.W_OK):
        return root
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llamaspec-context-")))
    copy = tmp / "context"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in (copy, *copy.rglob("*")):  # a read-only install copies read-only
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return copy


def build_image(
    tool: ContainerTool,
    spec: images.ImageSpec,
    console: Console,
    *,
    ccache: Path | None = None,
    push: bool = False,
    root: Path | None = None,
    logs: Path | None = None,
    artifact: Artifact | None = None,
) -> BuiltImage:
    """Build, label and tag the image for `spec` (two phases, see the module docstring);
    with `artifact`, only the runtime stage, around that artifact staged from dist/."""
    root = root or project_root()
    dockerfile = spec.dockerfile(root)
    if not dockerfile.is_file():
        raise LlamaspecError(f"There is no {dockerfile.relative_to(root)} for {spec.backend!r}.")
    args = all_build_args(spec, "artifact" if artifact else "build")
    settings = tool.build_settings(args["BASE_IMAGE"], ccache, console.print)
    if artifact is not None:  # nothing of this build is worth keeping as a cache
        settings = dataclasses.replace(settings, keep_layers=False)
    bundle = ca_bundle()
    logs = logs or cache_dir() / "docker-logs"
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{spec.engine}-{spec.backend}"
    src, rev = source_url(root), revision(root)
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        root = context_root(root, stack)
        dockerfile = spec.dockerfile(root)
        if artifact is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llamaspec-mf-")))
            cmd = tool.build_argv(
                dockerfile, root, "manifest", args, settings, output=tmp, ca_bundle=bundle
            )
            run_logged(cmd, logs / f"{stem}-build.log", console, "build stage")
            manifest = images.read_manifest(tmp / "manifest.json")
        else:
            manifest = artifact.manifest
            tree = stack.enter_context(from_artifact.staged(artifact, root, console))
            from_artifact.check_base_runs(tool, args["BASE_IMAGE"], tree, artifact)
        t1 = time.monotonic()
        refs = images.tags(spec, manifest)
        label_args = {**args, **images.label_args(manifest, src, rev)}
        cmd = tool.build_argv(
            dockerfile, root, "runtime", label_args, settings, tags=refs, push=push,
            ca_bundle=bundle,
        )  # fmt: skip
        if not settings.keep_layers:
            stack.enter_context(tool.new_images_removed())
        run_logged(cmd, logs / f"{stem}-runtime.log", console, "runtime stage")
    t2 = time.monotonic()
    want = images.image_labels(manifest, src, rev)
    labels = tool.labels(refs[0]) if not push else want
    check_built_labels(labels, want, refs[0])
    if push:
        tool.push_built(refs)
    console.print(f"docker-build: {manifest['artifact_id']} → {', '.join(refs)}")
    return BuiltImage(
        spec,
        tuple(refs),
        labels,
        manifest,
        tool.name,
        {
            ("build_stage" if artifact is None else "stage_artifact"): round(t1 - t0, 1),
            "runtime_stage": round(t2 - t1, 1),
        },
    )


@dataclass(frozen=True)
class ImageRequest:
    """What `docker build` asks for: the build's inputs, or (`from_artifact`) an artifact in
    `dist` to carry instead of compiling in the image; where the tags go; which tool builds.
    `engine` and `backend` are None when not given (llama.cpp and cpu, or the artifact's)."""

    engine: str | None = None
    backend: str | None = None
    pin: str | None = None
    patches: str = ""  # comma list: ID adds, -ID drops, none drops the defaults
    variants: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()
    registry: str = images.LOCAL_REGISTRY
    base_image: str | None = None
    build_image: str | None = None
    from_artifact: str | None = None
    dist: Path = Path("dist")
    allow_native: bool = False
    tool: str = "auto"
    ccache: Path | None = None
    push: bool = False


def build_requested(request: ImageRequest, console: Console) -> BuiltImage:
    """`docker build`: the image spec (the request's inputs, or the manifest of the artifact
    it names, refused where the image cannot carry it), validated before any container tool
    is looked for, then built (`build_image`) with the tool the request names or finds."""
    engines = config.load_engines()
    artifact = None
    if request.from_artifact:
        artifact = from_artifact.for_image(
            request.dist,
            request.from_artifact,
            request.engine,
            request.backend,
            request.allow_native,
        )
        spec = images.artifact_spec(
            artifact.manifest,
            engines,
            config.load_series(),
            request.registry,
            request.base_image,
            request.build_image,
        )
    else:
        spec = images.ImageSpec(
            engine=request.engine or "llama.cpp",
            backend=request.backend or "cpu",
            pin=request.pin,
            patches=tuple(images.split_list(request.patches)),
            variants=request.variants,
            defines=request.defines,
            registry=request.registry,
            base_image=request.base_image,
            build_image=request.build_image,
        )
    images.validate(spec, engines)
    images.check_refs(("--base-image", request.base_image), ("--build-image", request.build_image))
    if artifact is None:
        check_build_inputs(spec, request.patches)
    tool = detect(request.tool)
    return build_image(
        tool, spec, console, ccache=request.ccache, push=request.push, artifact=artifact
    )


def check_build_inputs(spec: images.ImageSpec, patches: str) -> None:
    """What the build in the image would refuse, refused before any container tool runs:
    unknown patch ids and variants, malformed defines."""
    from llamaspec.engine import patch_queue, profiles

    include, exclude, no_defaults = images.parse_patches(patches)
    patch_queue.select(config.load_series(), spec.engine, include, exclude, no_defaults)
    for variant in spec.variants:
        profiles.variant_flags(spec.engine, variant, spec.backend)
    for define in spec.defines:
        profiles.parse_define(define, "--define")


def write_bake(engines: Mapping[str, Engine], *, check: bool, console: Console) -> Path:
    """docker/docker-bake.hcl for the engine × backend matrix (or check it is current)."""
    path = project_root() / "docker" / "docker-bake.hcl"
    text = images.bake(engines)
    if check:
        if not path.is_file() or path.read_text() != text:
            raise LlamaspecError(f"{path} is not current; run `llamaspec docker bake`.")
    else:
        path.write_text(text)
    console.print(f"bake: {path} ({'current' if check else 'written'})")
    return path
