"""Container tools: build, pull, inspect and run llama-server images (docker buildx or buildah).

An image build has two phases. Phase one builds the `manifest` target and reads the
manifest.json the build stage wrote; phase two builds the `runtime` target with labels
computed from it (the runtime stage refuses labels that do not match its own tree). The
build stage is cached between the phases (buildx cache, `buildah --layers`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from llamaspec.config import Engine, load_engines
from llamaspec.engine.build import Artifact
from llamaspec.errors import LlamaspecError, choose
from llamaspec.images import specs as images
from llamaspec.paths import cache_dir, project_root

CONTAINER_MODELS = "/models"
DEFAULT_RECIPE = "qwen2.5-coder-7b"
UNREACHABLE = (
    "no such host",
    "dial tcp",
    "connection refused",
    "i/o timeout",
    "network is unreachable",
    "temporary failure in name resolution",
    "tls handshake timeout",
    "could not resolve",
    "connect: ",
)


@dataclass(frozen=True)
class Tool:
    """A container tool that works here: `docker` (with a running engine) or `buildah`."""

    name: str
    path: str


def _run(cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kw)


def docker_engine_error(docker: str) -> str | None:
    """None when a Docker engine answers, else why not (the CLI's own words)."""
    proc = _run([docker, "info", "--format", "{{.ServerVersion}}"], timeout=30)
    if proc.returncode == 0 and proc.stdout.strip():
        return None
    return (
        (proc.stderr or proc.stdout).strip().splitlines()[-1]
        if (proc.stderr or proc.stdout)
        else "no answer"
    )


def detect(choice: str = "auto") -> Tool:
    """docker when a Docker engine runs (with buildx), else buildah; or say what to install."""
    docker, buildah = shutil.which("docker"), shutil.which("buildah")
    engine_error = docker_engine_error(docker) if docker and choice in ("auto", "docker") else None
    if choice == "docker" or (choice == "auto" and docker and engine_error is None):
        if not docker:
            raise LlamaspecError(
                "--tool docker, but there is no docker CLI on PATH. Install Docker Engine with the "
                "buildx plugin (https://docs.docker.com/engine/install/), or use --tool buildah."
            )
        if engine_error is not None:
            raise LlamaspecError(
                f"--tool docker, but no Docker engine answers ({engine_error}). Start the "
                "daemon (`systemctl start docker`) or use buildah (`--tool buildah`)."
            )
        if _run([docker, "buildx", "version"]).returncode != 0:
            raise LlamaspecError(
                "Docker runs but the buildx plugin is missing; install it (Debian/Ubuntu: "
                "`apt-get install docker-buildx-plugin`)."
            )
        return Tool("docker", docker)
    if buildah:
        return Tool("buildah", buildah)
    if choice == "buildah":
        raise LlamaspecError(
            "--tool buildah, but buildah is not installed. Install it (Debian/Ubuntu: "
            "`apt-get install buildah`; Fedora: `dnf install buildah`)."
        )
    why = (
        f"a docker CLI is installed but no Docker engine answers ({engine_error})"
        if docker
        else "neither docker nor buildah is on PATH"
    )
    raise LlamaspecError(
        f"No container tool to build or run images: {why}. Install Docker Engine with the "
        "buildx plugin and start it (https://docs.docker.com/engine/install/), or install "
        "buildah, which needs no daemon (Debian/Ubuntu: `apt-get install buildah`)."
    )


# --- building ------------------------------------------------------------------------------


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
            "tool": self.tool,
            "seconds": dict(self.seconds),
        }


def revision(root: Path) -> str:
    """The commit of this repository the image is built from (`+dirty` with local changes)."""
    head = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if head.returncode != 0:
        return "unknown"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root).stdout.strip()
    return head.stdout.strip() + ("+dirty" if dirty else "")


def source_url(root: Path) -> str:
    """Where this repository lives (LLAMASPEC_SOURCE_URL, else the git remote `origin`)."""
    if env := os.environ.get("LLAMASPEC_SOURCE_URL"):
        return env
    proc = _run(["git", "remote", "get-url", "origin"], cwd=root)
    url = proc.stdout.strip() if proc.returncode == 0 else ""
    if url.startswith("git@github.com:"):
        url = "https://github.com/" + url.removeprefix("git@github.com:")
    return url.removesuffix(".git") if url.startswith("http") else ""


