"""`llamaspec docker …`: build, pull, smoke-test and describe llama-server images."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError
from llamaspec.paths import default_out

if TYPE_CHECKING:
    from rich.console import Console

    from llamaspec.engine.artifact import Artifact


def _spec(read: Any, label: str) -> dict[str, Any]:
    """A default from llamaspec.images.specs, read when the command runs (fast --help)."""

    def load() -> Any:
        from llamaspec.images import specs

        return read(specs)

    return options.deferred(load, label)


# An image reference: [host[:port]/]path[:tag][@digest], path components in lower case.
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"(?:(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::(?P<port>\d+))?)/)?"
    rf"{_PATH}(?:/{_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@[a-z0-9]+:[0-9a-f]{{32,}})?"
)


def _check_refs(*refs: tuple[str, str | None]) -> None:
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("docker", help="llama-server images: build, pull, smoke, matrix")
    dsub = d.add_subparsers(dest="docker_command", required=True)
    b = dsub.add_parser("build", help="build an image (docker buildx, else buildah)")
    options.add(b, "engine", "backend", "pin")
    b.add_argument(
        "--patches", default="", help="patch set: ID adds, -ID drops, none drops the defaults"
    )
    options.add(b, "variants", "defines")
    b.add_argument(
        "--registry", **_spec(lambda s: s.LOCAL_REGISTRY, "registry"), help="registry for the tags"
    )
    b.add_argument("--base-image", help="runtime base image (default per backend)")
    b.add_argument("--build-image", help="build-stage base image (default per backend)")
    b.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    b.add_argument("--push", action="store_true", help="push the tags (docker buildx)")
    b.add_argument("--ccache-dir", type=shared.out_dir, help="host ccache dir to mount (buildah)")
    b.add_argument(
        "--out", type=shared.out_file, help="write the build record (tags, labels) as JSON"
    )
    b.add_argument(
        "--from-artifact",
        metavar="ID",
        help="put this artifact from --dist in the image instead of compiling in the image",
    )
    options.add(b, "dist")
    b.add_argument(
        "--allow-native",
        action="store_true",
        help="with --from-artifact: accept a GGML_NATIVE=ON artifact (runs on this CPU only)",
    )
    b.set_defaults(engine=None, backend=None)
    p = dsub.add_parser("pull", help="pull the image for this host and print how to run it")
    options.add(p, "engine", "backend", "pin")
    p.set_defaults(backend=None)
    p.add_argument(
        "--registry",
        help="registry to pull from (default: LLAMASPEC_REGISTRY, else the user config's "
        "`registry`, else the published registry)",
    )
    p.add_argument("--tag", help="a specific (immutable) tag instead of <engine>-<backend>")
    p.add_argument(
        "--recipe", **_spec(lambda s: s.DEFAULT_RECIPE, "recipe"), help="recipe to print a run for"
    )
    p.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    s = dsub.add_parser("smoke", help="smoke-test an image: speculation on, outputs identical")
    s.add_argument("image", help="image reference, e.g. localhost/llamaspec:llama.cpp-cpu")
    s.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    s.add_argument("--reports", type=shared.out_dir, default=default_out("reports"))
    s.add_argument(
        "--compare-dist",
        type=shared.existing_dir,
        help="a dist/ with the host build of the same artifact id: its files must be identical",
    )
    pu = dsub.add_parser("push", help="push a built image's tags; print the digest to sign")
    pu.add_argument("--record", type=Path, required=True, help="JSON from `docker build --out`")
    pu.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    bs = dsub.add_parser("build-stage", help="(inside the image) build and stage the runtime tree")
    for name in ("engine", "pin", "backend", "patches", "variants", "defines"):
        bs.add_argument(f"--{name}", default="")
    bs.add_argument("--jobs", default="", type=_jobs)
    bs.add_argument("--out", type=shared.out_dir, required=True)
    m = dsub.add_parser("matrix", help="engine × backend matrix as JSON (for the workflow)")
    m.add_argument("--backend", action="append", default=[], type=options.backend_name)
    bk = dsub.add_parser("bake", help="write docker/docker-bake.hcl for the matrix")
    bk.add_argument("--check", action="store_true", help="fail when the file is not current")
    base = dsub.add_parser("base", help="make a Debian base image with debootstrap (no registry)")
    base.add_argument("--suite", default="bookworm", type=_suite)
    base.add_argument("--tag", **_spec(lambda s: s.BASES["cpu"][0], "image"))
    sz = dsub.add_parser("size", help="size report: layers an image adds over its base")
    sz.add_argument("image")
    sz.add_argument("--base", **_spec(lambda s: s.BASES["cpu"][0], "image"))
    sz.add_argument("--reports", type=shared.out_dir, default=default_out("reports"))
    sz.add_argument("--record", type=Path, help="JSON from `docker build --out` (build times)")


def _jobs(text: str) -> str:
    """build-stage --jobs: empty (the default) or a whole number of 1 or more."""
    return str(options.positive_int(text)) if text else text


def _suite(text: str) -> str:
    """docker base --suite: a Debian suite or codename, e.g. bookworm or stable."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Debian suite; give a codename or suite such as bookworm or stable"
        )
    return text


def _record(path: Path) -> dict:
    """The JSON that `docker build --out` wrote."""
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


