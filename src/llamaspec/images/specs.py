"""Docker images: what an image is made of (spec), what it says it is (labels, tags).

Pure functions on frozen values; `tools.py` runs the container tools. An image is built from
docker/Dockerfile.<backend> by the same fetch → patch → build code as a local build, so
its labels are computed from the manifest that build wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from llamaspec.config import Engine, PatchEntry
from llamaspec.engine import backends
from llamaspec.errors import LlamaspecError, choose
from llamaspec.images.remote import check_registry

BACKENDS = ("cpu", "cuda", "vulkan")
REPOSITORY = "llamaspec"
DEFAULT_REGISTRY = "ghcr.io/llamaspec"
LOCAL_REGISTRY = "localhost"
LABEL_PREFIX = "io.llamaspec."
CONTAINER_MODELS = "/models"  # where `docker run` mounts the GGUFs
DEFAULT_RECIPE = "qwen2.5-coder-7b"  # the recipe `docker pull` prints a run for
# Every image is built with this variant: CPU code for other machines than the builder
# (upstream: one CPU backend per instruction set, chosen at run time; ik_llama.cpp: an
# x86-64-v3 baseline). An image of a GGML_NATIVE=ON artifact (`--allow-native`) is not
# an image of the default build: it gets no rolling tag.
IMAGE_VARIANT = "portable"
# Default base images per backend (build arguments BASE_IMAGE / BUILD_IMAGE override them).
BASES: dict[str, tuple[str, str]] = {
    # backend: (runtime base, build-stage base)
    "cpu": ("docker.io/library/debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
    "vulkan": ("docker.io/library/debian:trixie-slim", "docker.io/library/debian:trixie-slim"),
    # CUDA: the toolkit comes from PyPI and the artifact bundles its CUDA libraries
    "cuda": ("docker.io/library/debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
}


class ImageSpec(BaseModel):
    """Inputs of one image: the build inputs plus where it is published."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str = "llama.cpp"
    backend: str = "cpu"
    pin: str | None = None
    patches: tuple[str, ...] = ()  # "ID" adds, "-ID" drops, "none" drops the defaults
    variants: tuple[str, ...] = ()  # on top of IMAGE_VARIANT
    defines: tuple[str, ...] = ()
    registry: str = LOCAL_REGISTRY
    base_image: str | None = None
    build_image: str | None = None
    portable: bool = True  # built with IMAGE_VARIANT (False: a native artifact's image)

    @property
    def is_default(self) -> bool:
        """Default pin, patches and image profile: the build a rolling tag may point at."""
        return self.portable and not (self.pin or self.patches or self.variants or self.defines)

    def dockerfile(self, root: Path) -> Path:
        return root / "docker" / f"Dockerfile.{self.backend}"

    def build_args(self) -> dict[str, str]:
        """Build arguments of the build stage (the inputs of `llamaspec build`)."""
        args = {
            "ENGINE": self.engine,
            "BACKEND": self.backend,
            "VARIANTS": ",".join(dict.fromkeys((IMAGE_VARIANT, *self.variants))),
        }
        # empty values are left out, so a Dockerfile's own defaults (e.g. the CUDA
        # architectures in DEFINES) apply
        optional = {
            "PIN": self.pin or "",
            "PATCHES": ",".join(self.patches),
            "DEFINES": " ".join(self.defines),
        }
        args.update({k: v for k, v in optional.items() if v})
        if self.base_image:
            args["BASE_IMAGE"] = self.base_image
        if self.build_image:
            args["BUILD_IMAGE"] = self.build_image
        return args


def artifact_spec(
    manifest: Mapping,
    engines: Mapping[str, Engine],
    series: Sequence[PatchEntry],
    registry: str,
    base_image: str | None = None,
    build_image: str | None = None,
) -> ImageSpec:
    """The spec of an image around a built artifact, its inputs as its manifest records
    them: the rolling tag goes only to a build of the default pin, profile and patches."""
    engine = manifest["engine"]
    commit = manifest.get("commit")
    defaults = {e.id for e in series if e.engine == engine and e.default}
    patches = []
    for p in manifest.get("patches", []):
        if p["status"] == "applied" and p["id"] not in defaults:
            patches.append(p["id"])
        elif p["status"] == "skipped" and p["id"] in defaults:
            patches.append(f"-{p['id']}")
    return ImageSpec(
        engine=engine,
        backend=manifest["backend"],
        pin=commit if engine in engines and commit != engines[engine].pin else None,
        patches=tuple(patches),
        variants=tuple(v for v in manifest.get("variants") or () if v != IMAGE_VARIANT),
        defines=tuple(
            f"{d['name']}={d['value']}"
            for d in manifest.get("defines", [])
            if d.get("origin") == "--define"
        ),
        registry=registry,
        base_image=base_image,
        build_image=build_image,
        portable=IMAGE_VARIANT in (manifest.get("variants") or ()),
    )