def all_build_args(spec: images.ImageSpec) -> dict[str, str]:
    runtime, build = images.BASES[spec.backend]
    return {"BASE_IMAGE": runtime, "BUILD_IMAGE": build, **spec.build_args()}


def build_command(
    tool: Tool,
    dockerfile: Path,
    context: Path,
    target: str,
    args: Mapping[str, str],
    *,
    tags: Sequence[str] = (),
    output: Path | None = None,
    volumes: Sequence[tuple[Path, str]] = (),
    pull_never: bool = False,
    push: bool = False,
    cache: str | None = None,
    ca_bundle: Path | None = None,
) -> list[str]:
    """The build command line for one target (what the publishing workflow runs, too)."""
    if tool.name == "docker":
        cmd = [tool.path, "buildx", "build", "--progress", "plain"]
        if cache:  # e.g. "type=gha,scope=llama.cpp-cpu"
            kind, _, rest = cache.partition(",")
            cmd += [
                "--cache-from",
                cache,
                "--cache-to",
                f"{kind},mode=max{',' + rest if rest else ''}",
            ]
    else:
        cmd = [tool.path, "bud", "--isolation", "chroot", "--layers", "--format", "docker"]
        if pull_never:
            cmd.append("--pull=never")
        for host, inside in volumes:
            cmd += ["--volume", f"{host}:{inside}"]
    if ca_bundle is not None:
        cmd += ["--secret", f"id=ca,src={ca_bundle}"]
    cmd += ["-f", str(dockerfile), "--target", target]
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    for tag in tags:
        cmd += ["-t", tag]
    if output is not None:
        cmd += ["--output", f"type=local,dest={output}"]
    elif tool.name == "docker":
        cmd.append("--push" if push else "--load")
    cmd.append(str(context))
    return cmd


def host_ccache_dir() -> Path | None:
    """The host's ccache directory (where its builds left their objects), if ccache is here."""
    ccache = shutil.which("ccache")
    if not ccache:
        return None
    proc = _run([ccache, "--get-config", "cache_dir"])
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


def _volumes(ccache: Path | None) -> list[tuple[Path, str]]:
    """Host caches mounted into buildah's build stage: the sdist downloads and ccache (the
    build stage builds under the same paths as a root user's local build, so the host's
    objects are hits)."""
    out = []
    ccache = ccache or host_ccache_dir()
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    out.append((downloads, "/root/.cache/llamaspec/downloads"))
    if ccache is not None:
        ccache.mkdir(parents=True, exist_ok=True)
        out.append((ccache, "/root/.cache/ccache"))
    return out


