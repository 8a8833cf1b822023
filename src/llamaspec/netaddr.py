"""Ports, `HOST:PORT` endpoints and bind addresses, read the way the engine reads them.

One reading for every command and schema. The engine takes a port with `std::stoi` and
`htons` (99999 would become port 34463), so a port here is 1-65535, ASCII digits only.
Its hosts go through the C library: rpc-server binds with `inet_addr`, its client
resolves with `gethostbyname`, llama-server binds with `getaddrinfo`; all of them read a
numeric IPv4 host with the same parser as `socket.inet_aton`, which takes `0`, `0x0`,
`0.0` and `00` for 0.0.0.0, `010.0.0.1` for 8.0.0.1, and stops reading at whitespace. So
`binds_everywhere` asks that parser, and `check_host` refuses a spelling the engine would
read differently from what the user wrote. `Port`, `Endpoint` and `RpcEndpoint` are the
same checks as pydantic field types (pydantic is imported only when a schema is built).

Base module: imports only llamaspec.errors.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from typing import Annotated, Any

from llamaspec.errors import LlamaspecError

MAX_PORT = 65535
# What a host name may hold (RFC 1123 labels; `_` as resolvers accept it).
HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_-]+)*\.?$")
RPC_ENDPOINT_PATTERN = r"^[A-Za-z0-9_.-]+:[0-9]{1,5}$"  # for editors: the JSON Schema's view


class AddressError(LlamaspecError, ValueError):
    """A port, endpoint or host that does not parse, or would be read differently by the
    engine. A LlamaspecError for the user; a ValueError, so pydantic reports it as a field
    error."""


def parse_port(value: str | int, what: str = "port") -> int:
    """A TCP port, 1-65535, from ASCII digits (or an int); `what` names it in the error."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
        number = int(value)
    else:
        raise AddressError(
            f"{what} {value!r} is not a TCP port: write a whole number from 1 to {MAX_PORT}."
        )
    if not 1 <= number <= MAX_PORT:
        wraps = f"; the engine would wrap it to {number % 65536}" if number > MAX_PORT else ""
        raise AddressError(f"{what} {value} is not a TCP port (1-{MAX_PORT}{wraps}).")
    return number


def c_ipv4(host: str) -> str | None:
    """The IPv4 address the C library's parser (inet_aton, inet_addr, getaddrinfo's numeric
    path) reads from `host`, dotted; None when it reads none."""
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return None


