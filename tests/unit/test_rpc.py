"""RPC hosts: placement in recipes for both dialects, rpc-server argv, HELLO probes against
real sockets (a silent listener; a listener that answers with another protocol version)."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import struct
import sys
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


# Issue 42: bind addresses as the rpc-server reads them (inet_addr), devices, threads.


@pytest.mark.parametrize("host", ["0", "0.0.0.0 ", "0x0", "0.0", "0.0.0", "00", "[::]", "*"])
def test_every_spelling_of_every_interface_is_refused(tmp_path, host: str) -> None:
    with pytest.raises(LlamaspecError, match="--allow-all-interfaces"):
        rpc.serve_argv(_artifact(tmp_path), rpc.ServeOptions(host=host))


def test_cli_rpc_serve_host_0_is_refused(tmp_path, capsys) -> None:
    dist = tmp_path / "dist"
    _artifact(dist / "a")
    (dist / "a" / "manifest.json").write_text('{"variants": ["rpc"]}')
    for host in ("0", "0x0", "0.0.0.0 "):
        argv = ["rpc", "serve", "--dist", str(dist), "--dry-run", "--host", host]
        assert main(argv) == 2
        assert "every network" in capsys.readouterr().err


def test_every_interface_when_allowed_is_spelled_0000(tmp_path) -> None:
    a = _artifact(tmp_path)
    with pytest.raises(LlamaspecError, match="write it as 0.0.0.0"):
        rpc.serve_argv(a, rpc.ServeOptions(host="0x0", allow_all_interfaces=True))
    argv = rpc.serve_argv(a, rpc.ServeOptions(host="0.0.0.0", allow_all_interfaces=True))
    assert argv[1:3] == ["-H", "0.0.0.0"]


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("10.0.0.2 ", "whitespace"),
        ("127.1", "as 127.0.0.1"),
        ("010.0.0.1", "as 8.0.0.1"),
        ("localhost", "IPv4 address only"),
        ("::1", "IPv4 address only"),
    ],
)
def test_a_host_the_rpc_server_reads_otherwise_is_refused(tmp_path, host: str, said: str) -> None:
    with pytest.raises(LlamaspecError, match=said):
        rpc.serve_argv(_artifact(tmp_path), rpc.ServeOptions(host=host))


@pytest.mark.parametrize(("port", "threads"), [(99999, None), (0, None), (7, -5), (7, 0)])
def test_serve_refuses_a_port_or_thread_count_the_server_would_misread(
    tmp_path, port, threads
) -> None:
    with pytest.raises(LlamaspecError, match="--port|--threads"):
        rpc.serve_argv(_artifact(tmp_path), rpc.ServeOptions(port=port, threads=threads))


LISTING = (
    "Available devices:\n  Vulkan0: llvmpipe (LLVM 15.0.7, 256 bits) (2048 MiB, 2048 MiB free)\n"
)


def _listing_artifact(tmp_path: Path) -> Artifact:
    """An artifact whose llama-server is a real program that lists devices as upstream's
    `--list-devices` does, and leaves a mark each time it is asked."""
    a = _artifact(tmp_path)
    server = tmp_path / "bin" / "llama-server"
    server.write_text(
        f"#!/bin/sh\necho asked >> '{tmp_path / 'asked'}'\n"
        f"[ \"$1\" = --list-devices ] && printf '{LISTING}' && exit 0\nexit 1\n"
    )
    server.chmod(0o755)
    return a


def test_an_unknown_device_is_refused_with_the_builds_devices(tmp_path) -> None:
    a = _listing_artifact(tmp_path)
    with pytest.raises(LlamaspecError) as exc:
        rpc.serve_argv(a, rpc.ServeOptions(devices=("NoSuchDevice42",)))
    text = str(exc.value)
    assert "NoSuchDevice42" in text and "CPU, Vulkan0" in text
    argv = rpc.serve_argv(a, rpc.ServeOptions(devices=("vulkan0", "CPU")))
    assert argv[argv.index("-d") + 1] == "vulkan0,CPU"  # the engine matches without case


def test_the_cpu_device_needs_no_listing(tmp_path) -> None:
    a = _listing_artifact(tmp_path)
    rpc.serve_argv(a, rpc.ServeOptions(devices=("CPU",)))
    assert not (tmp_path / "asked").exists()


def test_cli_rpc_serve_unknown_device_exits_before_the_server(tmp_path, capsys) -> None:
    dist = tmp_path / "dist"
    _listing_artifact(dist / "a")
    (dist / "a" / "manifest.json").write_text('{"variants": ["rpc"]}')
    assert main(["rpc", "serve", "--dist", str(dist), "--device", "NoSuchDevice42"]) == 2
    assert "its devices are CPU, Vulkan0" in capsys.readouterr().err


def test_rpc_check_parses_every_host_before_starting_the_artifacts_rpc_server(tmp_path) -> None:
    """Cheap checks first: the rpc-server here would leave a mark if it were started."""
    a = _artifact(tmp_path)
    server = tmp_path / "bin" / "ggml-rpc-server"
    server.write_text(f"#!/bin/sh\ntouch '{tmp_path / 'started'}'\nsleep 5\n")
    server.chmod(0o755)
    for hosts, timeout in ((["127.0.0.1:1", "10.0.0.2:99999"], 2.0), (["127.0.0.1:1"], -1.0)):
        with pytest.raises(LlamaspecError, match="99999|--timeout"):
            rpc.check_hosts(a, hosts, timeout)
    assert not (tmp_path / "started").exists()


# Issue 42: one deadline for the whole exchange; refused, silent and not-rpc told apart.


def _server(handle) -> socket.socket:
    """A real TCP server on loopback that runs `handle(conn)` for its first connection."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = srv.accept()
            with conn:
                handle(conn)

    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_a_host_that_drips_bytes_ends_within_the_deadline() -> None:
    """One byte every 0.2 s of a valid answer (36 bytes, 7 s): the old per-read timeout
    waited it out; one deadline over connect, send and every read ends at 1 s."""
    answer = struct.pack("<Q", 4 + rpc.CAPS) + bytes([3, 0, 0, 0]) + bytes(rpc.CAPS)
    stop = threading.Event()

    def drip(conn: socket.socket) -> None:
        conn.recv(1 + 8 + rpc.CAPS)
        for b in answer:
            if stop.wait(0.2):
                return
            conn.sendall(bytes([b]))

    with _server(drip) as srv:
        t0 = time.monotonic()
        with pytest.raises(LlamaspecError) as exc:
            rpc.probe(f"127.0.0.1:{srv.getsockname()[1]}", 1.0)
        elapsed = time.monotonic() - t0
        stop.set()
    assert elapsed < 1.0 + 0.5, elapsed
    assert "within 1 s" in str(exc.value) and "byte(s)" in str(exc.value)


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 400"),
        (b"\xff" * 16, "\\xff\\xff"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "SSH-2.0"),
    ],
)
def test_a_port_where_another_program_answers_is_not_unreachable(reply: bytes, said: str) -> None:
    def answer(conn: socket.socket) -> None:
        conn.recv(1 + 8 + rpc.CAPS)
        conn.sendall(reply)

    with _server(answer) as srv, pytest.raises(LlamaspecError) as exc:
        rpc.probe(f"127.0.0.1:{srv.getsockname()[1]}", 2)
    text = str(exc.value)
    assert "Something other than an rpc-server listens" in text and said in text
    assert "could not be reached" not in text and "Start an rpc-server there" not in text


