"""Toolchain preflight: everything a backend's build needs, checked before CMake runs.

`llamaspec doctor` prints these checks; every build runs them and stops before configuring
when a required piece is missing, with the command that installs it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec import procs
from llamaspec.engine import backends
from llamaspec.engine.cuda import host as gpuhost
from llamaspec.engine.cuda import toolkit as cudatk
from llamaspec.engine.profiles import Define
from llamaspec.engine.toolchain import Toolchain
from llamaspec.engine.vulkan import headers as vkheaders
from llamaspec.errors import LlamaspecError


@dataclass(frozen=True)
class Check:
    """One finding: what was looked for, what was found, and how to fix it when missing."""

    name: str
    ok: bool
    found: str
    fix: str = ""
    required: bool = True


@dataclass(frozen=True)
class Preflight:
    backend: str
    checks: tuple[Check, ...]
    defines: tuple[Define, ...] = ()  # what the build must add (e.g. private header dirs)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.required and not c.ok]

    def require(self) -> None:
        """Raise with every missing piece and its fix; nothing is configured."""
        if not self.failures:
            return
        parts, fixes = [], []
        for c in self.failures:
            parts.append(
                f"[{c.name}] {c.found}." + (f" Fix: {c.fix}." if c.fix not in fixes else "")
            )
            fixes.append(c.fix)
        lines = " ".join(parts)
        raise LlamaspecError(
            f"Preflight for the {self.backend} backend failed, so nothing was configured. "
            f"{lines} (`llamaspec doctor --backend {self.backend}` shows every check.)"
        )

    def summary(self) -> dict[str, str]:
        return {c.name: c.found for c in self.checks}


def _out(cmd: Sequence[str], timeout: float = 60) -> str:
    """What a probe prints (stdout + stderr); "" when it cannot run or times out."""
    try:
        proc = procs.run(list(cmd), timeout=timeout, check=False)
    except LlamaspecError:
        return ""
    return (proc.stdout or "") + (proc.stderr or "")


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "(printed nothing)"


def _version(text: str) -> tuple[int, ...]:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else ()


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def _user(defines: Sequence[Define], name: str) -> str | None:
    found = [d.value for d in defines if d.name == name]
    return found[-1] if found else None


# ---------------------------------------------------------------- common


def cmake_minimum(tree: Path, backend: str) -> tuple[int, ...]:
    """The highest cmake_minimum_required among the files this backend's build reads."""
    files = [
        tree / "CMakeLists.txt",
        tree / "ggml" / "CMakeLists.txt",
        tree / "ggml" / "src" / "CMakeLists.txt",
        tree / "ggml" / "src" / f"ggml-{backend}" / "CMakeLists.txt",
    ]
    best: tuple[int, ...] = ()
    for f in files:
        if f.is_file():
            for m in re.finditer(
                r"cmake_minimum_required\s*\(\s*VERSION\s+([\d.]+)", f.read_text(errors="replace")
            ):
                best = max(best, _version(m.group(1)))
    return best


# CMake learnt the flags for CUDA's C++20 dialect with nvcc ≥ 12 in 3.26 (3.25 stops with
# 'requires the language dialect "CUDA20" … does not support this').
CUDA20_CMAKE = (3, 26)


def cuda_cxx20(tree: Path) -> bool:
    """Whether the tree compiles its CUDA sources as C++20 (ik_llama.cpp sets it globally)."""
    top = tree / "CMakeLists.txt"
    text = top.read_text(errors="replace") if top.is_file() else ""
    return bool(re.search(r"set\s*\(\s*CMAKE_(CXX|CUDA)_STANDARD\s+20\b", text))


def common_checks(tools: Toolchain, backend: str, tree: Path | None) -> list[Check]:
    have = _version(tools.cmake_version)
    need = cmake_minimum(tree, backend) if tree else ()
    why = ""
    cuda = backends.backend(backend).cuda
    if cuda and tree is not None and cuda_cxx20(tree) and need < CUDA20_CMAKE:
        need, why = CUDA20_CMAKE, ": it compiles CUDA as C++20"
    ok = not need or have >= need
    checks = [
        Check(
            "cmake",
            ok,
            f"cmake {tools.cmake_version}"
            + (f" (the tree needs ≥ {_dotted(need)}{why})" if need else ""),
            "`pip install -U cmake` (or your distribution's newer cmake)",
        ),
        Check("ninja", True, f"ninja {tools.ninja_version}"),
        Check("compiler", True, tools.cxx_version),
        Check(
            "ccache",
            True,
            "ccache " + (tools.ccache or "not found (rebuilds start cold)"),
            required=False,
        ),
    ]
    return checks


