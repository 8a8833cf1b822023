"""One reading of ports, endpoints and bind addresses for every command and the recipe
schema, the engine's own (issue 42: `--host 0` bound every interface, port 99999 wrapped to
34463, an rpc host listed twice made two devices of one server)."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from llamaspec import config, netaddr
from llamaspec.cli.main import main

# Spellings the C library's IPv4 parser (inet_aton, as rpc-server's inet_addr) reads as
# 0.0.0.0, every interface.
EVERYWHERE_V4 = ("0", "0.0.0.0", "0.0.0.0 ", "0.0.0.0\t", "0x0", "0.0", "0.0.0", "00", "0x00000000")
EVERYWHERE = (*EVERYWHERE_V4, "::", "[::]", "0:0::0", "", "*")


@pytest.mark.parametrize("host", EVERYWHERE_V4)
def test_the_c_library_reads_these_as_every_interface(host: str) -> None:
    """What the check relies on: Python's inet_aton is the C library's parser."""
    assert socket.inet_aton(host) == bytes(4)


@pytest.mark.parametrize("host", EVERYWHERE)
def test_every_spelling_of_every_interface_is_one(host: str) -> None:
    assert netaddr.binds_everywhere(host)


@pytest.mark.parametrize("host", ("127.0.0.1", "10.0.0.2", "::1", "localhost", " 0.0.0.0"))
def test_one_interface_is_not_every_interface(host: str) -> None:
    assert not netaddr.binds_everywhere(host)


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("127.1", "as 127.0.0.1"),
        ("0x7f.1", "as 127.0.0.1"),
        ("010.0.0.1", "as 8.0.0.1"),
        ("10.0.0.2 ", "whitespace"),
        ("10.0.0.2\n", "whitespace"),
        ("999.1.1.1", "neither"),
        ("a,b", "neither"),
        ("[::1]", "without brackets"),
        ("", "empty"),
    ],
)
def test_hosts_the_engine_reads_otherwise_are_refused(host: str, said: str) -> None:
    with pytest.raises(netaddr.AddressError, match=said):
        netaddr.check_host(host)


@pytest.mark.parametrize("host", ("127.0.0.1", "10.0.0.2", "::1", "gpu-box.lan", "localhost"))
def test_hosts_read_as_written_pass(host: str) -> None:
    assert netaddr.check_host(host) == host


@pytest.mark.parametrize(
    ("text", "port"), [("1", 1), ("50052", 50052), ("65535", 65535), (8080, 8080)]
)
def test_ports(text, port) -> None:
    assert netaddr.parse_port(text) == port


@pytest.mark.parametrize("text", ("0", "65536", "99999", "-1", "", "8080 ", "+80", "٣", 1.5, True))
def test_not_ports(text) -> None:
    with pytest.raises(netaddr.AddressError, match="not a TCP port"):
        netaddr.parse_port(text)


def test_a_port_that_would_wrap_says_where_it_would_land() -> None:
    with pytest.raises(netaddr.AddressError, match="wrap it to 34463"):
        netaddr.parse_port("99999")


def test_endpoints() -> None:
    assert netaddr.parse_endpoint("10.0.0.2:50052") == ("10.0.0.2", 50052)
    assert netaddr.parse_endpoint("gpu-box:1") == ("gpu-box", 1)
    assert netaddr.parse_endpoint("[fd00::2]:50052") == ("fd00::2", 50052)
    for bad, said in [
        ("10.0.0.2", "not HOST:PORT"),
        ("10.0.0.2:99999", "not a TCP port"),
        ("::1:80", "brackets"),
        ("[::1]80", "not \\[IPv6\\]:PORT"),
        (":80", "empty"),
        ("0x7f.1:80", "as 127.0.0.1"),
    ]:
        with pytest.raises(netaddr.AddressError, match=said):
            netaddr.parse_endpoint(bad)
    with pytest.raises(netaddr.AddressError, match="IPv4 only"):
        netaddr.parse_endpoint("[::1]:80", ipv6=False)


def _recipe(rpc: list[str], placement: dict | None = None) -> config.Recipe:
    server: dict = {"rpc": rpc}
    if placement is not None:
        server["placement"] = placement
    return config.Recipe.model_validate(
        {
            "name": "r",
            "pair": "p",
            "description": "d",
            "spec": {"types": ["draft"]},
            "server": server,
        }
    )


@pytest.mark.parametrize(
    ("rpc", "said"),
    [
        (["10.0.0.2:99999"], "not a TCP port"),
        (["10.0.0.2:0"], "not a TCP port"),
        (["[::1]:50052"], "IPv4 only"),
        (["10.0.0.2"], "not HOST:PORT"),
        (["10.0.0.2:50052", "10.0.0.2:50052"], "listed twice"),
        (["Box:50052", "box:050052"], "listed twice"),
    ],
)
def test_a_recipe_rpc_list_is_read_as_the_engine_reads_it(rpc: list[str], said: str) -> None:
    """Also without a placement: the duplicate check used to run only with one."""
    with pytest.raises(ValidationError, match=said):
        _recipe(rpc)


def test_a_recipe_with_two_hosts_and_a_placement_still_validates() -> None:
    r = _recipe(["a:1", "b:2"], {"target": ["b:2"], "draft": "a:1"})
    assert r.server.rpc == ("a:1", "b:2")


@pytest.mark.parametrize(
    "argv",
    [
        ["rpc", "serve", "--port", "99999"],
        ["rpc", "serve", "--port", "0"],
        ["rpc", "serve", "--threads", "-5"],
        ["rpc", "serve", "--threads", "0"],
        ["rpc", "check", "127.0.0.1:99999"],
        ["rpc", "check", "127.0.0.1"],
        ["rpc", "check", "[::1]:50052"],
        ["rpc", "check", "127.0.0.1:50052", "--timeout", "-1"],
        ["rpc", "check", "127.0.0.1:50052", "--timeout", "nan"],
        ["rpc", "check", "127.0.0.1:50052", "--timeout", "inf"],
        ["rpc", "check", "127.0.0.1:50052", "--timeout", "0"],
        ["serve", "some-recipe", "--port", "99999"],
        ["serve", "some-recipe", "--host", "0.0.0.0 "],
        ["recipe", "show", "some-recipe", "--port", "70000"],
        ["recipe", "show", "some-recipe", "--host", "0x0"],
    ],
)
def test_bad_network_options_are_usage_errors_before_any_work(argv, tmp_path, capsys) -> None:
    """argparse refuses them (exit 2, one line naming the value): no artifact is looked
    up, no rpc-server started, nothing downloaded."""
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--dist", str(tmp_path / "no-dist")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err
    assert not (tmp_path / "no-dist").exists()


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serve_binds_every_interface_only_by_choice(host: str, tmp_path, capsys) -> None:
    """As for the rpc-server (issue 54): `serve --host 0.0.0.0` is refused before any
    artifact is looked up, naming the flag that allows it; with the flag the command goes
    on (here to the missing dist/)."""
    argv = ["serve", "gemma3-270m-ngram-tuned", "--host", host, "--dist", str(tmp_path / "d")]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "every network this machine is on" in err and "--allow-all-interfaces" in err
    assert main([*argv, "--allow-all-interfaces"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "every network" not in err and str(tmp_path / "d") in err


def test_the_printed_address_is_a_url_for_ipv6_too() -> None:
    from llamaspec.runtime import serve

    assert serve.url("::1", 8080) == "http://[::1]:8080"
    assert serve.url("[fe80::1]", 80) == "http://[fe80::1]:80"
    assert serve.listening("127.0.0.1", 8080) == "http://127.0.0.1:8080"
    assert serve.listening("::", 8080).startswith("every interface, port 8080 (http://[::1]:8080")
    assert serve.loopback_url("0", 9) == "http://127.0.0.1:9"
