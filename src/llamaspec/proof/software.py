"""Whether the only devices a build sees are software ones (Mesa's lavapipe, SwiftShader):
there a Vulkan smoke compiles pipelines for minutes, so it asks for less."""

from __future__ import annotations

import re

from llamaspec.engine.artifact import Artifact

# Software Vulkan devices: Mesa's lavapipe (listed as llvmpipe) and Google's SwiftShader.
SOFTWARE_DEVICE = re.compile(r"llvmpipe|lavapipe|swiftshader", re.IGNORECASE)


def software_device(artifact: Artifact) -> str | None:
    """The device name when every device the server sees is a software one, else None."""
    from llamaspec.runtime.client import list_devices

    printed = list_devices(artifact.server, timeout=300)
    return None if printed is None else only_software(printed)


def only_software(listing: str) -> str | None:
    """The first device of a `--list-devices` listing when all of them are software ones."""
    devices = [MEMORY.sub("", m.group(1)).strip() for m in DEVICE_LINE.finditer(listing)]
    if devices and all(SOFTWARE_DEVICE.search(d) for d in devices):
        return devices[0]
    return None


# `--list-devices` prints one `  Vulkan0: <name> (<memory>)` line per device.
DEVICE_LINE = re.compile(r"^\s*\w+\d+:\s*(.+)$", re.MULTILINE)
MEMORY = re.compile(r"\s*\(\d+ MiB[^)]*\)\s*$")
