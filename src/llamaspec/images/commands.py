"""The text that runs an image: a `docker run` line, its llama-swap form and a compose file,
for a llama-server argv rendered from a recipe, with the model files mounted read-only and
the port published on loopback only. Builders only: which image and which files are the
callers' (images/run_line.py, images/registry.py)."""

from __future__ import annotations

import copy
import shlex
from collections.abc import Sequence

from llamaspec.engine import backends


def docker_run(
    ref: str,
    backend: str,
    argv: Sequence[str],
    mounts: Sequence[tuple[str, str]],
    port: int = 8080,
) -> str:
    """`docker run` for an image with a rendered llama-server argv (its --host/--port are
    the entrypoint's), each mount read-only, the port published on 127.0.0.1 only: the
    server has no authentication unless given --api-key. Host paths are given quoted. A
    foreground run removed when it ends (`--rm`, which docker refuses beside a restart
    policy): a comment names the compose form, which docker restarts."""
    args = server_args(argv)
    device, volumes = _run_flags(backend, mounts)
    return (
        "# the server has no authentication, so it is published on 127.0.0.1 only; to serve\n"
        f"# other machines on purpose, use `-p {port}:8080` and add `--api-key YOUR-SECRET`\n"
        "# (clients then send `Authorization: Bearer YOUR-SECRET`). For a server that docker\n"
        "# restarts when it dies: `llamaspec recipe show RECIPE --format compose`\n"
        f"docker run --rm {device}-p 127.0.0.1:{port}:8080 {volumes} {ref} \\\n"
        f"    {shlex.join(args)}"
    )


def docker_run_swap(
    ref: str, backend: str, argv: Sequence[str], mounts: Sequence[tuple[str, str]]
) -> str:
    """`docker_run` for llama-swap: one line, the container named ${MODEL_ID} (so cmdStop
    can stop it) and published on 127.0.0.1:${PORT}, the port llama-swap picks."""
    device, volumes = _run_flags(backend, mounts)
    return (
        f"docker run --rm --name ${{MODEL_ID}} {device}-p 127.0.0.1:${{PORT}}:8080 {volumes} "
        f"{ref} {shlex.join(server_args(argv))}"
    )


def server_args(argv: Sequence[str]) -> list[str]:
    """A rendered llama-server argv without the program and --host/--port (the entrypoint's)."""
    args = list(argv[1:])
    for flag in ("--host", "--port"):
        if flag in args:
            i = args.index(flag)
            del args[i : i + 2]
    return args


def compose(
    name: str,
    ref: str,
    backend: str,
    argv: Sequence[str],
    mounts: Sequence[tuple[str, str]],
    port: int = 8080,
) -> str:
    """The `docker run` of `docker_run` as a compose file (`docker compose up`), restarted
    by docker when it dies (`restart: unless-stopped`; the image's HEALTHCHECK applies)."""
    import yaml

    service: dict = {
        "image": ref,
        "command": server_args(argv),
        "restart": "unless-stopped",
        "ports": [f"127.0.0.1:{port}:8080"],
        "volumes": [
            {"type": "bind", "source": host, "target": inside, "read_only": True}
            for host, inside in mounts
        ],
    }
    service.update(copy.deepcopy(dict(backends.backend(backend).compose_service)))
    head = (
        f"# llamaspec recipe {name}: `docker compose up`. The port is published on 127.0.0.1\n"
        "# only: llama-server has no authentication unless given --api-key.\n"
    )
    return head + yaml.safe_dump({"services": {"llama-server": service}}, sort_keys=False)


def _run_flags(backend: str, mounts: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """`docker run`'s device option for the backend (with its trailing space) and volumes."""
    device = backends.backend(backend).run_device
    return device + " " if device else "", " ".join(_volume(h, i) for h, i in mounts)


def _volume(host: str, inside: str) -> str:
    """`-v HOST:INSIDE:ro`; a host path already in double quotes (`"$PWD/models"`) keeps
    them so the shell expands it, any other is quoted as a whole."""
    if host.startswith('"') and host.endswith('"'):
        return f'-v "{host[1:-1]}:{inside}:ro"'
    return f"-v {shlex.quote(f'{host}:{inside}:ro')}"