def validate(spec: ImageSpec, engines: Mapping[str, Engine]) -> ImageSpec:
    """Known engine and backend (with a did-you-mean), a pin that is a full SHA, a registry
    address of the form image names allow."""
    choose("engine", spec.engine, engines)
    choose("backend", spec.backend, BACKENDS)
    check_registry(spec.registry, "--registry")
    if spec.pin and not re.fullmatch(r"[0-9a-f]{40}", spec.pin):
        raise LlamaspecError(
            f"--pin {spec.pin!r} is not a full 40-character commit SHA; images are labelled "
            f"with the exact engine commit. The default pin of {spec.engine} is "
            f"{engines[spec.engine].pin}."
        )
    return spec


def parse_patches(text: str) -> tuple[list[str], list[str], bool]:
    """`"a,-b,none"` → (include, exclude, no_defaults) for `llamaspec build`."""
    include, exclude, no_defaults = [], [], False
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item == "none":
            no_defaults = True
        elif item.startswith("-"):
            exclude.append(item[1:])
        else:
            include.append(item.removeprefix("+"))
    return include, exclude, no_defaults


def split_list(text: str) -> list[str]:
    return [t for t in re.split(r"[,\s]+", text) if t]


# --- labels ------------------------------------------------------------------------------


def patch_ids(manifest: Mapping) -> str:
    """`id=status` for every catalog patch the build considered, in order."""
    return ",".join(f"{p['id']}={p['status']}" for p in manifest.get("patches", []))


def cuda_archs(manifest: Mapping) -> list[int]:
    """The GPU architectures a CUDA build compiled for (`75;86-real` → [75, 86])."""
    text = manifest.get("cuda_archs") or ""
    return sorted({int(m) for m in re.findall(r"(\d+)(?:-(?:real|virtual))?", text)})


def cuda_version(manifest: Mapping) -> str:
    """The CUDA toolkit version a build used (the manifest's `cuda_toolkit`), or ""."""
    return (manifest.get("cuda_toolkit") or {}).get("version") or ""


def cuda_major(manifest: Mapping) -> int | None:
    """The CUDA toolkit major a build used, if any."""
    version = cuda_version(manifest)
    return int(version.split(".")[0]) if version else None


def tag_backend(backend: str, manifest: Mapping) -> str:
    """The backend as tags spell it: `cuda13` for a CUDA 13 build (a host picks the tag its
    driver runs), else the backend's name."""
    b = backends.backend(backend)
    return b.tag_name(cuda_major(manifest) if b.cuda else None)


def build_labels(manifest: Mapping) -> dict[str, str]:
    """What the build stage knows about the image; written to /opt/llamaspec/labels.txt.
    `cuda` (toolkit version) and `cuda-archs` are empty for other backends."""
    return {
        "engine": manifest["engine"],
        "engine-commit": manifest.get("commit") or "",
        "patches": patch_ids(manifest),
        "backend": manifest["backend"],
        "artifact-id": manifest["artifact_id"],
        "cuda": cuda_version(manifest),
        "cuda-archs": ",".join(map(str, cuda_archs(manifest))),
    }


def labels_txt(manifest: Mapping) -> str:
    """labels.txt: the exact text the runtime stage compares its label arguments with."""
    return "".join(f"{k}={v}\n" for k, v in build_labels(manifest).items())


def label_args(manifest: Mapping, source: str, revision: str) -> dict[str, str]:
    """Build arguments of the runtime stage: its OCI labels, from the built manifest."""
    labels = build_labels(manifest)
    return {
        "SOURCE": source,
        "REVISION": revision,
        "ENGINE": labels["engine"],
        "ENGINE_COMMIT": labels["engine-commit"],
        "PATCH_IDS": labels["patches"],
        "BACKEND": labels["backend"],
        "ARTIFACT_ID": labels["artifact-id"],
        "CUDA_VERSION": labels["cuda"],
        "CUDA_ARCHS": labels["cuda-archs"],
    }


def image_labels(manifest: Mapping, source: str, revision: str) -> dict[str, str]:
    """The labels an image built from `manifest` carries (as `docker inspect` shows them)."""
    out = {
        "org.opencontainers.image.source": source,
        "org.opencontainers.image.revision": revision,
    }
    out.update({LABEL_PREFIX + k: v for k, v in build_labels(manifest).items()})
    return out


def check_labels(
    labels: Mapping[str, str], image: str, engine: str, backend: str, pin: str | None
) -> None:
    """Refuse an image whose labels do not say it is the requested engine/backend/pin."""
    got = {k.removeprefix(LABEL_PREFIX): v for k, v in labels.items() if k.startswith(LABEL_PREFIX)}
    want = {"engine": engine, "backend": backend}
    if pin:
        want["engine-commit"] = pin
    wrong = [
        f"{key} is {got.get(key)!r}, not {value!r}"
        for key, value in want.items()
        if got.get(key) != value
    ]
    if not got.get("artifact-id"):
        wrong.append("it has no io.llamaspec.artifact-id label")
    if wrong:
        raise LlamaspecError(
            f"Refusing {image}: its labels do not match what was asked for ({'; '.join(wrong)}). "
            "A tag can be moved to another image, so llamaspec trusts the labels, not the tag. "
            "Pull the immutable tag of the build you want, or build it yourself with "
            f"`llamaspec docker build --engine {engine} --backend {backend}`."
        )