# ---------------------------------------------------------------- CUDA


@dataclass(frozen=True)
class Nvcc:
    path: str
    version: tuple[int, ...]
    archs: tuple[int, ...]


def probe_nvcc(path: str) -> Nvcc:
    """nvcc's version and the archs it can compile for."""
    release = re.search(r"release ([\d.]+)", _out([path, "--version"]))
    version = _version(release.group(1)) if release else ()
    archs = sorted({int(n) for n in re.findall(r"compute_(\d+)", _out([path, "--list-gpu-arch"]))})
    return Nvcc(path, version, tuple(archs))


def cuda_checks(
    archs: tuple[str, ...] | None,
    toolkit: cudatk.Toolkit | None,
    doctor_note: str = "",
) -> list[Check]:
    """The toolkit (which, version, origin, pieces), the archs and the driver.

    `toolkit` is None where it is not resolved yet (doctor before a first CUDA build):
    `doctor_note` then says what a build would do."""
    if toolkit is None:
        return [
            Check("CUDA toolkit", True, doctor_note or "not resolved", required=False),
            _driver_check(None),
        ]
    nvcc = probe_nvcc(str(toolkit.nvcc))
    if not nvcc.version:
        return [
            Check(
                "nvcc",
                False,
                f"{toolkit.nvcc} --version names no CUDA release (not a working nvcc?)",
                "check that this nvcc runs (`nvcc --version`), or choose another toolkit with "
                "--cuda-toolkit",
            )
        ]
    release = _dotted(nvcc.version[:2])
    gaps = cudatk.missing(toolkit.root)
    checks = [
        Check(
            "CUDA toolkit",
            not gaps,
            f"CUDA {release}: {toolkit.origin}" + (f"; lacks {', '.join(gaps)}" if gaps else ""),
            "use --cuda-toolkit auto (completes a toolkit that lacks cuBLAS from PyPI) or "
            f"install cuBLAS for CUDA {release} (`apt-get install libcublas-dev-"
            f"{_cuda_pkg(nvcc.version)}` from NVIDIA's CUDA apt repository)",
        ),
        Check(
            "CUDA version",
            nvcc.version[:2] >= cudatk.CUDA_MIN,
            f"CUDA {release} (the engines need ≥ {_dotted(cudatk.CUDA_MIN)})",
            f"use a CUDA toolkit ≥ {_dotted(cudatk.CUDA_MIN)}: --cuda-toolkit pypi assembles "
            "CUDA 13 from PyPI",
        ),
    ]
    supported = ", ".join(map(str, nvcc.archs))
    if archs is None or archs == ("native",):
        gpu = _gpus()
        checks.append(
            Check(
                "CUDA archs",
                bool(gpu),
                f"native → {gpu}" if gpu else "native (none given), but no GPU is visible",
                f"give the GPUs' SM numbers, e.g. --cuda-arch 90 (nvcc {release} supports "
                f"{supported})",
            )
        )
    else:
        unknown = [n for n in backends.sm_numbers(archs) if n not in nvcc.archs]
        checks.append(
            Check(
                "CUDA archs",
                not unknown,
                f"{';'.join(archs)}"
                + (
                    f": nvcc {release} cannot compile for " + ", ".join(f"sm_{n}" for n in unknown)
                    if unknown
                    else f" (nvcc supports {supported})"
                ),
                f"choose from {supported}, or use a CUDA toolkit that still supports "
                + ", ".join(f"sm_{n}" for n in unknown)
                + " (CUDA 12: --cuda-toolkit system or DIR)",
            )
        )
    checks.append(_driver_check(nvcc.version[0]))
    return checks


def _driver_check(cuda_major: int | None) -> Check:
    """The driver where one is visible: does it run this CUDA major? Too old is refused."""
    driver = gpuhost.driver_version()
    if driver is None:
        return Check(
            "NVIDIA driver",
            True,
            "no GPU/driver visible (needed to run the build, not to compile it)",
            required=False,
        )
    if cuda_major is None:
        return Check("NVIDIA driver", True, f"driver {driver}", required=False)
    need = gpuhost.DRIVER_MIN.get(cuda_major, 0)
    ok = gpuhost.driver_ok(driver, cuda_major)
    return Check(
        "NVIDIA driver",
        ok,
        f"driver {driver}: "
        + (f"runs CUDA {cuda_major}" if ok else f"too old for CUDA {cuda_major} (needs ≥ {need})"),
        f"update the NVIDIA driver to ≥ {need}, or build with a CUDA 12 system toolkit that "
        "this driver runs (--cuda-toolkit system or --cuda-toolkit DIR)",
    )


