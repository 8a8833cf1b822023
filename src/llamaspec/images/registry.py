"""Images and registries: which image suits this host, pulling it (refused unless its labels
match), how to run it with a recipe, and pushing built tags."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from llamaspec import env
from llamaspec.config import Engine, load_engines
from llamaspec.engine import backends
from llamaspec.engine.cuda.host import DRIVER_MIN, nvidia_smi
from llamaspec.errors import LlamaspecError, choose
from llamaspec.images import commands, remote
from llamaspec.images import specs as images
from llamaspec.images.remote import RemoteError
from llamaspec.images.tools import TRANSFER_S, ContainerTool, attempt

# Who signs published images: the publishing workflow of one repository, keyless, through
# GitHub's OIDC, on its main branch or a release tag (the workflow's triggers).
SIGNER_ISSUER = "https://token.actions.githubusercontent.com"
SIGNER_WORKFLOW = ".github/workflows/docker.yml"
# Names the repository whose workflow must have signed a pulled image (OWNER/REPO), for
# forks that publish under another name; by default it follows from the registry.
SIGNER_ENV = env.SIGNER_REPO.name
SIGNER_FORM = env.SIGNER_REPO.pattern  # OWNER/REPO
# The repository that publishes the default registry, ghcr.io/<owner>: <owner>/llamaspec.
PUBLISHER = f"{images.DEFAULT_REGISTRY.split('/')[1]}/{images.REPOSITORY}"
# Time for `cosign verify` (registry, transparency log and certificate roots): no layers.
VERIFY_S = 300
# The CUDA majors images are built for (tags `<engine>-cuda13`, …), newest first.
CUDA_MAJORS = (13, 12)


def configured_registry(given: str | None) -> tuple[str, str]:
    """The registry to pull from and where that came from: --registry, else
    LLAMASPEC_REGISTRY, else the user config's `registry`, else the published one. An empty
    or malformed value is refused wherever it came from, never read as the default."""
    from llamaspec.config import user as user_config

    if given is not None:
        return remote.check_registry(given, "--registry"), "--registry"
    given = env.raw(env.REGISTRY)
    if given is not None:
        return remote.check_registry(given, env.REGISTRY.name), env.REGISTRY.name
    cfg, path = user_config.load()
    if cfg.registry is not None:
        return remote.check_registry(cfg.registry, f"`registry` in {path}"), str(path)
    return images.DEFAULT_REGISTRY, "the default"


def signature_required() -> bool:
    """The user config's `require_signature` (off when unset)."""
    from llamaspec.config import user as user_config

    cfg, _path = user_config.load()
    return cfg.require_signature


