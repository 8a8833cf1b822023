"""The CUDA toolchain of a build: its toolkit, the host's GPUs and driver, its ELF files.

toolkit (the Toolkit record and what a root must hold), choice (`--cuda-toolkit` resolved
to a Toolkit), assemble (a toolkit root from the pinned PyPI wheels), host (this machine's
GPUs and driver; the one nvidia-smi helper), elf (the libraries a binary needs, bundled and
checked), check (the CUDA compile check: a few kernels compiled without a GPU).

May import: the base modules and llamaspec.engine's own modules (profiles, backends; check
also pipeline and build).
"""