def _cuda_pkg(version: tuple[int, ...]) -> str:
    return f"{version[0]}-{version[1]}" if len(version) >= 2 else "X-Y"


def _gpus() -> str:
    return "; ".join(gpuhost.gpu_names())


# ---------------------------------------------------------------- Vulkan

# Symbols a tree's Vulkan backend uses, and the header macro that declares them.
VK_NEEDS = (("vk::LayerSettingEXT", "VK_EXT_layer_settings"),)
APT_VULKAN = "apt-get install libvulkan-dev glslc spirv-headers"


def vulkan_needs(tree: Path) -> list[tuple[str, str]]:
    """The (symbol, header macro) pairs this tree's ggml-vulkan sources use."""
    sources = [
        p
        for pattern in ("ggml/src/ggml-vulkan/*.cpp", "ggml/src/ggml-vulkan.cpp")
        for p in tree.glob(pattern)
    ]
    text = "".join(p.read_text(errors="replace") for p in sources)
    return [(sym, macro) for sym, macro in VK_NEEDS if sym in text]


def needs_spirv_headers(tree: Path) -> bool:
    return any(
        "find_package(SPIRV-Headers" in p.read_text(errors="replace")
        for p in tree.glob("ggml/src/ggml-vulkan/CMakeLists.txt")
    )


def header_info(include_dir: Path) -> tuple[str, set[str]] | None:
    """('1.3.239', {declared extension macros}) for an include dir, or None without headers."""
    core = include_dir / "vulkan" / "vulkan_core.h"
    if not core.is_file():
        return None
    text = core.read_text(errors="replace")
    patch = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    complete = re.search(
        r"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION\(\s*\d+,\s*(\d+),\s*(\d+)", text
    )
    major_minor = f"{complete.group(1)}.{complete.group(2)}" if complete else "1.?"
    version = f"{major_minor}.{patch.group(1) if patch else '?'}"
    return version, set(re.findall(r"#define (VK_[A-Z0-9_a-z]+) 1\b", text))


def _spirv_config(extra: str | None) -> Path | None:
    dirs = [Path(extra)] if extra else []
    dirs += [
        Path(p) / "SPIRV-Headers"
        for p in (
            "/usr/share/cmake",
            "/usr/lib/cmake",
            "/usr/local/share/cmake",
            "/usr/local/lib/cmake",
        )
    ]
    dirs += [Path(p) for p in Path("/usr/lib").glob("*/cmake/SPIRV-Headers")]
    return next((d for d in dirs if (d / "SPIRV-HeadersConfig.cmake").is_file()), None)


def _loader() -> str | None:
    out = _out(["ldconfig", "-p"])
    m = re.search(r"libvulkan\.so \(.*\) => (\S+)", out)
    if m:
        return m.group(1)
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"):
        if (Path(d) / "libvulkan.so").exists():
            return str(Path(d) / "libvulkan.so")
    return None


