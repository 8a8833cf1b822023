"""Engine stage: BuildSpec → fetch → patch → configure → build → Artifact in dist/<id>/.

Owns engine sources (git, PyPI sdist, local), the patch catalog's diffs and queue, CMake
flag profiles and backends, toolchain preflight, the build and install into dist/, and the
pipeline that runs them in order. The toolchains of one backend are grouped: cuda/ (the
CUDA toolkit, the host's GPUs and driver, ELF checks, the compile check) and vulkan/
(private Vulkan headers).

May import: llamaspec.errors, llamaspec.paths, llamaspec.config, llamaspec.lock, llamaspec.procs.
"""
