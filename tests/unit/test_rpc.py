"""RPC hosts: placement in recipes for both dialects, rpc-server argv, HELLO probes against
real sockets (a silent listener; a listener that answers with another protocol version)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from llamaspec import config
from llamaspec.cli.main import main
from llamaspec.engine.artifact import Artifact
from llamaspec.errors import LlamaspecError
from llamaspec.models import dialects, recipes
from llamaspec.runtime import rpc

REMOTE = "10.231.0.1:50052"


def _recipe(**placement) -> config.Recipe:
    return config.Recipe.model_validate(
        {
            "name": "r",
            "pair": "p",
            "description": "d",
            "spec": {"types": ["draft"], "draft_n_max": 4},
            "server": {"gpu_layers": 9, "rpc": [REMOTE], "placement": placement},
        }
    )


def _render(recipe: config.Recipe, engine: str, dialect: str) -> list[str]:
    cmd = recipes.render(
        recipe, engine, dialect, "t.gguf", "d.gguf", backend="cpu", variants=["rpc"]
    )
    return list(cmd.argv)


def test_draft_remote_target_local_both_dialects() -> None:
    r = _recipe(target=["local"], draft=REMOTE)
    up = _render(r, "llama.cpp", "upstream")
    assert up[up.index("--rpc") + 1] == REMOTE
    assert up[up.index("-dev") + 1] == "none"
    assert up[up.index("--spec-draft-device") + 1] == "RPC0"
    ik = _render(r, "ik_llama.cpp", "ik-legacy")
    assert ik[ik.index("-dev") + 1] == "none"
    assert ik[ik.index("-devd") + 1] == f"RPC0[{REMOTE}]"


def test_target_split_and_draft_local() -> None:
    r = _recipe(target=["local", REMOTE], draft="local")
    up = _render(r, "llama.cpp", "upstream")
    assert up[up.index("-dev") + 1] == "RPC0" and up[up.index("-ngl") + 1] == "9"
    assert up[up.index("--spec-draft-device") + 1] == "none"


def test_second_host_is_rpc1_and_device_names_pass_through() -> None:
    r = config.Recipe.model_validate(
        {
            "name": "r",
            "pair": "p",
            "description": "d",
            "spec": {"types": ["draft"]},
            "server": {
                "rpc": ["a:1", "b:2"],
                "placement": {"target": ["CUDA0", "b:2"], "draft": "a:1"},
            },
        }
    )
    argv = _render(r, "llama.cpp", "upstream")
    assert argv[argv.index("-dev") + 1] == "CUDA0,RPC1"
    assert argv[argv.index("--spec-draft-device") + 1] == "RPC0"


def test_ik_spec_type_dialect_cannot_place_the_draft_and_says_so() -> None:
    cmd = recipes.render(
        _recipe(draft=REMOTE), "ik_llama.cpp", "ik-spec-type", "t", "d", variants=["rpc"]
    )
    assert "-devd" not in cmd.argv and any("draft_device" in n for n in cmd.notes)


@pytest.mark.parametrize(
    ("placement", "said"),
    [
        ({"draft": "10.9.9.9:1"}, "not in `rpc`"),
        ({"target": ["no such!"]}, "neither"),
    ],
)
def test_placement_must_name_known_hosts(placement, said) -> None:
    with pytest.raises(ValidationError, match=said):
        _recipe(**placement)


def test_placement_draft_and_draft_device_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="keep one"):
        config.Recipe.model_validate(
            {
                "name": "r",
                "pair": "p",
                "description": "d",
                "spec": {"types": ["draft"], "draft_device": "RPC0"},
                "server": {"rpc": [REMOTE], "placement": {"draft": REMOTE}},
            }
        )


def test_the_shipped_rpc_recipe_renders_for_both_engines() -> None:
    recipe, _ = recipes.find("llama-3.3-70b-rpc-draft", Path(__file__).parents[2])
    up = recipes.render(recipe, "llama.cpp", "upstream", "t", "d", backend="cuda")
    assert "--spec-draft-device" in up.argv and "RPC0" in up.argv
    ik = recipes.render(recipe, "ik_llama.cpp", "ik-legacy", "t", "d", backend="cuda")
    assert "RPC0[192.168.1.20:50052]" in ik.argv


def _artifact(tmp_path: Path) -> Artifact:
    (tmp_path / "bin").mkdir(parents=True)
    (tmp_path / "bin" / "ggml-rpc-server").write_text("")
    return Artifact("a", tmp_path, {"variants": ["rpc"]}, False)


def test_serve_binds_loopback_by_default_and_refuses_all_interfaces(tmp_path) -> None:
    a = _artifact(tmp_path)
    argv = rpc.serve_argv(a, rpc.ServeOptions())
    assert argv[1:] == ["-H", "127.0.0.1", "-p", "50052"]
    for host in ("0.0.0.0", "::", ""):
        with pytest.raises(LlamaspecError, match="--allow-all-interfaces"):
            rpc.serve_argv(a, rpc.ServeOptions(host=host))
    opts = rpc.ServeOptions("0.0.0.0", 7, ("CPU",), 2, True, True)
    assert rpc.serve_argv(a, opts)[1:] == ["-H", "0.0.0.0", "-p", "7", "-d", "CPU", "-t", "2", "-c"]


def test_artifact_without_rpc_server_is_explained(tmp_path) -> None:
    with pytest.raises(LlamaspecError, match="--variant rpc"):
        rpc.rpc_server_binary(Artifact("x", tmp_path, {"variants": []}, False))


def test_cli_rpc_serve_dry_run_warns_on_stderr(tmp_path, capsys) -> None:
    dist = tmp_path / "dist"
    _artifact(dist / "a")
    (dist / "a" / "manifest.json").write_text('{"variants": ["rpc"]}')
    assert main(["rpc", "serve", "--dist", str(dist), "--dry-run", "--host", "10.1.2.3"]) == 0
    out = capsys.readouterr()
    assert "no authentication and no encryption" in out.err
    assert "-H 10.1.2.3" in out.out
    assert main(["rpc", "serve", "--dist", str(dist), "--dry-run", "--host", "0.0.0.0"]) == 2


def _listener(answer: bytes | None):
    """A real TCP listener on loopback: it reads the HELLO and sends `answer` (None: silence)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 + 8 + rpc.CAPS)
            if answer is not None:
                conn.sendall(answer)
            stop.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    return srv, stop