# --- tags --------------------------------------------------------------------------------


def _short_hash(artifact_id: str) -> str:
    return artifact_id.rsplit("-", 1)[-1]


def immutable_tag(engine: str, backend: str, commit: str, artifact_id: str) -> str:
    """`<engine>-<backend>-<engine short sha>-<artifact id hash>` (backend as `tag_backend`)."""
    return f"{engine}-{backend}-{commit[:7]}-{_short_hash(artifact_id)}"


def rolling_tag(engine: str, backend: str) -> str:
    return f"{engine}-{backend}"


def image_ref(registry: str, tag: str) -> str:
    """`<registry>/llamaspec:<tag>`; registries are lower-case (GHCR owners may not be)."""
    return f"{registry.rstrip('/').lower()}/{REPOSITORY}:{tag}"


def tags(spec: ImageSpec, manifest: Mapping) -> list[str]:
    """Full references: the immutable tag, and the rolling tag for default builds."""
    commit = manifest.get("commit") or "local"
    backend = tag_backend(spec.backend, manifest)
    out = [
        image_ref(
            spec.registry, immutable_tag(spec.engine, backend, commit, manifest["artifact_id"])
        )
    ]
    if spec.is_default:
        out.append(image_ref(spec.registry, rolling_tag(spec.engine, backend)))
    return out


# --- the matrix --------------------------------------------------------------------------


def matrix(engines: Sequence[str], backends: Sequence[str] = BACKENDS) -> list[dict[str, str]]:
    """Engine × backend, as the publishing workflow's matrix `include` list."""
    return [
        {
            "engine": e,
            "backend": b,
            "dockerfile": f"docker/Dockerfile.{b}",
            "smoke": "true" if b in ("cpu", "vulkan") else "false",
        }
        for e in engines
        for b in backends
    ]


def bake(engines: Mapping[str, Engine], registry: str = DEFAULT_REGISTRY) -> str:
    """docker-bake.hcl text for the whole matrix (rolling tags; the workflow adds the
    immutable tag once the manifest of each build is known)."""
    lines = [
        "# Generated by `llamaspec docker bake`; do not edit (tests check it is current).",
        'variable "REGISTRY" {',
        f'  default = "{registry}"',
        "}",
        'variable "REVISION" {',
        '  default = ""',
        "}",
        "",
        'group "default" {',
        "  targets = [" + ", ".join(f'"{_target(e, b)}"' for e in engines for b in BACKENDS) + "]",
        "}",
    ]
    for name in engines:
        for backend in BACKENDS:
            runtime, build = BASES[backend]
            lines += [
                "",
                f'target "{_target(name, backend)}" {{',
                '  context = "."',
                f'  dockerfile = "docker/Dockerfile.{backend}"',
                '  target = "runtime"',
                "  args = {",
                f'    ENGINE = "{name}"',
                f'    BACKEND = "{backend}"',
                f'    BASE_IMAGE = "{runtime}"',
                f'    BUILD_IMAGE = "{build}"',
                f'    VARIANTS = "{IMAGE_VARIANT}"',
                '    TREE = "build"',
                "    REVISION = REVISION",
                "  }",
                f'  tags = ["${{REGISTRY}}/{REPOSITORY}:{rolling_tag(name, backend)}"]',
                "}",
            ]
    return "\n".join(lines) + "\n"


def _target(engine: str, backend: str) -> str:
    return f"{engine.replace('.', '').replace('_', '-')}-{backend}"


def read_manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LlamaspecError(f"Cannot read the image's manifest {path}: {exc}") from None


# An image reference: [host[:port]/]path[:tag][@digest], path components in lower case.
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"(?:(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::(?P<port>\d+))?)/)?"
    rf"{_PATH}(?:/{_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@[a-z0-9]+:[0-9a-f]{{32,}})?"
)


def check_refs(*refs: tuple[str, str | None]) -> None:
    """Image references, (what, ref) with None for one not given, checked before any
    container tool runs (not when parsed: scripts write placeholders such as IMAGE there)."""
    for what, ref in refs:
        if ref is None:
            continue
        m = _IMAGE_REF.fullmatch(ref)
        if m is None or (m["port"] and not 0 < int(m["port"]) < 65536):
            raise LlamaspecError(
                f"{what} {ref!r} is not an image reference; write [HOST[:PORT]/]NAME[:TAG] with "
                "the name in lower case, e.g. localhost/llamaspec:llama.cpp-cpu."
            )
