"""Container tools behind one interface: `ContainerTool`, with `Docker` (buildx, a running
engine) and `Buildah` (no daemon) as its two implementations, chosen once by `detect`.

Everything that differs between the two tools lives in their classes: the build command
line, how a command runs inside an image, where an image's config is in `inspect`'s JSON,
pull and push, the bytes an image adds over its base, and the working container buildah
needs (docker runs images directly). The rest of `llamaspec.images` calls the interface
and never asks which tool it has. Every call goes through `llamaspec.procs` (own process
group, a time limit) and has its exit status checked.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from llamaspec import env, procs
from llamaspec.errors import LlamaspecError, choose
from llamaspec.images.remote import push_error, tls_flags
from llamaspec.paths import cache_dir

CHOICES = ("auto", "docker", "buildah")
# Time limits (seconds) for the tools' calls.
QUICK_S = 120  # inspect, info, version, from, rm, mount, commit, config
TRANSFER_S = 3600  # pull, push
BUILD_S = 6 * 3600  # one image build target (a cold CUDA build stage is long)

Volume = tuple[Path, str]  # (host path, path inside)

# Where the image build stage keeps its caches: docker/Dockerfile.* set LLAMASPEC_CACHE and
# CCACHE_DIR to these, and buildah mounts the host's caches there (`host_caches`).
STAGE_CACHE = "/cache/llamaspec"
STAGE_CCACHE = "/cache/ccache"


@dataclass(frozen=True)
class BuildSettings:
    """How one tool builds here: the buildx cache (docker), or host caches mounted into the
    build stage and whether the base image is already in local storage (buildah).
    `keep_layers`: keep the stages' intermediate images as a cache for the next build
    (buildah `--layers`); an image around an artifact from dist/ has nothing to reuse, so
    nothing of its build is kept (`ContainerTool.new_images_removed`)."""

    cache: str | None = None  # e.g. "type=gha,scope=llama.cpp-cpu"
    volumes: tuple[Volume, ...] = ()
    pull_never: bool = False
    keep_layers: bool = True


@runtime_checkable
class ContainerTool(Protocol):
    """What `llamaspec.images` needs from a container tool."""

    name: str  # "docker" or "buildah": for messages and records, never for branching
    path: str

    def build_settings(
        self, base_image: str, ccache: Path | None, say: Callable[[str], object]
    ) -> BuildSettings: ...

    def build_argv(
        self,
        dockerfile: Path,
        context: Path,
        target: str,
        args: Mapping[str, str],
        settings: BuildSettings = BuildSettings(),
        *,
        tags: Sequence[str] = (),
        output: Path | None = None,
        push: bool = False,
        ca_bundle: Path | None = None,
    ) -> list[str]: ...

    def run_argv(
        self,
        ctr: str,
        argv: Sequence[str],
        mounts: Sequence[Volume] = (),
        env: Mapping[str, str] | None = None,
        network: bool = False,
    ) -> list[str]: ...

    def working_container(self, ref: str) -> AbstractContextManager[str]: ...

    def image_exists(self, ref: str) -> bool: ...

    def inspect(self, ref: str) -> dict: ...

    def labels(self, ref: str) -> dict[str, str]: ...

    def new_images_removed(self) -> AbstractContextManager[None]: ...

    def read_file(self, ctr: str, path: str) -> str: ...

    def pull_argv(self, ref: str) -> list[str]: ...

    def tag(self, ref: str, new: str) -> None: ...

    def push(self, ref: str) -> str | None: ...

    def push_built(self, refs: Sequence[str]) -> None: ...

    def added_bytes(self, ref: str, base: str) -> tuple[int, int]: ...


# --- running the tools ---------------------------------------------------------------------


def attempt(cmd: Sequence[str], timeout: float = QUICK_S, what: str | None = None, **kw):
    """Run a tool's command whose failure the caller reads (exit status, output)."""
    return procs.run(cmd, timeout=timeout, check=False, what=what or _what(cmd), **kw)