def _ipv6(host: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None


def binds_everywhere(host: str) -> bool:
    """Whether binding `host` listens on every interface, as the engine reads it: empty or
    `*`, any spelling the C parser reads as 0.0.0.0 (`0`, `0x0`, `0.0`, `0.0.0.0 `), or
    the IPv6 unspecified address (`::`, `[::]`, `0:0::0`)."""
    if host in ("", "*") or c_ipv4(host) == "0.0.0.0":
        return True
    v6 = _ipv6(host)
    return v6 is not None and v6.is_unspecified


def check_host(host: str, what: str = "host") -> str:
    """`host` as given, when the engine reads it as written: an IPv4 address in dotted
    decimal, an IPv6 address, or a host name. Whitespace, a numeric form the C parser reads
    as another address (`127.1`, `0x7f.1`, `010.0.0.1` = 8.0.0.1) and characters no host
    name has are refused, with what to write instead."""
    if not host:
        raise AddressError(f"{what} is empty: name an address or a host name.")
    if any(c.isspace() or not c.isprintable() for c in host):
        read = c_ipv4(host)
        also = f" (it would read {host!r} as {read})" if read else ""
        raise AddressError(
            f"{what} {host!r} contains whitespace or a control character; the engine stops "
            f"reading an address there{also}. Write the address alone, e.g. "
            f"{read or host.strip() or '127.0.0.1'}."
        )
    read = c_ipv4(host)
    if read is not None:
        if read != host:
            raise AddressError(
                f"{what} {host!r} is read by the engine's C library as {read} (it takes "
                "short, octal and hex forms of IPv4 addresses). Write the address in dotted "
                f"decimal, four parts without leading zeros: {read} if that is the one meant."
            )
        return host
    if _ipv6(host) is not None:
        if host.startswith("["):
            raise AddressError(f"{what} {host!r}: write the IPv6 address without brackets.")
        return host
    if re.fullmatch(r"[0-9.]+|0[xX][0-9a-fA-F.]*", host) or not HOST_NAME.match(host):
        raise AddressError(
            f"{what} {host!r} is neither an IPv4 address (four parts of 0-255, e.g. "
            "10.0.0.2), an IPv6 address nor a host name."
        )
    return host


def parse_endpoint(text: str, what: str = "endpoint", ipv6: bool = True) -> tuple[str, int]:
    """`HOST:PORT` (or `[IPv6]:PORT`) → (host, port), each checked as above. `ipv6=False`
    refuses IPv6: llama.cpp's RPC client splits at the first colon and resolves with
    gethostbyname, which knows IPv4 only."""
    if not isinstance(text, str) or ":" not in text:
        raise AddressError(f"{what} {text!r} is not HOST:PORT (e.g. 10.0.0.2:50052).")
    if text.startswith("["):
        inside, close, rest = text[1:].partition("]")
        if not close or not rest.startswith(":") or _ipv6(inside) is None:
            raise AddressError(
                f"{what} {text!r} is not [IPv6]:PORT (e.g. [fd00::2]:50052) nor HOST:PORT."
            )
        host, port = inside, rest[1:]
    else:
        host, _, port = text.rpartition(":")
        if ":" in host:
            raise AddressError(
                f"{what} {text!r}: an IPv6 address goes in brackets, [ADDRESS]:PORT."
            )
    if ipv6 is False and (text.startswith("[") or _ipv6(host) is not None):
        raise AddressError(
            f"{what} {text!r} is IPv6, and llama.cpp's RPC client connects over IPv4 only (it "
            "splits HOST:PORT at the first colon and resolves with gethostbyname). Use an "
            "IPv4 address or a host name, or an SSH tunnel's 127.0.0.1 end."
        )
    return check_host(host, f"{what} {text!r}: host"), parse_port(port, f"{what} {text!r}: port")


def check_endpoint(text: str) -> str:
    """`text` unchanged when it is a HOST:PORT endpoint (IPv6 in brackets allowed)."""
    parse_endpoint(text)
    return text


def check_rpc_endpoint(text: str) -> str:
    """`text` unchanged when llama.cpp's RPC client can connect to it (IPv4 or a name)."""
    parse_endpoint(text, "rpc host", ipv6=False)
    return text


def endpoint_key(text: str) -> tuple[str, int]:
    """What makes two endpoints the same host: the host without case, the port as a number."""
    host, port = parse_endpoint(text)
    return host.lower(), port


class _Checked:
    """pydantic metadata: run `check` before (`mode="before"`) or after the base type's own
    validation, and add `json` to the field's JSON Schema. pydantic's BeforeValidator and
    AfterValidator, without importing pydantic when this module loads."""

    def __init__(self, check: Callable[[Any], Any], mode: str, json: dict) -> None:
        self.check, self.mode, self.json = check, mode, json

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        inner = handler(source)
        if self.mode == "before":
            return core_schema.no_info_before_validator_function(self.check, inner)
        return core_schema.no_info_after_validator_function(self.check, inner)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Any:
        return {**handler(schema), **self.json}


Port = Annotated[int, _Checked(parse_port, "before", {"minimum": 1, "maximum": MAX_PORT})]
Endpoint = Annotated[str, _Checked(check_endpoint, "after", {})]
RpcEndpoint = Annotated[
    str, _Checked(check_rpc_endpoint, "after", {"pattern": RPC_ENDPOINT_PATTERN})
]