def ca_bundle() -> Path | None:
    """A CA bundle the host's Python tools are told to use (a TLS-inspecting proxy's CA is
    in it), passed to the build stage as the `ca` secret: never stored in a layer."""
    for var in ("LLAMASPEC_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if (value := os.environ.get(var)) and Path(value).is_file():
            return Path(value)
    system = Path("/etc/ssl/certs/ca-certificates.crt")  # Debian/Ubuntu: what the host trusts
    return system if system.is_file() else None


def image_exists(tool: Tool, ref: str) -> bool:
    if tool.name == "docker":
        return _run([tool.path, "image", "inspect", ref]).returncode == 0
    return _run([tool.path, "inspect", "--type", "image", ref]).returncode == 0


def _stream(cmd: Sequence[str], log: Path, console: Console, what: str) -> None:
    """Run a build, its output into `log`; on failure show the end of it."""
    console.print(f"docker-build: {what}: {' '.join(cmd[:3])} … (log: {log})")
    with log.open("w") as fh:
        rc = subprocess.run(list(cmd), stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        text = log.read_text(errors="replace").splitlines()
        raise LlamaspecError(
            f"The image build failed ({what}, exit {rc}); full log: {log}.",
            details="\n".join(text[-40:]),
        )


def build_image(
    tool: Tool,
    spec: images.ImageSpec,
    console: Console,
    *,
    ccache: Path | None = None,
    push: bool = False,
    root: Path | None = None,
    logs: Path | None = None,
) -> BuiltImage:
    """Build, label and tag the image for `spec` (two phases, see the module docstring)."""
    root = root or project_root()
    dockerfile = spec.dockerfile(root)
    if not dockerfile.is_file():
        raise LlamaspecError(f"There is no {dockerfile.relative_to(root)} for {spec.backend!r}.")
    args = all_build_args(spec)
    pull_never = tool.name == "buildah" and image_exists(tool, args["BASE_IMAGE"])
    if tool.name == "buildah" and not pull_never:
        console.print(
            f"docker-build: {args['BASE_IMAGE']} is not in local storage; buildah will pull it "
            "(no registry? make it with `llamaspec docker base`)"
        )
    volumes = _volumes(ccache) if tool.name == "buildah" else []
    cache = os.environ.get("LLAMASPEC_BUILDX_CACHE")
    logs = logs or cache_dir() / "docker-logs"
    logs.mkdir(parents=True, exist_ok=True)
    common = {
        "volumes": volumes,
        "pull_never": pull_never,
        "cache": cache,
        "ca_bundle": ca_bundle(),
    }
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llamaspec-manifest-") as tmp:
        cmd = build_command(tool, dockerfile, root, "manifest", args, output=Path(tmp), **common)
        _stream(cmd, logs / f"{spec.engine}-{spec.backend}-build.log", console, "build stage")
        manifest = images.read_manifest(Path(tmp) / "manifest.json")
    t1 = time.monotonic()
    src, rev = source_url(root), revision(root)
    refs = images.tags(spec, manifest)
    cmd = build_command(
        tool,
        dockerfile,
        root,
        "runtime",
        {**args, **images.label_args(manifest, src, rev)},
        tags=refs,
        push=push,
        **common,
    )
    _stream(cmd, logs / f"{spec.engine}-{spec.backend}-runtime.log", console, "runtime stage")
    t2 = time.monotonic()
    labels = inspect_labels(tool, refs[0]) if not push else images.image_labels(manifest, src, rev)
    want = images.image_labels(manifest, src, rev)
    wrong = {k: (labels.get(k), v) for k, v in want.items() if labels.get(k) != v}
    if wrong:
        raise LlamaspecError(f"{refs[0]} was built but its labels are wrong: {wrong}")
    console.print(f"docker-build: {manifest['artifact_id']} → {', '.join(refs)}")
    return BuiltImage(
        spec,
        tuple(refs),
        labels,
        manifest,
        tool.name,
        {"build_stage": round(t1 - t0, 1), "runtime_stage": round(t2 - t1, 1)},
    )


# --- inspecting and running ------------------------------------------------------------------


def inspect_image(tool: Tool, ref: str) -> dict:
    """The image's config (Labels, User, Env, Healthcheck, …) as Docker's JSON spells it."""
    if tool.name == "docker":
        proc = _run([tool.path, "image", "inspect", ref])
    else:
        proc = _run([tool.path, "inspect", "--type", "image", ref])
    if proc.returncode != 0:
        raise LlamaspecError(f"Cannot inspect {ref}: {proc.stderr.strip()}")
    data = json.loads(proc.stdout)
    return (data[0]["Config"] if tool.name == "docker" else data["Docker"]["config"]) or {}


def inspect_labels(tool: Tool, ref: str) -> dict[str, str]:
    return inspect_image(tool, ref).get("Labels") or {}


@contextlib.contextmanager
def container(tool: Tool, ref: str) -> Iterator[str]:
    """A working container of `ref` for buildah (docker runs images directly)."""
    if tool.name == "docker":
        yield ref
        return
    proc = _run([tool.path, "from", "--pull=never", "--quiet", ref])
    if proc.returncode != 0:
        raise LlamaspecError(f"Cannot start a container of {ref}: {proc.stderr.strip()}")
    name = proc.stdout.strip().splitlines()[-1]
    try:
        yield name
    finally:
        _run([tool.path, "rm", name])


def exec_argv(
    tool: Tool,
    ctr: str,
    argv: Sequence[str],
    mounts: Sequence[tuple[Path, str]] = (),
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """The command line that runs `argv` inside the image (host network, loopback shared)."""
    if tool.name == "docker":
        cmd = [tool.path, "run", "--rm", "-i", "--network", "host", "--entrypoint", argv[0]]
        argv = argv[1:]
    else:
        cmd = [tool.path, "run", "--isolation", "chroot"]
    for host, inside in mounts:
        cmd += ["-v", f"{host}:{inside}:ro"]
    for key, value in (env or {}).items():
        cmd += ["-e", f"{key}={value}"] if tool.name == "docker" else ["--env", f"{key}={value}"]
    return [*cmd, ctr, *argv] if tool.name == "docker" else [*cmd, ctr, "--", *argv]


def read_image_file(tool: Tool, ctr: str, path: str) -> str:
    proc = _run(exec_argv(tool, ctr, ["cat", path]))
    if proc.returncode != 0:
        raise LlamaspecError(f"Cannot read {path} from the image: {proc.stderr.strip()}")
    return proc.stdout


def server_shim(
    tool: Tool, ctr: str, model_dir: Path, where: Path, env: Mapping[str, str] | None = None
) -> Path:
    """An executable `bin/llama-server` that runs the image's server with the models mounted
    at /models, so the smoke code drives the image exactly as it drives a local build."""
    argv = exec_argv(
        tool, ctr, ["/opt/llamaspec/bin/llama-server"], [(model_dir, CONTAINER_MODELS)], env
    )
    shim = where / "bin" / "llama-server"
    shim.parent.mkdir(parents=True, exist_ok=True)
    quoted = " ".join(f"'{a}'" for a in argv)
    shim.write_text(f'#!/bin/sh\nexec {quoted} "$@"\n')
    shim.chmod(0o755)
    return shim


def smoke_image(tool: Tool, ref: str, reports: Path, console: Console, root: Path | None = None):
    """The smoke test, run against the image's own llama-server, plus its HEALTHCHECK."""
    from llamaspec.models.dialects import dialect_for
    from llamaspec.models.embedded import embedded_model
    from llamaspec.proof.client import running
    from llamaspec.proof.smoke import base_args, smoke

    labels = inspect_labels(tool, ref)
    model = embedded_model(console.print)
    with container(tool, ref) as ctr, tempfile.TemporaryDirectory(prefix="llamaspec-img-") as tmp:
        manifest = json.loads(read_image_file(tool, ctr, "/opt/llamaspec/manifest.json"))
        want = images.build_labels(manifest)
        got = {k.removeprefix(images.LABEL_PREFIX): v for k, v in labels.items()}
        wrong = [k for k, v in want.items() if got.get(k) != v]
        if wrong:
            raise LlamaspecError(
                f"{ref}: labels {', '.join(wrong)} do not match the manifest inside the image."
            )
        # without a GPU, ggml-vulkan uses a CPU device (lavapipe) only when asked to
        env = {"GGML_VK_VISIBLE_DEVICES": "0"} if manifest["backend"] == "vulkan" else None
        server = server_shim(tool, ctr, model.parent, Path(tmp), env)
        artifact = Artifact(manifest["artifact_id"], server.parent.parent, manifest, True)
        out = reports / f"docker-smoke-{manifest['artifact_id']}"
        inside_model = Path(CONTAINER_MODELS) / model.name
        report = smoke(
            artifact, dialect_for(artifact, console.print, root), inside_model, out, console
        )
        with running(server, base_args(inside_model), out / "logs" / "health.log") as srv:
            healthy = _healthcheck(tool, ctr, srv.port)
        stopped = _healthcheck(tool, ctr, srv.port)
    if not healthy or stopped:
        raise LlamaspecError(
            f"{ref}: the HEALTHCHECK script answered {'unhealthy' if not healthy else 'healthy'} "
            f"for a server that was {'running' if not healthy else 'stopped'}."
        )
    console.print(f"docker-smoke: {ref}: smoke PASSED, HEALTHCHECK ok")
    return report


def _healthcheck(tool: Tool, ctr: str, port: int) -> bool:
    argv = ["env", f"LLAMASPEC_PORT={port}", "/opt/llamaspec/bin/healthcheck.sh"]
    return _run(exec_argv(tool, ctr, argv), timeout=60).returncode == 0


# --- pulling -----------------------------------------------------------------------------


@dataclass(frozen=True)
class HostBackend:
    backend: str
    reason: str


def detect_host(
    root: Path = Path("/"),
    which: Callable[[str], str | None] = shutil.which,
) -> HostBackend:
    """NVIDIA GPU → cuda; a hardware Vulkan driver with a render node → vulkan; else cpu."""
    gpus = root / "proc/driver/nvidia/gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return HostBackend("cuda", f"NVIDIA GPU(s) in {gpus}")
    smi = which("nvidia-smi")
    if smi and root == Path("/"):
        listed = _run([smi, "-L"])
        if listed.returncode == 0 and "GPU" in listed.stdout:
            return HostBackend("cuda", listed.stdout.strip().splitlines()[0])
    icds = sorted(
        p.name
        for d in ("usr/share/vulkan/icd.d", "etc/vulkan/icd.d", "usr/local/share/vulkan/icd.d")
        if (root / d).is_dir()
        for p in (root / d).glob("*.json")
    )
    hardware = [n for n in icds if not n.startswith("lvp")]
    render = sorted((root / "dev/dri").glob("renderD*")) if (root / "dev/dri").is_dir() else []
    if hardware and render:
        return HostBackend("vulkan", f"Vulkan drivers {', '.join(hardware)} and {render[0]}")
    if hardware:
        return HostBackend("cpu", "Vulkan drivers are installed but there is no GPU render node")
    return HostBackend("cpu", "no NVIDIA GPU and no hardware Vulkan driver")


def run_hint(
    ref: str,
    backend: str,
    engine: Engine,
    commit: str | None,
    recipe_name: str = DEFAULT_RECIPE,
    root: Path | None = None,
) -> str:
    """How to run the image with a recipe: the pair's GGUFs mounted at /models, the recipe
    rendered in the engine's dialect (host and port are the image's own: 0.0.0.0:8080)."""
    from llamaspec.config import load_models, load_recipes
    from llamaspec.models import recipes

    catalog = load_models(root)
    known = load_recipes(root, catalog)
    recipe = known[choose("recipe", recipe_name, known)]
    pair = catalog.pairs[recipe.pair]
    target = f"{CONTAINER_MODELS}/{catalog.models[pair.target].file}"
    draft = f"{CONTAINER_MODELS}/{catalog.models[pair.draft].file}" if pair.draft else None
    dialect = engine.dialect if commit in (None, engine.pin) else "upstream"
    cmd = recipes.render(recipe, engine.name, dialect, target, draft, backend=backend)
    argv = list(cmd.argv[1:])
    for flag in ("--host", "--port"):  # the entrypoint sets them
        i = argv.index(flag)
        del argv[i : i + 2]
    device = {"cuda": "--gpus all ", "vulkan": "--device /dev/dri "}.get(backend, "")
    return (
        f"# put the GGUFs of pair {recipe.pair!r} in ./models "
        f"(`llamaspec models pull {recipe.pair}` downloads and verifies them)\n"
        f'docker run --rm {device}-p 8080:8080 -v "$PWD/models:/models:ro" {ref} \\\n'
        f"    {shlex.join(argv)}"
    )


def _unreachable(text: str) -> bool:
    low = text.lower()
    return any(h in low for h in UNREACHABLE)


def pull(
    tool: Tool,
    engine_name: str,
    backend: str | None,
    pin: str | None,
    registry: str,
    tag: str | None,
    console: Console,
    recipe: str = DEFAULT_RECIPE,
) -> str:
    """Pull the image for this host (or `backend`), refuse it unless its labels match."""
    engines = load_engines()
    engine = engines[choose("engine", engine_name, engines)]
    if backend is None:
        host = detect_host()
        backend = host.backend
        console.print(f"docker-pull: this host → {backend} ({host.reason})")
    choose("backend", backend, images.BACKENDS)
    ref = images.image_ref(registry, tag or images.rolling_tag(engine.name, backend))
    cmd = [tool.path, "pull", ref] if tool.name == "docker" else [tool.path, "pull", "--quiet", ref]
    proc = _run(cmd, timeout=3600)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        build = f"nox -s docker-build -- --engine {engine.name} --backend {backend}"
        if _unreachable(err):
            raise LlamaspecError(
                f"Cannot reach the registry {registry.split('/')[0]} to pull {ref} "
                f"({err.splitlines()[-1] if err else 'no answer'}). Check the network or "
                f"proxy, or build the same image here instead: `{build}`."
            )
        raise LlamaspecError(
            f"{registry} has no image {ref} ({err.splitlines()[-1] if err else 'pull failed'}). "
            f"See the published tags of {registry}/{images.REPOSITORY}, or build it: `{build}`."
        )
    labels = inspect_labels(tool, ref)
    images.check_labels(labels, ref, engine.name, backend, pin)
    commit = labels.get(images.LABEL_PREFIX + "engine-commit")
    patches = labels.get(images.LABEL_PREFIX + "patches") or "-"
    console.print(
        f"docker-pull: {ref} = {labels.get(images.LABEL_PREFIX + 'artifact-id')} "
        f"({engine.name}@{(commit or '?')[:12]}, patches {patches})"
    )
    console.print(f"Run it with the recipe {recipe!r}:\n")
    print(run_hint(ref, backend, engine, commit, recipe))
    return ref


def push(tool: Tool, refs: Sequence[str]) -> str:
    """Push every tag; return `<repository>@sha256:…`, the reference to sign."""
    digest = ""
    for ref in refs:
        if tool.name == "docker":
            proc = _run([tool.path, "push", ref], timeout=3600)
        else:
            with tempfile.NamedTemporaryFile("r", suffix=".digest") as fh:
                proc = _run([tool.path, "push", "--digestfile", fh.name, ref, f"docker://{ref}"])
                proc.stdout += f"\ndigest: {fh.read().strip()}"
        if proc.returncode != 0:
            raise LlamaspecError(f"Pushing {ref} failed: {(proc.stderr or proc.stdout).strip()}")
        digest = push_digest(proc.stdout) or digest
    if not digest:
        raise LlamaspecError(f"Pushed {', '.join(refs)} but the push named no digest.")
    return f"{refs[0].rsplit(':', 1)[0]}@{digest}"


def push_digest(output: str) -> str | None:
    """The manifest digest a push reports (`… digest: sha256:<64 hex> size: …`)."""
    found = re.findall(r"digest: (sha256:[0-9a-f]{64})", output)
    return found[-1] if found else None


# --- base images, bake file, size ---------------------------------------------------------


def make_base_image(suite: str, tag: str, console: Console, mirror: str | None = None) -> str:
    """A Debian `minbase` root made with debootstrap, imported under `tag` (no registry)."""
    for tool, pkg in (("debootstrap", "debootstrap"), ("buildah", "buildah")):
        if not shutil.which(tool):
            raise LlamaspecError(f"{tool} is not installed; `apt-get install {pkg}`.")
    buildah = Tool("buildah", shutil.which("buildah") or "buildah")
    mirror = mirror or os.environ.get("LLAMASPEC_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    with tempfile.TemporaryDirectory(prefix="llamaspec-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        console.print(f"base: debootstrap --variant=minbase {suite} from {mirror}")
        proc = _run(["debootstrap", "--variant=minbase", suite, str(rootfs), mirror])
        if proc.returncode != 0:
            raise LlamaspecError(
                f"debootstrap of {suite} failed (needs root and {mirror}).",
                details="\n".join((proc.stdout + proc.stderr).splitlines()[-15:]),
            )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / junk).glob("*"):
                if p.is_file():
                    p.unlink()
        ctr = _run([buildah.path, "from", "scratch"]).stdout.strip()
        try:
            mnt = _run([buildah.path, "mount", ctr]).stdout.strip()
            tar = subprocess.Popen(
                ["tar", "-C", str(rootfs), "-cf", "-", "."], stdout=subprocess.PIPE
            )
            subprocess.run(["tar", "-C", mnt, "-xpf", "-"], stdin=tar.stdout, check=True)
            tar.wait()
            _run([buildah.path, "umount", ctr])
            _run(
                [
                    buildah.path,
                    "config",
                    "--cmd",
                    '["bash"]',
                    "--env",
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    ctr,
                ]
            )
            proc = _run([buildah.path, "commit", "--quiet", ctr, tag])
            if proc.returncode != 0:
                raise LlamaspecError(f"buildah commit of {tag} failed: {proc.stderr.strip()}")
        finally:
            _run([buildah.path, "rm", ctr])
    console.print(f"base: {tag} (Debian {suite} minbase) is in local storage")
    return tag


def write_bake(engines: Mapping[str, Engine], *, check: bool, console: Console) -> Path:
    path = project_root() / "docker" / "docker-bake.hcl"
    text = images.bake(engines)
    if check:
        if not path.is_file() or path.read_text() != text:
            raise LlamaspecError(f"{path} is not current; run `llamaspec docker bake`.")
    else:
        path.write_text(text)
    console.print(f"bake: {path} ({'current' if check else 'written'})")
    return path


def added_bytes(tool: Tool, ref: str, base: str) -> tuple[int, int]:
    """(bytes of the layers `ref` adds over `base`, bytes of `base`), uncompressed."""
    if tool.name == "docker":

        def size(r: str) -> int:
            return int(_run([tool.path, "image", "inspect", "--format", "{{.Size}}", r]).stdout)

        return size(ref) - size(base), size(base)
    store = json.loads(_run([tool.path, "info"]).stdout)["store"]
    root, driver = Path(store["GraphRoot"]), store["GraphDriverName"]
    layers = {
        la["id"]: la for la in json.loads((root / f"{driver}-layers/layers.json").read_text())
    }
    tops = {
        im["id"]: im.get("layer")
        for im in json.loads((root / f"{driver}-images/images.json").read_text())
    }

    def chain(r: str) -> list[str]:
        proc = _run([tool.path, "inspect", "--type", "image", r])
        if proc.returncode != 0:
            raise LlamaspecError(f"{r} is not in local storage.")
        out, layer = [], tops.get(json.loads(proc.stdout)["FromImageID"])
        while layer:
            out.append(layer)
            layer = layers[layer].get("parent")
        return out

    base_layers = set(chain(base))
    added = sum(layers[la].get("diff-size", 0) for la in chain(ref) if la not in base_layers)
    return added, sum(layers[la].get("diff-size", 0) for la in base_layers)


def size_report(
    ref: str,
    base: str,
    reports: Path,
    console: Console,
    tool: Tool | None = None,
    record: Mapping | None = None,
) -> dict:
    """reports/docker-size-<tag>.{json,md}: image size and the bytes it adds over its base."""
    tool = tool or detect()
    with container(tool, ref) as ctr:
        manifest = json.loads(read_image_file(tool, ctr, "/opt/llamaspec/manifest.json"))
        du = _run(exec_argv(tool, ctr, ["du", "-sb", "/opt/llamaspec"])).stdout.split()
        libs = read_image_file(tool, ctr, "/opt/llamaspec/runtime-libs.txt").split()
    added, base_size = added_bytes(tool, ref, base)
    total = added + base_size
    report = {
        "image": ref,
        "base": base,
        "artifact_id": manifest["artifact_id"],
        "backend": manifest["backend"],
        "image_bytes": total,
        "base_bytes": base_size,
        "added_bytes": added,
        "added_mb": round(added / 1e6, 1),
        "opt_llamaspec_bytes": int(du[0]) if du else None,
        "system_libraries": libs,
        "budget_mb": 60 if manifest["backend"] == "cpu" else None,
        "within_budget": added <= 60e6 if manifest["backend"] == "cpu" else None,
        "measured_with": tool.name,
        "build_seconds": dict(record["seconds"]) if record else None,
    }
    reports.mkdir(parents=True, exist_ok=True)
    stem = reports / f"docker-size-{manifest['artifact_id']}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# Image size: {manifest['artifact_id']}",
        "",
        f"Image `{ref}` on base `{base}` (uncompressed, {tool.name} local storage).",
        "",
        "| | MB |",
        "|---|---|",
        f"| image | {total / 1e6:.1f} |",
        f"| base | {base_size / 1e6:.1f} |",
        f"| **added by llamaspec** | **{added / 1e6:.1f}** |",
        f"| of which /opt/llamaspec | {int(du[0]) / 1e6 if du else 0:.1f} |",
        "",
        f"System libraries copied from the build image: {', '.join(libs) or 'none'}.",
    ]
    if record:
        md.append(
            f"Build ({record['tool']}): build stage {record['seconds']['build_stage']} s, "
            f"runtime stage {record['seconds']['runtime_stage']} s."
        )
    if report["budget_mb"]:
        md.append(
            f"Budget for the CPU image: ≤ 60 MB added — "
            f"{'met' if report['within_budget'] else 'NOT met'}."
        )
    stem.with_suffix(".md").write_text("\n".join(md) + "\n")
    console.print(f"size: {ref}: {added / 1e6:.1f} MB over {base} → {stem}.json")
    return report