def call(cmd: Sequence[str], why: str, timeout: float = QUICK_S, **kw) -> str:
    """Run a tool's command that must succeed; its stdout. `why` completes "Cannot …"."""
    proc = attempt(cmd, timeout, **kw)
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout or "").strip()
        raise LlamaspecError(
            f"Cannot {why}: `{' '.join(cmd[:3])} …` exited with status {proc.returncode}"
            + (f" ({out.splitlines()[-1]})." if out else ".")
        )
    return proc.stdout


def _what(cmd: Sequence[str]) -> str:
    return " ".join([Path(cmd[0]).name, *cmd[1:2]])


def _last_line(proc) -> str:
    text = (proc.stderr or proc.stdout or "").strip()
    return text.splitlines()[-1] if text else "no answer"


# --- shared by both tools ------------------------------------------------------------------


class _Common:
    """What both tools do alike. Each tool names its own parts of a command line: the
    build command's head (`_build_head`) and what follows the shared options
    (`_build_tail`), the run command's head (`_run_head`), its environment flag and how the
    image and command end it (`_run_tail`)."""

    path: str
    env_flag: ClassVar[str]

    def build_argv(
        self,
        dockerfile: Path,
        context: Path,
        target: str,
        args: Mapping[str, str],
        settings: BuildSettings = BuildSettings(),
        *,
        tags: Sequence[str] = (),
        output: Path | None = None,
        push: bool = False,
        ca_bundle: Path | None = None,
    ) -> list[str]:
        cmd = self._build_head(settings)
        if ca_bundle is not None:
            cmd += ["--secret", f"id=ca,src={ca_bundle}"]
        cmd += ["-f", str(dockerfile), "--target", target]
        for key, value in args.items():
            cmd += ["--build-arg", f"{key}={value}"]
        for tag in tags:
            cmd += ["-t", tag]
        if output is not None:
            cmd += ["--output", f"type=local,dest={output}"]
        return [*cmd, *self._build_tail(output, push), str(context)]

    def run_argv(
        self,
        ctr: str,
        argv: Sequence[str],
        mounts: Sequence[Volume] = (),
        env: Mapping[str, str] | None = None,
        network: bool = False,
    ) -> list[str]:
        """`argv` in a container of `ctr`; with the host's network only where `network` (a
        server the host talks to), else none where the tool can isolate it."""
        cmd = self._run_head(argv, network)
        for host, inside in mounts:
            cmd += ["-v", f"{host}:{inside}:ro"]
        for key, value in (env or {}).items():
            cmd += [self.env_flag, f"{key}={value}"]
        return [*cmd, *self._run_tail(ctr, argv)]

    def _build_head(self, settings: BuildSettings) -> list[str]:
        raise NotImplementedError

    def _build_tail(self, output: Path | None, push: bool) -> list[str]:
        raise NotImplementedError

    def _run_head(self, argv: Sequence[str], network: bool) -> list[str]:
        raise NotImplementedError

    def _run_tail(self, ctr: str, argv: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def labels(self, ref: str) -> dict[str, str]:
        return self.inspect(ref).get("Labels") or {}  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def new_images_removed(self) -> Iterator[None]:
        """Around a build whose intermediate images are worth nothing later: remove the
        untagged images it made (nothing to do where the tool keeps none in its storage)."""
        yield

    def tag(self, ref: str, new: str) -> None:
        """Give the local image `ref` (e.g. `name@sha256:…`) the name `new` as well."""
        call([self.path, "tag", ref, new], f"tag {ref} as {new}")

    def read_file(self, ctr: str, path: str) -> str:
        """The text of `path` inside the image (`cat` run in it)."""
        argv = self.run_argv(ctr, ["cat", path])
        return call(argv, f"read {path} from the image", timeout=QUICK_S)


# --- docker buildx -------------------------------------------------------------------------


@dataclass(frozen=True)
class Docker(_Common):
    """docker with the buildx plugin and a running engine."""

    path: str = "docker"
    name: str = field(default="docker", init=False)
    env_flag: ClassVar[str] = "-e"

    def build_settings(
        self, base_image: str, ccache: Path | None, say: Callable[[str], object]
    ) -> BuildSettings:
        # buildx pulls the base itself and keeps its own build cache (the workflow: gha)
        return BuildSettings(cache=env.get(env.BUILDX_CACHE))

    def _build_head(self, settings: BuildSettings) -> list[str]:
        cmd = [self.path, "buildx", "build", "--progress", "plain"]
        if settings.cache:
            kind, _, rest = settings.cache.partition(",")
            to = f"{kind},mode=max{',' + rest if rest else ''}"
            cmd += ["--cache-from", settings.cache, "--cache-to", to]
        return cmd

    def _build_tail(self, output: Path | None, push: bool) -> list[str]:
        return [] if output is not None else ["--push" if push else "--load"]

    def _run_head(self, argv: Sequence[str], network: bool) -> list[str]:
        net = "host" if network else "none"
        return [self.path, "run", "--rm", "-i", "--network", net, "--entrypoint", argv[0]]

    def _run_tail(self, ctr: str, argv: Sequence[str]) -> list[str]:
        return [ctr, *argv[1:]]

    @contextlib.contextmanager
    def working_container(self, ref: str) -> Iterator[str]:
        yield ref  # `docker run --rm` starts a fresh container for every command

    def image_exists(self, ref: str) -> bool:
        return attempt([self.path, "image", "inspect", ref]).returncode == 0

    def inspect(self, ref: str) -> dict:
        """The image's config (Labels, User, Env, Healthcheck, …)."""
        out = call([self.path, "image", "inspect", ref], f"inspect {ref}")
        return json.loads(out)[0]["Config"] or {}

    def pull_argv(self, ref: str) -> list[str]:
        return [self.path, "pull", ref]

    def push(self, ref: str) -> str | None:
        """Push `ref`; the manifest digest the push reports."""
        proc = attempt([self.path, "push", ref], TRANSFER_S)
        if proc.returncode != 0:
            raise push_error(proc.stderr or proc.stdout or "", ref)
        return push_digest(proc.stdout)

    def push_built(self, refs: Sequence[str]) -> None:
        """Nothing left to do: `buildx build --push` pushed while building."""

    def added_bytes(self, ref: str, base: str) -> tuple[int, int]:
        def size(r: str) -> int:
            out = call([self.path, "image", "inspect", "--format", "{{.Size}}", r], f"size {r}")
            return int(out.strip())

        return size(ref) - size(base), size(base)


# --- buildah -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Buildah(_Common):
    """buildah: builds and runs images without a daemon (`--isolation chroot`)."""

    path: str = "buildah"
    name: str = field(default="buildah", init=False)
    env_flag: ClassVar[str] = "--env"

    def build_settings(
        self, base_image: str, ccache: Path | None, say: Callable[[str], object]
    ) -> BuildSettings:
        # The base is pulled here, once, when it is not in local storage: the build and the
        # working containers (`buildah from --pull=never`) then all use that one local image.
        if not self.image_exists(base_image):
            say(f"docker-build: {base_image} is not in local storage; pulling it")
            proc = attempt(self.pull_argv(base_image), TRANSFER_S)
            if proc.returncode != 0:
                said = (proc.stderr or proc.stdout or "").strip().splitlines()
                raise LlamaspecError(
                    f"The base image {base_image} is not in local storage and `buildah pull` "
                    f"could not fetch it ({said[-1] if said else f'status {proc.returncode}'}). "
                    "Without a registry, make it first with `llamaspec docker base --tag "
                    f"{base_image}` (debootstrap), or give --base-image an image buildah has."
                )
        return BuildSettings(volumes=tuple(host_caches(ccache)), pull_never=True)

    def _build_head(self, settings: BuildSettings) -> list[str]:
        # --force-rm: no working container is left behind, even by a failed build (a stage
        # that is only `FROM <another stage>` leaves one otherwise); the untagged images of a
        # build that keeps no layers are removed after it (`new_images_removed`)
        cmd = [self.path, "bud", "--isolation", "chroot", "--layers", "--force-rm"]
        cmd += ["--format", "docker"]
        if settings.pull_never:
            cmd.append("--pull=never")
        for host, inside in settings.volumes:
            cmd += ["--volume", f"{host}:{inside}"]
        return cmd

    def _build_tail(self, output: Path | None, push: bool) -> list[str]:
        return []  # buildah builds into local storage; `push_built` pushes afterwards

    def _run_head(self, argv: Sequence[str], network: bool) -> list[str]:
        # chroot isolation shares the host's network and can take no other ("cannot set
        # --network other than host with --isolation chroot"): a check runs with it
        return [self.path, "run", "--isolation", "chroot"]

    def _run_tail(self, ctr: str, argv: Sequence[str]) -> list[str]:
        return [ctr, "--", *argv]

    @contextlib.contextmanager
    def working_container(self, ref: str) -> Iterator[str]:
        """A working container of `ref` (`scratch`: an empty one), removed afterwards."""
        out = call(
            [self.path, "from", "--pull=never", "--quiet", ref],
            f"start a working container of {ref}",
        )
        name = out.strip().splitlines()[-1]
        try:
            yield name
        except BaseException:
            attempt([self.path, "rm", name])  # the exception in flight says more
            raise
        call([self.path, "rm", name], f"remove the working container {name} (`buildah rm`)")

    def image_exists(self, ref: str) -> bool:
        return attempt([self.path, "inspect", "--type", "image", ref]).returncode == 0

    def _untagged(self) -> set[str]:
        proc = attempt([self.path, "images", "-q", "--no-trunc", "--filter", "dangling=true"])
        return set(proc.stdout.split()) if proc.returncode == 0 else set()

    @contextlib.contextmanager
    def new_images_removed(self) -> Iterator[None]:
        """The stages' untagged images this build made are removed afterwards, failed or
        not (`--layers=false` would not make them, but buildah 1.28 then fails at the end of
        a stage that is only `FROM <an earlier stage>`: "identifier is not an image")."""
        before = self._untagged()
        try:
            yield
        finally:
            made = sorted(self._untagged() - before)
            if made:
                attempt([self.path, "rmi", *made])

    def inspect(self, ref: str) -> dict:
        """The image's config (Labels, User, Env, Healthcheck, …) as Docker's JSON spells it."""
        out = call([self.path, "inspect", "--type", "image", ref], f"inspect {ref}")
        return json.loads(out)["Docker"]["config"] or {}

    def pull_argv(self, ref: str) -> list[str]:
        return [self.path, "pull", "--quiet", *tls_flags(ref), ref]

    def push(self, ref: str) -> str | None:
        with tempfile.TemporaryDirectory(prefix="llamaspec-push-") as tmp:
            digestfile = Path(tmp) / "digest"
            argv = [self.path, "push", *tls_flags(ref), "--digestfile", str(digestfile)]
            proc = attempt([*argv, ref, f"docker://{ref}"], TRANSFER_S)
            if proc.returncode != 0:
                raise push_error(proc.stderr or proc.stdout or "", ref)
            text = digestfile.read_text().strip() if digestfile.is_file() else ""
        return push_digest(f"digest: {text}")

    def push_built(self, refs: Sequence[str]) -> None:
        """buildah builds into local storage: `docker build --push` pushes afterwards."""
        for ref in refs:
            self.push(ref)

    def added_bytes(self, ref: str, base: str) -> tuple[int, int]:
        """Sums the layers in buildah's local storage (layers.json, images.json)."""
        store = json.loads(call([self.path, "info"], "read buildah's storage (`buildah info`)"))
        root, driver = Path(store["store"]["GraphRoot"]), store["store"]["GraphDriverName"]
        layers = {
            la["id"]: la for la in json.loads((root / f"{driver}-layers/layers.json").read_text())
        }
        tops = {
            im["id"]: im.get("layer")
            for im in json.loads((root / f"{driver}-images/images.json").read_text())
        }

        def chain(r: str) -> list[str]:
            proc = attempt([self.path, "inspect", "--type", "image", r])
            if proc.returncode != 0:
                raise LlamaspecError(f"{r} is not in local storage: {_last_line(proc)}.")
            out, layer = [], tops.get(json.loads(proc.stdout)["FromImageID"])
            while layer:
                out.append(layer)
                layer = layers[layer].get("parent")
            return out

        base_layers = set(chain(base))
        added = sum(layers[la].get("diff-size", 0) for la in chain(ref) if la not in base_layers)
        return added, sum(layers[la].get("diff-size", 0) for la in base_layers)

    # buildah alone: assembling an image from a root file system (`llamaspec docker base`)

    def mount(self, ctr: str) -> Path:
        return Path(call([self.path, "mount", ctr], f"mount the container {ctr}").strip())

    def umount(self, ctr: str) -> None:
        call([self.path, "umount", ctr], f"unmount the container {ctr}")

    def config(self, ctr: str, options: Sequence[str]) -> None:
        call([self.path, "config", *options, ctr], f"configure the container {ctr}")

    def commit(self, ctr: str, tag: str) -> None:
        call([self.path, "commit", "--quiet", ctr, tag], f"commit {tag}", TRANSFER_S)


def push_digest(output: str) -> str | None:
    """The manifest digest a push reports (`… digest: sha256:<64 hex> size: …`)."""
    found = re.findall(r"digest: (sha256:[0-9a-f]{64})", output)
    return found[-1] if found else None


def host_ccache_dir() -> Path | None:
    """The host's ccache directory (where its builds left their objects), if ccache is here."""
    ccache = shutil.which("ccache")
    if not ccache:
        return None
    proc = attempt([ccache, "--get-config", "cache_dir"], 30)
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


def host_caches(ccache: Path | None) -> list[Volume]:
    """Host caches mounted into buildah's build stage, where the Dockerfiles point
    LLAMASPEC_CACHE and CCACHE_DIR (`STAGE_CACHE`, `STAGE_CCACHE`): the sdist downloads and
    ccache. The host's objects are hits there: ccache's base_dir is the source tree
    (`llamaspec.engine.build.ccache_env`), so compile commands read the same relative paths
    wherever the cache lies, and every compile runs in the C locale, which ccache hashes
    (`llamaspec.engine.build.COMPILE_LOCALE`)."""
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    out = [(downloads, f"{STAGE_CACHE}/downloads")]
    ccache = ccache or host_ccache_dir()
    if ccache is not None:
        ccache.mkdir(parents=True, exist_ok=True)
        out.append((ccache, STAGE_CCACHE))
    return out


# --- choosing one --------------------------------------------------------------------------


def docker_engine_error(docker: str) -> str | None:
    """None when a Docker engine answers, else why not (the CLI's own words)."""
    proc = attempt([docker, "info", "--format", "{{.ServerVersion}}"], 30)
    if proc.returncode == 0 and proc.stdout.strip():
        return None
    return _last_line(proc)


def detect(choice: str = "auto", path: str | None = None) -> ContainerTool:
    """docker when a Docker engine runs (with buildx), else buildah; or say what to install.

    `path` is the search path (default: $PATH)."""
    choose("container tool", choice, CHOICES)
    docker, buildah = shutil.which("docker", path=path), shutil.which("buildah", path=path)
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
        if attempt([docker, "buildx", "version"], 30).returncode != 0:
            raise LlamaspecError(
                "Docker runs but the buildx plugin is missing; install it (Debian/Ubuntu: "
                "`apt-get install docker-buildx-plugin`)."
            )
        return Docker(docker)
    if buildah and choice in ("auto", "buildah"):
        return Buildah(buildah)
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
