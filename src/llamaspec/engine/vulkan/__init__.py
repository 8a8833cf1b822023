"""The Vulkan toolchain of a build.

headers (newer Vulkan and SPIR-V headers in a private prefix, for distributions whose own
are too old).

May import: the base modules (llamaspec.errors, llamaspec.paths, llamaspec.procs).
"""
