"""Engine stage: BuildSpec → fetch → patch → configure → build → Artifact in dist/<id>/.

Owns engine sources (git, PyPI sdist, local), the patch catalog's diffs and queue, CMake
flag profiles and backends, toolchain preflight (and private Vulkan headers), the build
and install into dist/, and the pipeline that runs them in order.

May import: llamaspec.errors, llamaspec.paths, llamaspec.config, llamaspec.lock, llamaspec.procs.
"""
