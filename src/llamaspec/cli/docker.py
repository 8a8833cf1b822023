"""`llamaspec docker …`: build, pull, smoke-test and describe llama-server images."""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

from llamaspec.cli import options, shared
from llamaspec.errors import LlamaspecError

if TYPE_CHECKING:
    from rich.console import Console


def _spec(read: Any, label: str) -> dict[str, Any]:
    """A default from llamaspec.images.specs, read when the command runs (fast --help)."""

    def load() -> Any:
        from llamaspec.images import specs

        return read(specs)

    return options.deferred(load, label)


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
    b.set_defaults(engine=None, backend=None, handler=cmd_docker_build)
    p = dsub.add_parser("pull", help="pull the image for this host and print how to run it")
    options.add(
        p,
        "engine",
        "backend",
        "pin",
        helps={"backend": "cpu, cuda or vulkan (default: this host's)"},
    )
    p.set_defaults(backend=None, handler=cmd_docker_pull)
    p.add_argument(
        "--registry",
        help="registry to pull from (default: LLAMASPEC_REGISTRY, else the user config's "
        "`registry`, else the published registry)",
    )
    p.add_argument(
        "--tag", type=_tag, help="a specific (immutable) tag instead of <engine>-<backend>"
    )
    p.add_argument(
        "--recipe", **_spec(lambda s: s.DEFAULT_RECIPE, "recipe"), help="recipe to print a run for"
    )
    p.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    p.add_argument(
        "--require-signature",
        action="store_true",
        help="refuse an image whose signature cannot be verified (cosign missing too); "
        "default: the user config's `require_signature`, else off",
    )
    s = dsub.add_parser("smoke", help="smoke-test an image: speculation on, outputs identical")
    s.add_argument("image", help="image reference, e.g. localhost/llamaspec:llama.cpp-cpu")
    s.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    shared.add_reports(s)
    s.add_argument(
        "--compare-dist",
        type=shared.existing_dir,
        help="a dist/ with the host build of the same artifact id: its files must be identical",
    )
    s.set_defaults(handler=cmd_docker_smoke)
    pu = dsub.add_parser("push", help="push a built image's tags; print the digest to sign")
    pu.add_argument(
        "--record", type=shared.some_file, required=True, help="JSON from `docker build --out`"
    )
    pu.add_argument("--tool", choices=["auto", "docker", "buildah"], default="auto")
    pu.set_defaults(handler=cmd_docker_push)
    bs = dsub.add_parser("build-stage", help="(inside the image) build and stage the runtime tree")
    for name in ("engine", "pin", "backend", "patches", "variants", "defines"):
        bs.add_argument(f"--{name}", default="")
    bs.add_argument("--jobs", default="", type=_jobs)
    bs.add_argument("--out", type=shared.out_dir, required=True)
    bs.set_defaults(handler=cmd_docker_build_stage)
    m = dsub.add_parser("matrix", help="engine × backend matrix as JSON (for the workflow)")
    m.add_argument("--backend", action="append", default=[], type=options.backend_name)
    m.set_defaults(handler=cmd_docker_matrix)
    bk = dsub.add_parser("bake", help="write docker/docker-bake.hcl for the matrix")
    bk.add_argument("--check", action="store_true", help="fail when the file is not current")
    bk.set_defaults(handler=cmd_docker_bake)
    base = dsub.add_parser("base", help="make a Debian base image with debootstrap (no registry)")
    base.add_argument("--suite", default="bookworm", type=_suite)
    base.add_argument("--tag", **_spec(lambda s: s.BASES["cpu"][0], "image"))
    base.set_defaults(handler=cmd_docker_base)
    sz = dsub.add_parser("size", help="size report: layers an image adds over its base")
    sz.add_argument("image")
    sz.add_argument("--base", **_spec(lambda s: s.BASES["cpu"][0], "image"))
    shared.add_reports(sz)
    sz.add_argument(
        "--record", type=shared.some_file, help="JSON from `docker build --out` (build times)"
    )
    sz.set_defaults(handler=cmd_docker_size)


def _check_from_artifact(args: argparse.Namespace) -> None:
    """`--from-artifact` takes the build's inputs from the artifact: refuse options that
    would set them (the image build checks the artifact itself)."""
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


# One handler per `docker` subcommand; the image modules load on use (fast --help).


def _tag(text: str) -> str:
    """docker pull --tag: an image tag as registries spell it (no path, no spaces)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an image tag; a tag is 1-128 letters, digits, '_', '.' or '-', "
            "not starting with '.' or '-' (e.g. llama.cpp-cpu)"
        )
    return text


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


def cmd_docker_build_stage(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images import stage

    stage.build_stage(
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


def cmd_docker_build(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images import build as image_build

    if args.from_artifact:
        _check_from_artifact(args)
    request = image_build.ImageRequest(
        engine=args.engine,
        backend=args.backend,
        pin=args.pin,
        patches=args.patches,
        variants=tuple(args.variant),
        defines=tuple(args.define),
        registry=args.registry,
        base_image=args.base_image,
        build_image=args.build_image,
        from_artifact=args.from_artifact,
        dist=args.dist,
        allow_native=args.allow_native,
        tool=args.tool,
        ccache=args.ccache_dir,
        push=args.push,
    )
    built = image_build.build_requested(request, console)
    if args.out:
        args.out.write_text(json.dumps(built.to_json(), indent=2) + "\n")


def cmd_docker_pull(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images import registry, tools

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
        require_signature=args.require_signature or registry.signature_required(),
    )


def cmd_docker_smoke(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images.smoke import smoke_image

    smoke_image(
        args.tool,
        args.image,
        args.reports,
        console,
        compare_dist=args.compare_dist,
    )


def cmd_docker_push(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images.build import push_record

    ref, tag = push_record(args.record, args.tool)
    # `key=value` lines: the publishing workflow appends them to $GITHUB_OUTPUT
    print(f"ref={ref}\ndigest={ref.rsplit('@', 1)[1]}\ntag={tag}")


def cmd_docker_matrix(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.images import specs as images

    engines = list(config.load_engines())
    print(json.dumps({"include": images.matrix(engines, args.backend or images.BACKENDS)}))


def cmd_docker_bake(args: argparse.Namespace, console: Console) -> None:
    from llamaspec import config
    from llamaspec.images import build as image_build

    image_build.write_bake(config.load_engines(), check=args.check, console=console)


def cmd_docker_base(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images.base import make_base_image

    make_base_image(args.suite, args.tag, console)


def cmd_docker_size(args: argparse.Namespace, console: Console) -> None:
    from llamaspec.images.build import load_record
    from llamaspec.images.size import size_report

    record = load_record(args.record) if args.record else None
    size_report(args.image, args.base, args.reports, console, record=record)