def signer_repo(registry: str, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The GitHub repository (OWNER/REPO) whose publishing workflow must have signed images
    of `registry`, and why: LLAMASPEC_SIGNER_REPO, else the namespace of `ghcr.io/<owner>`
    (the workflow pushes to ghcr.io/<repository owner>/llamaspec), else the repository that
    publishes the default registry (a registry elsewhere holds copies of its images)."""
    env = os.environ if env is None else env
    given = env.get(SIGNER_ENV)
    if given is not None:
        if not re.fullmatch(SIGNER_FORM, given):
            raise LlamaspecError(
                f"{SIGNER_ENV} {given!r} is not a GitHub repository: give it as OWNER/REPO "
                f"(e.g. {PUBLISHER}), the repository whose {SIGNER_WORKFLOW} signs the "
                f"images, or unset it to derive it from the registry."
            )
        return given, SIGNER_ENV
    host, _, namespace = registry.rstrip("/").partition("/")
    if host == "ghcr.io" and namespace and "/" not in namespace:
        return f"{namespace}/{images.REPOSITORY}", f"the registry's namespace ghcr.io/{namespace}"
    return PUBLISHER, f"the publisher of {images.DEFAULT_REGISTRY}"


def signer_identity(repo: str) -> str:
    """The certificate identity cosign must find, as a regular expression (Go's and
    Python's syntax alike): `repo`'s publishing workflow (owner and name in any case, as
    GitHub treats them) run on its main branch, nothing else. The workflow publishes from
    main only (a run dispatched on another branch or a tag builds and signs nothing), so no
    tag is an identity: a run dispatched by hand on a tag cannot make a signature that
    passes."""
    owner, name = (re.escape(part) for part in repo.split("/", 1))
    return (
        rf"^https://github\.com/(?i:{owner}/{name})/{re.escape(SIGNER_WORKFLOW)}"
        r"@refs/heads/main$"
    )


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
    if root == Path("/"):
        try:
            listed = nvidia_smi(["-L"], which=which)
        except LlamaspecError as err:
            raise LlamaspecError(
                f"nvidia-smi could not list this host's GPUs ({err}) The NVIDIA driver may be "
                "hung; name the image's backend yourself with --backend cuda, vulkan or cpu."
            ) from None
        if listed is not None and listed.returncode == 0 and "GPU" in listed.stdout:
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


@dataclass(frozen=True)
class CudaHost:
    """What `nvidia-smi` says about this host's first GPU."""

    driver: str  # e.g. "580.65.06"
    capability: int  # compute capability as CUDA architectures spell it: 8.6 → 86

    def tag_backend(self) -> str:
        """`cuda13` where the driver runs CUDA 13, else `cuda12`; refused below both."""
        major = int(self.driver.split(".")[0])
        for cuda in CUDA_MAJORS:
            if major >= DRIVER_MIN[cuda]:
                return f"cuda{cuda}"
        mins = ", ".join(f"cuda{c} needs {DRIVER_MIN[c]} or newer" for c in CUDA_MAJORS)
        raise LlamaspecError(
            f"This host's NVIDIA driver {self.driver} is too old for every published CUDA "
            f"image ({mins}). Update the driver, or build for it here with a system CUDA "
            "toolkit the driver supports: `llamaspec build --backend cuda --cuda-toolkit system`."
        )


def cuda_host(which: Callable[[str], str | None] = shutil.which) -> CudaHost:
    """Driver version and compute capability (`nvidia-smi --query-gpu`), or why a CUDA
    image cannot run here."""
    query = ["--query-gpu=driver_version,compute_cap", "--format=csv,noheader"]
    proc = nvidia_smi(query, which=which)
    if proc is None:
        raise LlamaspecError(
            "A cuda image was asked for, but this host has no NVIDIA driver (nvidia-smi is "
            "not on PATH), so no CUDA image can run here. Pull the image for this host "
            "(leave out --backend) or --backend cpu."
        )
    rows = [r.split(",") for r in proc.stdout.strip().splitlines() if "," in r]
    try:
        driver, cap = rows[0][0].strip(), rows[0][1].strip()
        capability = int(cap.replace(".", ""))
        int(driver.split(".")[0])
    except (IndexError, ValueError):
        said = (proc.stderr or proc.stdout or "").strip() or f"exit {proc.returncode}"
        raise LlamaspecError(
            f"nvidia-smi did not name a GPU's driver and compute capability ({said}); a cuda "
            "image needs a working NVIDIA driver. Check `nvidia-smi`, or pull --backend cpu."
        ) from None
    return CudaHost(driver, capability)


def check_cuda_image(labels: Mapping[str, str], ref: str, host: CudaHost) -> None:
    """Refuse a CUDA image this GPU or its driver cannot run, with what would."""
    archs = [int(a) for a in labels.get(images.LABEL_PREFIX + "cuda-archs", "").split(",") if a]
    version = labels.get(images.LABEL_PREFIX + "cuda", "")
    cap = f"{host.capability // 10}.{host.capability % 10}"
    if archs and host.capability not in archs:
        raise LlamaspecError(
            f"Refusing {ref}: it is compiled for GPU architectures "
            f"{', '.join(f'sm_{a}' for a in archs)}, and this GPU is sm_{host.capability} "
            f"(compute capability {cap}). Build for this GPU here: `llamaspec build --backend "
            f"cuda --cuda-arch {host.capability}` (CUDA 13 targets sm_75 and newer; older GPUs "
            "need a system CUDA 12 toolkit)."
        )
    if version:
        need = DRIVER_MIN.get(int(version.split(".")[0]), 0)
        if int(host.driver.split(".")[0]) < need:
            raise LlamaspecError(
                f"Refusing {ref}: it carries CUDA {version}, which needs an NVIDIA driver "
                f"{need} or newer; this host has {host.driver}. Pull the tag the driver runs "
                f"(`--tag` with {host.tag_backend()}), or update the driver."
            )


def run_hint(
    ref: str,
    backend: str,
    engine: Engine,
    commit: str | None,
    recipe_name: str = images.DEFAULT_RECIPE,
    root: Path | None = None,
) -> str:
    """How to run the image with a recipe: the pair's GGUFs mounted at /models, the recipe
    rendered in the engine's dialect. The image listens on 0.0.0.0:8080 inside; the port is
    published on the host's loopback only, since llama-server has no authentication unless
    given --api-key."""
    from llamaspec.models import recipes

    recipe, catalog = recipes.find(recipe_name, root)
    pair = catalog.pairs[recipe.pair]
    target = f"{images.CONTAINER_MODELS}/{catalog.models[pair.target].file}"
    draft = f"{images.CONTAINER_MODELS}/{catalog.models[pair.draft].file}" if pair.draft else None
    dialect = engine.dialect if commit in (None, engine.pin) else "upstream"
    cmd = recipes.render(recipe, engine.name, dialect, target, draft, backend=backend)
    return (
        f"# put the GGUFs of pair {recipe.pair!r} in ./models; or, after `llamaspec models "
        f"pull {recipe.pair}`\n# (the Hugging Face cache), `llamaspec recipe show "
        f"{recipe.name} --format docker` prints this line with those files mounted\n"
        + commands.docker_run(ref, backend, cmd.argv, [('"$PWD/models"', images.CONTAINER_MODELS)])
    )


def pull_target(
    engine_name: str,
    backend: str | None,
    pin: str | None,
    recipe: str,
    console: Console,
    root: Path | None = None,
) -> tuple[Engine, str, CudaHost | None]:
    """Check what `docker pull` was asked for (engine, backend, pin, recipe) before any
    container tool is looked for; the backend defaults to this host's, and for cuda the
    driver and GPU are read (they choose the tag)."""

    engines = load_engines(root)
    engine = engines[choose("engine", engine_name, engines)]
    if backend is not None:
        choose("backend", backend, images.BACKENDS)
    images.validate(
        images.ImageSpec(engine=engine.name, backend=backend or "cpu", pin=pin), engines
    )
    from llamaspec.models import recipes

    recipes.find(recipe, root)
    if backend is None:
        host = detect_host()
        backend = host.backend
        console.print(f"docker-pull: this host → {backend} ({host.reason})")
    cuda = cuda_host() if backends.backend(backend).cuda else None
    if cuda:
        console.print(
            f"docker-pull: NVIDIA driver {cuda.driver}, GPU sm_{cuda.capability} → "
            f"{cuda.tag_backend()} images"
        )
    return engine, backend, cuda


def pull_error(
    output: str,
    ref: str,
    registry: str,
    engine: str,
    backend: str,
    tags: Sequence[str] | None = None,
) -> LlamaspecError:
    """What a failed pull (or label read) means, from what the tool printed: the registry
    was not reached, wants credentials, failed, did not answer, failed TLS, or has no such
    tag (`tags`: the ones it has, where they could be listed)."""
    kind, last, host = remote.classify(output), remote.last_line(output), remote.host_of(ref)
    build = f"llamaspec docker build --engine {engine} --backend {backend}"
    if kind == "unreachable":
        return LlamaspecError(
            f"Cannot reach the registry {host} to pull {ref} "
            f"({last or 'no answer'}). Check the network or proxy, or build the same image "
            f"here instead: `{build}`."
        )
    if kind == "missing":
        return LlamaspecError(
            f"{registry} has no image {ref} ({last or 'manifest unknown'}). "
            f"{remote.tags_sentence(remote.repository_of(ref), tags)} "
            + ("Pull one of them with `--tag`, or build" if tags else "Build")
            + f" it here: `{build}`."
        )
    if kind == "other":
        return LlamaspecError(
            f"Cannot pull {ref} from {registry} ({last or 'the pull failed'}). To do without "
            f"the registry, build the same image here: `{build}`."
        )
    return LlamaspecError(
        f"Cannot pull {ref}. {remote.explain(kind, host, last)} To do without the registry, "
        f"build the same image here: `{build}`."
    )


def refusal(
    output: str, ref: str, registry: str, engine: str, backend: str, which=shutil.which
) -> LlamaspecError:
    """`pull_error`, with the repository's tags listed (bounded in time) when the tag is
    missing."""
    tags = None
    if remote.classify(output) == "missing":
        try:
            tags = remote.list_tags(remote.repository_of(ref), which)
        except (RemoteError, ValueError) as err:  # no such repository: no tags either
            tags = [] if remote.classify(str(err)) == "missing" else None
    return pull_error(output, ref, registry, engine, backend, tags)


@dataclass(frozen=True)
class Verified:
    """What cosign verified: the reference asked about, the identity it was held to, and
    the manifest digests its verified payloads name."""

    ref: str
    identity: str
    digests: frozenset[str]


def verify_signature(
    ref: str,
    console: Console,
    which=shutil.which,
    signer: str | None = None,
    required: bool = False,
) -> Verified | None:
    """Check `ref`'s cosign signature where cosign is installed: made by `signer`'s
    publishing workflow (OWNER/REPO; default: `signer_repo` of the ref's registry), else
    refused. Without cosign, say that nothing was verified (None), or refuse where a
    signature is `required`."""
    cosign = which("cosign")
    if not cosign and required:
        raise LlamaspecError(
            f"Refusing {ref}: a verified signature is required (--require-signature, or "
            "`require_signature: true` in the user config) and cosign is not installed, so "
            "nothing can be verified. Install cosign "
            "(https://docs.sigstore.dev/cosign/system_config/installation/) and pull again, "
            "or leave the requirement off to pull unverified."
        )
    if not cosign:
        console.print(
            f"docker-pull: the signature of {ref} was NOT verified: cosign is not installed "
            "(https://docs.sigstore.dev/cosign/system_config/installation/)"
        )
        return None
    if signer is None:
        signer, why = signer_repo(remote.repository_of(ref).rsplit("/", 1)[0])
    else:
        why = "given"
    identity = signer_identity(signer)
    proc = attempt(
        [
            cosign, "verify", "--certificate-oidc-issuer", SIGNER_ISSUER,
            "--certificate-identity-regexp", identity, ref,
        ],
        VERIFY_S,
    )  # fmt: skip
    if proc.returncode != 0:
        last = remote.last_line(proc.stderr or proc.stdout or "") or f"exit {proc.returncode}"
        raise LlamaspecError(
            f"Refusing {ref}: cosign could not verify that {signer}'s publishing workflow "
            f"({SIGNER_WORKFLOW} on main; {signer} is {why}) signed it ({last}). "
            f"Pull an image that workflow published, set {SIGNER_ENV}=OWNER/REPO to the "
            "repository that publishes this registry's images, or build one yourself with "
            "`llamaspec docker build`."
        )
    console.print(f"docker-pull: {ref}: signature verified (cosign, {signer}, {SIGNER_ISSUER})")
    return Verified(ref, identity, payload_digests(proc.stdout))


def payload_digests(stdout: str) -> frozenset[str]:
    """The manifest digests named by the payloads `cosign verify` printed (a JSON list)."""
    start = stdout.find("[")
    try:
        payloads = json.loads(stdout[start:]) if start >= 0 else []
    except ValueError:
        return frozenset()
    found = set()
    for item in payloads if isinstance(payloads, list) else []:
        image = item.get("critical", {}).get("image", {}) if isinstance(item, dict) else {}
        digest = image.get("docker-manifest-digest") if isinstance(image, dict) else None
        if isinstance(digest, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            found.add(digest)
    return frozenset(found)


def pinned_digest(ref: str, digest: str | None, verified: Verified | None) -> str | None:
    """The one digest to pull: the registry's (`digest`, read once) and the one cosign
    verified must be the same; without skopeo it is the one cosign verified."""
    if verified is None:
        return digest
    if not verified.digests:
        raise LlamaspecError(
            f"Refusing {ref}: cosign verified a signature but its output named no image "
            "digest, so what would be pulled cannot be tied to what was verified (the tag "
            "could have moved). Pull again; if it persists, check `cosign verify` by hand "
            "(docs/guides/docker.md) or update cosign."
        )
    if digest is None:
        if len(verified.digests) != 1:
            raise LlamaspecError(
                f"Refusing {ref}: cosign verified signatures for "
                f"{len(verified.digests)} digests ({', '.join(sorted(verified.digests))}), so "
                "which image the tag means is not settled. Install skopeo (the tag is then "
                "resolved to one digest first), or pull an immutable tag."
            )
        return next(iter(verified.digests))
    if digest not in verified.digests:
        raise LlamaspecError(
            f"Refusing {ref}: the registry named {digest}, but cosign verified "
            f"{', '.join(sorted(verified.digests))}. The tag may have moved while it was "
            "checked; pull again."
        )
    return digest


def pull(
    tool: ContainerTool,
    engine: Engine,
    backend: str,
    pin: str | None,
    registry: str,
    tag: str | None,
    console: Console,
    recipe: str = images.DEFAULT_RECIPE,
    cuda: CudaHost | None = None,
    require_signature: bool = False,
) -> str:
    """Pull the image (checked by `pull_target`), refuse it unless its labels match (and,
    for CUDA, this GPU and driver run it), and print how to run it with `recipe`.

    The tag is resolved to a manifest digest once (skopeo, with the labels; without skopeo,
    the digest cosign verified), and that digest is what is verified, pulled and then
    tagged here: the image cannot change between the check and the pull."""
    tag_backend = cuda.tag_backend() if cuda else backend

    def check(labels: Mapping[str, str]) -> None:
        images.check_labels(labels, ref, engine.name, backend, pin)
        if cuda:
            check_cuda_image(labels, ref, cuda)

    ref = images.image_ref(registry, tag or images.rolling_tag(engine.name, tag_backend))
    name = remote.repository_of(ref)
    try:
        found = remote.inspect(ref)
    except RemoteError as err:
        raise refusal(str(err), ref, registry, engine.name, backend) from None
    if found is None:
        console.print(
            "docker-pull: skopeo is not installed, so the labels are checked after the pull "
            "(`apt-get install skopeo` checks them before any layer is downloaded)"
        )
    else:
        check(found.labels)
    digest = found.digest if found else None
    verified = verify_signature(
        f"{name}@{digest}" if digest else ref, console, required=require_signature
    )
    digest = pinned_digest(ref, digest, verified)
    source = f"{name}@{digest}" if digest else ref
    if found is not None:
        console.print(f"docker-pull: {ref}: labels checked in the registry, pulling the layers")
    if digest:
        console.print(f"docker-pull: {ref} is {source}; pulling exactly that")
    proc = attempt(tool.pull_argv(source), TRANSFER_S)
    if proc.returncode != 0:
        output = proc.stderr or proc.stdout or ""
        raise refusal(output, ref, registry, engine.name, backend)
    if source != ref:
        tool.tag(source, ref)
    labels = tool.labels(ref)
    check(labels)
    commit = labels.get(images.LABEL_PREFIX + "engine-commit")
    patches = labels.get(images.LABEL_PREFIX + "patches") or "-"
    console.print(
        f"docker-pull: {ref} = {labels.get(images.LABEL_PREFIX + 'artifact-id')} "
        f"({engine.name}@{(commit or '?')[:12]}, patches {patches})"
    )
    console.print(f"Run it with the recipe {recipe!r}:\n")
    print(run_hint(ref, backend, engine, commit, recipe))
    return ref


def push(tool: ContainerTool, refs: Sequence[str]) -> str:
    """Push every tag; return `<repository>@sha256:…`, the reference to sign. A refusal
    says what the registry meant (`remote.push_error`)."""
    if not refs:
        raise LlamaspecError("The build record names no tags to push; run `docker build` again.")
    digest = ""
    for ref in refs:
        digest = tool.push(ref) or digest
    if not digest:
        raise LlamaspecError(f"Pushed {', '.join(refs)} but the push named no digest.")
    return f"{refs[0].rsplit(':', 1)[0]}@{digest}"