def vulkan_checks(tree: Path | None, defines: Sequence[Define]) -> tuple[list[Check], list[Define]]:
    checks: list[Check] = []
    extra: list[Define] = []
    glslc = _user(defines, "Vulkan_GLSLC_EXECUTABLE") or shutil.which("glslc")
    checks.append(
        Check(
            "glslc",
            bool(glslc),
            f"{glslc}: {_first_line(_out([glslc, '--version']))}" if glslc else "no glslc",
            "`apt-get install glslc` (Debian 12+/Ubuntu 22.04+; elsewhere the Vulkan SDK)",
        )
    )
    loader = _loader()
    checks.append(
        Check(
            "Vulkan loader",
            bool(loader),
            loader or "no libvulkan.so (the development link)",
            "`apt-get install libvulkan-dev`",
        )
    )
    needs = vulkan_needs(tree) if tree else []
    user_inc = _user(defines, "Vulkan_INCLUDE_DIR")
    system_inc = Path(user_inc) if user_inc else Path("/usr/include")
    info = header_info(system_inc)
    private = vkheaders.prefix()
    missing = [(s, m) for s, m in needs if info and m not in info[1]]
    if info is None:
        checks.append(
            Check(
                "Vulkan headers",
                False,
                f"no vulkan/vulkan_core.h in {system_inc}",
                f"`{APT_VULKAN}`",
            )
        )
    elif not missing:
        checks.append(
            Check("Vulkan headers", True, f"{info[0]} in {system_inc}" + _needs_text(needs))
        )
    elif private.complete and not user_inc:
        pinfo = header_info(private.include_dir)
        checks.append(
            Check(
                "Vulkan headers",
                True,
                f"{info[0]} in {system_inc} lacks {', '.join(m for _, m in missing)}; using "
                f"{pinfo[0] if pinfo else '?'} from the private prefix {private.root}",
            )
        )
        key = f"Debian libvulkan-dev/spirv-headers {private.release}"
        origin = f"llamaspec (Vulkan headers {private.release}, private prefix)"
        extra.append(Define("Vulkan_INCLUDE_DIR", str(private.include_dir), origin, key))
        if needs_spirv_headers(tree) and not _user(defines, "SPIRV-Headers_DIR"):  # type: ignore[arg-type]
            extra.append(Define("SPIRV-Headers_DIR", str(private.spirv_dir), origin, key))
    else:
        uses = ", ".join(f"{s} ({m})" for s, m in missing)
        checks.append(
            Check(
                "Vulkan headers",
                False,
                f"Vulkan headers {info[0]} in {system_inc} are too old for this tree: it uses "
                f"{uses}, which they do not declare",
                "`llamaspec doctor --fix-vulkan-headers` (downloads Debian 13's libvulkan-dev and "
                f"spirv-headers {vkheaders.RELEASE}, sha256-pinned, and unpacks them with dpkg -x "
                "into the llamaspec cache; builds then use them), or install newer headers and "
                "pass --define Vulkan_INCLUDE_DIR=DIR",
            )
        )
    if tree is None or needs_spirv_headers(tree):
        chosen = _user(defines, "SPIRV-Headers_DIR") or next(
            (d.value for d in extra if d.name == "SPIRV-Headers_DIR"), None
        )
        where = _spirv_config(chosen)
        checks.append(
            Check(
                "SPIRV-Headers",
                where is not None,
                str(where) if where else "no SPIRV-HeadersConfig.cmake",
                "`apt-get install spirv-headers`",
                required=tree is not None,
            )
        )
    checks.append(Check("Vulkan devices", True, _vulkan_runtime(), required=False))
    return checks, extra


def _needs_text(needs: list[tuple[str, str]]) -> str:
    return f" (declare {', '.join(m for _, m in needs)}, which the tree uses)" if needs else ""


def _vulkan_runtime() -> str:
    icds = sorted(p.name for p in Path("/usr/share/vulkan/icd.d").glob("*.json"))
    lvp = "lvp_icd.json" in icds
    mesa = _out(["dpkg-query", "-W", "-f", "${Version}", "mesa-vulkan-drivers"]).strip()
    text = f"ICDs: {', '.join(icds) or 'none'}"
    if lvp:
        text += f"; lavapipe (CPU) from Mesa {mesa or '?'}: set GGML_VK_VISIBLE_DEVICES=0 to use it"
    return text


# ---------------------------------------------------------------- entry point


def run(
    backend: str,
    tools: Toolchain,
    tree: Path | None = None,
    cuda_archs: tuple[str, ...] | None = None,
    defines: Sequence[Define] = (),
    toolkit: cudatk.Toolkit | None = None,
    doctor_note: str = "",
) -> Preflight:
    """Every check for `backend`; tree-dependent checks only when `tree` is given.

    CUDA: `toolkit` is the resolved toolkit (its defines go to the build)."""
    b = backends.backend(backend)
    checks = common_checks(tools, backend, tree)
    extra: list[Define] = []
    if b.cuda:
        checks += cuda_checks(cuda_archs, toolkit, doctor_note)
        extra += toolkit.defines() if toolkit else []
    elif b.compiles_pipelines:  # Vulkan: its SDK, glslc and headers
        vk, extra = vulkan_checks(tree, defines)
        checks += vk
    check_archs(backend, cuda_archs)
    return Preflight(backend, tuple(checks), tuple(extra))


def check_archs(backend: str, cuda_archs: tuple[str, ...] | None) -> None:
    """--cuda-arch on a backend that is not CUDA's: refused (no tool is needed to say so)."""
    if cuda_archs is not None and not backends.backend(backend).cuda:
        raise LlamaspecError(
            f"--cuda-arch applies to --backend cuda only, not {backend!r}; drop it or build CUDA."
        )