def test_probe_reads_the_version() -> None:
    srv, stop = _listener(struct.pack("<Q", 4 + rpc.CAPS) + bytes([7, 0, 0, 0]) + bytes(rpc.CAPS))
    with srv:
        assert rpc.probe(f"127.0.0.1:{srv.getsockname()[1]}", 2) == (7, 0, 0)
        stop.set()


def test_silent_host_is_one_paragraph_within_the_bound() -> None:
    srv, stop = _listener(None)
    with srv:
        endpoint = f"127.0.0.1:{srv.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(LlamaspecError) as exc:
            rpc.probe(endpoint, 0.5)
        assert time.monotonic() - t0 < 3
        stop.set()
    text = str(exc.value)
    assert endpoint in text and "within 0.5 s" in text and "\n" not in text


def test_closed_port_names_the_host() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    with pytest.raises(LlamaspecError, match=f"127.0.0.1:{port} refused"):
        rpc.probe(f"127.0.0.1:{port}", 1)


def test_version_rule_is_the_engines() -> None:
    assert rpc.compatible((7, 1, 0), (7, 0, 3))
    assert not rpc.compatible((7, 0, 0), (7, 1, 0))
    assert not rpc.compatible((7, 0, 0), (6, 0, 0))


def test_version_mismatch_is_refused_with_both_versions(tmp_path) -> None:
    """A listener speaking protocol 6.2.1 (an older build); the artifact's own version, which
    the integration test reads from a real rpc-server, is given here."""
    srv, stop = _listener(struct.pack("<Q", 4 + rpc.CAPS) + bytes([6, 2, 1, 0]) + bytes(rpc.CAPS))
    with srv:
        with pytest.raises(LlamaspecError) as exc:
            endpoint = f"127.0.0.1:{srv.getsockname()[1]}"
            rpc.check_hosts(_artifact(tmp_path), [endpoint], 2, mine=(7, 0, 0))
        stop.set()
    assert "6.2.1" in str(exc.value) and "7.0.0" in str(exc.value)


def test_dialects_name_rpc_devices() -> None:
    up, ik = dialects.DIALECTS["upstream"], dialects.DIALECTS["ik-legacy"]
    assert dialects.rpc_device_name(up, ["a:1", "b:2"], "b:2") == "RPC1"
    assert dialects.rpc_device_name(ik, ["a:1"], "a:1") == "RPC0[a:1]"
    assert dialects.rpc_device_name(up, ["a:1"], "local") is None