def _artifact(args: argparse.Namespace, engines: dict) -> Artifact:
    """The artifact `--from-artifact` names, refused where the image cannot carry it."""
    from llamaspec.engine.artifact import load_artifact
    from llamaspec.images.artifact import check_fits

    given = [
        flag
        for flag, value in (
            ("--pin", args.pin),
            ("--patches", args.patches),
            ("--variant", args.variant),
            ("--define", args.define),
            ("--build-image", args.build_image),
            ("--ccache-dir", args.ccache_dir),
        )
        if value
    ]
    if given:
        raise LlamaspecError(
            "--from-artifact takes the build's inputs from the artifact's manifest and compiles "
            f"nothing in the image; drop {', '.join(given)} (or drop --from-artifact to build "
            "in the image)."
        )
    artifact = load_artifact(args.dist, args.from_artifact)
    if args.engine and artifact.manifest.get("engine") != args.engine:
        raise LlamaspecError(
            f"{artifact.id} is a {artifact.manifest.get('engine')} build, not {args.engine}; "
            "drop --engine (the artifact's own engine is used) or name another artifact."
        )
    check_fits(artifact, args.backend, args.allow_native)
    return artifact


def _check_build_inputs(spec: Any, patches: str) -> None:
    """What the build in the image would refuse, refused here before any container tool
    runs: unknown patch ids and variants, malformed defines."""
    from llamaspec import config
    from llamaspec.engine import patch_queue, profiles
    from llamaspec.images import specs as images

    include, exclude, no_defaults = images.parse_patches(patches)
    patch_queue.select(config.load_series(), spec.engine, include, exclude, no_defaults)
    for variant in spec.variants:
        profiles.variant_flags(spec.engine, variant, spec.backend)
    for define in spec.defines:
        profiles.parse_define(define, "--define")


def dispatch(args: argparse.Namespace, console: Console) -> bool:
    if args.command != "docker":
        return False
    # the image modules load on use: `llamaspec --help` stays fast
    from llamaspec import config
    from llamaspec.images import build, registry, tools
    from llamaspec.images import specs as images

    cmd = args.docker_command
    if cmd == "build-stage":
        from llamaspec.images.stage import build_stage

        build_stage(
            args.engine or "llama.cpp",
            args.pin,
            args.backend or "cpu",
            args.patches,
            args.variants,
            args.defines,
            args.jobs,
            args.out,
            console,
        )
    elif cmd == "build":
        engines = config.load_engines()
        artifact = _artifact(args, engines) if args.from_artifact else None
        if artifact is None:
            spec = images.ImageSpec(
                engine=args.engine or "llama.cpp",
                backend=args.backend or "cpu",
                pin=args.pin,
                patches=tuple(images.split_list(args.patches)),
                variants=tuple(args.variant),
                defines=tuple(args.define),
                registry=args.registry,
                base_image=args.base_image,
                build_image=args.build_image,
            )
        else:
            spec = images.artifact_spec(
                artifact.manifest,
                engines,
                config.load_series(),
                args.registry,
                args.base_image,
                args.build_image,
            )
        images.validate(spec, engines)
        _check_refs(("--base-image", args.base_image), ("--build-image", args.build_image))
        if artifact is None:
            _check_build_inputs(spec, args.patches)
        tool = tools.detect(args.tool)
        built = build.build_image(
            tool, spec, console, ccache=args.ccache_dir, push=args.push, artifact=artifact
        )
        if args.out:
            args.out.write_text(json.dumps(built.to_json(), indent=2) + "\n")
    elif cmd == "pull":
        # the request is checked first: a typo is named even where no container tool runs
        engine, backend, cuda = registry.pull_target(
            args.engine, args.backend, args.pin, args.recipe, console
        )
        where, origin = registry.configured_registry(args.registry)
        console.print(f"docker-pull: registry {where} ({origin})")
        registry.pull(
            tools.detect(args.tool),
            engine,
            backend,
            args.pin,
            where,
            args.tag,
            console,
            args.recipe,
            cuda,
        )
    elif cmd == "smoke":
        from llamaspec.images.smoke import smoke_image

        _check_refs(("image", args.image))
        smoke_image(
            tools.detect(args.tool),
            args.image,
            args.reports,
            console,
            compare_dist=args.compare_dist,
        )
    elif cmd == "push":
        record = _record(args.record)
        ref = registry.push(tools.detect(args.tool), record["tags"])
        # `key=value` lines: the publishing workflow appends them to $GITHUB_OUTPUT
        print(f"ref={ref}\ndigest={ref.rsplit('@', 1)[1]}\ntag={record['tags'][0]}")
    elif cmd == "matrix":
        engines = list(config.load_engines())
        print(json.dumps({"include": images.matrix(engines, args.backend or images.BACKENDS)}))
    elif cmd == "bake":
        build.write_bake(config.load_engines(), check=args.check, console=console)
    elif cmd == "base":
        from llamaspec.images.base import make_base_image

        _check_refs(("--tag", args.tag))
        make_base_image(args.suite, args.tag, console)
    elif cmd == "size":
        from llamaspec.images.size import size_report

        _check_refs(("image", args.image), ("--base", args.base))
        record = _record(args.record) if args.record else None
        size_report(args.image, args.base, args.reports, console, record=record)
    return True
