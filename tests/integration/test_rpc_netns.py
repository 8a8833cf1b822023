"""Two hosts on one machine: llama-server in one network namespace, the suite's Vulkan + rpc
build's rpc-server (CPU device) in another, joined by a veth pair with addresses of their own
(10.231.0.1/30 and .2). Each placement a recipe can name runs on the F32 reference with the
determinism flags and must be token-identical to the plain local server (the strict tier's
rule). Reuses the `vulkan_build` session build: no build of its own."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from llamaspec import config
from llamaspec.errors import LlamaspecError
from llamaspec.models import recipes
from llamaspec.models.embedded import EMBEDDED_SHA256
from llamaspec.models.methods import determinism_args
from llamaspec.models.server_help import server_help
from llamaspec.perf import netlab, rpcstudy
from llamaspec.proof import verify
from llamaspec.proof.prompts import CODE
from llamaspec.proof.reference import reference_copy
from llamaspec.runtime import rpc
from llamaspec.runtime.client import base_args, complete, running

pytestmark = pytest.mark.integration

PORT = rpcstudy.PORT  # where rpc_host binds the rpc-server
GEMMA_LAYERS = 18  # Gemma 3 270M's blocks: 9 on each host when split
PROMPT = replace(CODE, n_predict=16)  # 32 passed too; 16 keeps CI under 3 min


def _recipe(endpoint: str, gpu_layers: int, target: list[str], draft: str) -> config.Recipe:
    return config.Recipe.model_validate(
        {
            "name": "netns",
            "pair": "embedded",
            "description": "placement under test",
            "spec": {
                "types": ["draft"],
                "draft_n_max": 4,
                "draft_p_min": 0.0,
                "draft_gpu_layers": 99,
            },
            "server": {
                "gpu_layers": gpu_layers,
                "rpc": [endpoint],
                "placement": {"target": target, "draft": draft},
            },
        }
    )


def _server_args(argv: tuple[str, ...]) -> list[str]:
    """A rendered command without its binary, host and port (`running` chooses those)."""
    out, skip = [], 0
    for a in argv[1:]:
        if skip:
            skip -= 1
        elif a in ("--host", "--port"):
            skip = 1
        else:
            out.append(a)
    return out


def _rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) // 1024  # type: ignore[union-attr]


def test_placements_across_two_namespaces_match_the_f32_reference(
    vulkan_build, gemma_path, tmp_path
) -> None:
    # CI runs as root with iproute2 (.ci/run installs it): a machine that cannot make
    # namespaces fails here rather than skipping the test
    assert netlab.available() is None, netlab.available()
    artifact = vulkan_build[0]
    reference = reference_copy(gemma_path, EMBEDDED_SHA256).path
    help_text = server_help(artifact.server)
    plain = [*base_args(reference), *determinism_args(help_text)]
    log = tmp_path / "rpc-server.log"
    with (
        netlab.two_hosts() as hosts,
        rpcstudy.rpc_host(hosts, artifact, log) as host,
        hosts.inside(),
    ):
        endpoint, version, server = host.endpoint, host.version, host.process
        assert version[0] == 7, version
        # bound to its veth address only: nothing answers on the server host's loopback
        listening = subprocess.run(
            [*hosts.exec_prefix(hosts.server), "ss", "-Hltn"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"{hosts.server_addr}:{PORT}" in listening, listening
        assert f"0.0.0.0:{PORT}" not in listening and f"127.0.0.1:{PORT}" not in listening
        # a port nothing listens on: one paragraph naming the host
        with pytest.raises(LlamaspecError, match=f"{hosts.server_addr}:{PORT + 1} refused"):
            rpc.check_hosts(artifact, [f"{hosts.server_addr}:{PORT + 1}"], 2, version)

        with running(artifact.server, [*plain, "-dev", "none"], tmp_path / "ref.log") as ref:
            expected = complete(ref, PROMPT)
            results = {}
            for name, layers, target, draft in (
                (
                    "target split, draft local",
                    GEMMA_LAYERS // 2,
                    ["local", endpoint],
                    "local",
                ),
                ("target local, draft remote", 0, ["local"], endpoint),
                ("target remote, draft local", 99, [endpoint], "local"),
            ):
                cmd = recipes.render(
                    _recipe(endpoint, layers, target, draft),
                    "llama.cpp",
                    "upstream",
                    reference,
                    reference,
                    server=str(artifact.server),
                    backend=artifact.manifest["backend"],
                    variants=["rpc"],
                )
                args = [*_server_args(cmd.argv), *plain[2:]]
                slug = name.replace(", ", "-").replace(" ", "-")
                with running(artifact.server, args, tmp_path / f"{slug}.log") as srv:
                    got = complete(srv, PROMPT)
                    held = _rss_mib(server.pid)
                case = verify.compare(PROMPT, "sequential", expected, got, ref, None)
                results[name] = (case.kind, got.draft_n, got.draft_accepted, held, args)
    for name, (kind, drafted, accepted, held, args) in results.items():
        assert kind == "identical", (name, kind, args)
        assert drafted and accepted, (name, drafted, accepted)
        assert held > 100, f"{name}: rpc-server held {held} MiB: nothing was placed on it"