def test_a_real_http_server_is_not_called_unreachable() -> None:
    """Python's HTTP server waits for a request line, which HELLO never ends: silence,
    told apart from a host that cannot be reached, with an HTTP server named as a cause."""
    import http.server

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.handle_request, daemon=True).start()
    try:
        with pytest.raises(LlamaspecError) as exc:
            rpc.probe(f"127.0.0.1:{httpd.server_address[1]}", 1)
    finally:
        httpd.server_close()
    text = str(exc.value)
    assert "accepted the connection but did not answer" in text and "HTTP server" in text
    assert "could not be reached" not in text


def test_a_host_that_closes_at_once_is_told_apart() -> None:
    with _server(lambda conn: None) as srv, pytest.raises(LlamaspecError) as exc:
        rpc.probe(f"127.0.0.1:{srv.getsockname()[1]}", 2)
    assert "closed it without answering" in str(exc.value)
    assert "could not be reached" not in str(exc.value)


def test_timeouts_that_are_no_time_limit_are_refused() -> None:
    for bad in (-1, 0, math.nan, math.inf):
        with pytest.raises(LlamaspecError, match="seconds above 0"):
            rpc.probe("127.0.0.1:1", bad)


# Issue 42: `serve` checks the build and the rpc hosts before it downloads anything.

FAKE_RPC_SERVER = """#!{python}
import socket, struct, sys
args = sys.argv[1:]
host, port = args[args.index("-H") + 1], int(args[args.index("-p") + 1])
srv = socket.create_server((host, port))
while True:
    conn, _ = srv.accept()
    with conn:
        conn.recv(33)
        conn.sendall(struct.pack("<Q", 28) + bytes([3, 0, 0, 0]) + bytes(24))
"""


def _serve_setup(tmp_path: Path, monkeypatch, variants: list[str]) -> tuple[Path, int]:
    """dist/a (a build whose rpc-server is a small program speaking HELLO, protocol 3.0.0),
    and a user recipe for the 70B pair with one rpc host on a closed loopback port; the hub
    is offline, so a download attempt would be its own error."""
    dist = tmp_path / "dist"
    (dist / "a" / "bin").mkdir(parents=True)
    manifest = {"engine": "llama.cpp", "backend": "cpu", "variants": variants}
    (dist / "a" / "manifest.json").write_text(json.dumps(manifest))
    fake = dist / "a" / "bin" / "ggml-rpc-server"
    fake.write_text(FAKE_RPC_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    (tmp_path / "cfg" / "recipes").mkdir(parents=True)
    (tmp_path / "cfg" / "recipes" / "far.yaml").write_text(
        "pair: llama-3.3-70b\ndescription: d\nspec: {types: [draft]}\n"
        f"server: {{rpc: ['127.0.0.1:{port}']}}\n"
    )
    monkeypatch.setenv("LLAMASPEC_CONFIG_DIR", str(tmp_path / "cfg"))
    # huggingface_hub reads HF_HUB_OFFLINE once, at import: set the constant too (restored
    # after the test), or a first import here would leave every later test offline
    from huggingface_hub import constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return dist, port


def test_serve_checks_the_rpc_hosts_before_any_download(tmp_path, monkeypatch, capsys) -> None:
    dist, port = _serve_setup(tmp_path, monkeypatch, ["rpc"])
    assert main(["serve", "far", "--dist", str(dist), "--artifact", "a"]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} refused the connection" in err
    assert "HF_HUB_OFFLINE" not in err


def test_serve_refuses_a_build_without_rpc_before_any_download(
    tmp_path, monkeypatch, capsys
) -> None:
    dist, port = _serve_setup(tmp_path, monkeypatch, [])
    assert main(["serve", "far", "--dist", str(dist), "--artifact", "a"]) == 2
    err = capsys.readouterr().err
    assert f"puts layers on rpc hosts (127.0.0.1:{port})" in err
    assert "llamaspec build --variant rpc" in err and "HF_HUB_OFFLINE" not in err
