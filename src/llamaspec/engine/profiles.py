"""CMake flag profiles per engine × backend, user defines, and their validation."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llamaspec.errors import LlamaspecError, did_you_mean

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.+-]*$")
# CMake's boolean constants (case-insensitive); numbers are true unless zero.
CMAKE_TRUE = frozenset({"1", "ON", "YES", "TRUE", "Y"})
CMAKE_FALSE = frozenset({"0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND", ""})
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def cmake_bool(value: str) -> bool | None:
    """How CMake reads `value` as a boolean constant: True, False, or None when it is none.

    True: 1, ON, YES, TRUE, Y, a non-zero number. False: 0, OFF, NO, FALSE, N, IGNORE,
    NOTFOUND, the empty string, anything ending in -NOTFOUND, a zero number. Anything else
    (`maybe`, `enabled`) is not a constant: CMake's `if(VAR)` would then read it as true."""
    upper = value.upper()
    if upper in CMAKE_TRUE:
        return True
    if upper in CMAKE_FALSE or upper.endswith("-NOTFOUND"):
        return False
    if _NUMBER.match(value):
        return float(value) != 0
    return None


@dataclass(frozen=True)
class Define:
    """One CMake cache define and where it came from (for error messages and the manifest).

    `key` replaces the value in the artifact id where the value is a path on this machine
    (e.g. the private Vulkan header prefix): the id names what it is, not where it lies."""

    name: str
    value: str
    origin: str
    key: str | None = None

    @property
    def arg(self) -> str:
        return f"-D{self.name}={self.value}"


@dataclass(frozen=True)
class Flag:
    value: str
    meaning: str
    only_if_declared: bool = False  # set only where the tree declares it (older/newer pins)
    backends: tuple[str, ...] = ()  # variants: only for these backends (empty: all)


# Profiles are data: every define with what it does. `(engine, backend)` → {define: Flag}.
COMMON: dict[str, Flag] = {
    "CMAKE_BUILD_TYPE": Flag("Release", "optimised build with assertions off"),
    "GGML_NATIVE": Flag("ON", "tune kernels for the CPU of the build machine (-march=native)"),
    "LLAMA_BUILD_TESTS": Flag("OFF", "skip the engine's own test programs"),
    "LLAMA_BUILD_EXAMPLES": Flag("OFF", "skip example programs the server does not need"),
    "LLAMA_BUILD_SERVER": Flag("ON", "build llama-server"),
    "LLAMA_CURL": Flag(
        "OFF", "no libcurl: models are downloaded by llamaspec, not the server", True
    ),
}
PROFILES: dict[tuple[str, str], dict[str, Flag]] = {
    ("llama.cpp", "cpu"): {
        **COMMON,
        "LLAMA_USE_PREBUILT_UI": Flag(
            "OFF", "do not download web UI assets from Hugging Face during the build", True
        ),
    },
    ("ik_llama.cpp", "cpu"): {
        **COMMON,
        "LLAMA_BUILD_EXAMPLES": Flag(
            "ON", "ik_llama.cpp keeps llama-server under examples/; only the server target is built"
        ),
    },
}
_BLAS_OFF = Flag("OFF", "no BLAS library: the GPU backend does the large matrix products")
_ONE_COPY = Flag(
    "1", "one input copy per split for pipeline parallelism (less VRAM; one GPU needs no more)"
)
PROFILES[("llama.cpp", "cuda")] = {
    **PROFILES[("llama.cpp", "cpu")],
    "GGML_CUDA": Flag("ON", "build the CUDA backend (needs nvcc and cuBLAS)"),
    "GGML_BLAS": _BLAS_OFF,
    "GGML_CUDA_FA_QUANTS": Flag(
        "all",
        "flash-attention kernels for every K/V cache type pair (today's spelling of the "
        "deprecated GGML_CUDA_FA_ALL_QUANTS=ON); fast-build narrows it",
    ),
    "GGML_SCHED_MAX_COPIES": _ONE_COPY,
    "GGML_CUDA_GRAPHS": Flag(
        "ON", "CUDA graphs cut kernel-launch overhead in token generation (OFF to disable)"
    ),
}
PROFILES[("ik_llama.cpp", "cuda")] = {
    **PROFILES[("ik_llama.cpp", "cpu")],
    "GGML_CUDA": Flag("ON", "build the CUDA backend (needs nvcc and cuBLAS)"),
    "GGML_BLAS": _BLAS_OFF,
    "GGML_CUDA_FA_ALL_QUANTS": Flag(
        "ON", "flash-attention kernels for every K/V cache type pair (quantised KV caches)"
    ),
    "GGML_SCHED_MAX_COPIES": _ONE_COPY,
    "GGML_CUDA_IQK_FORCE_BF16": Flag(
        "ON", "bf16 cuBLAS where no MMQ kernel exists (avoids fp16 overflow on some models)"
    ),
    "GGML_CUDA_MIN_BATCH_OFFLOAD": Flag(
        "64", "offload CPU-resident weights to the GPU for batches of at least 64 tokens"
    ),
}
PROFILES[("llama.cpp", "vulkan")] = {
    **PROFILES[("llama.cpp", "cpu")],
    "GGML_VULKAN": Flag("ON", "build the Vulkan backend (needs Vulkan headers, glslc, SPIRV)"),
    "GGML_OPENMP": Flag("ON", "OpenMP threads for the CPU part (the reported GGML_USE_OPENMP)"),
}
PROFILES[("ik_llama.cpp", "vulkan")] = {
    **PROFILES[("ik_llama.cpp", "cpu")],
    "GGML_VULKAN": Flag("ON", "build the Vulkan backend (needs Vulkan headers, glslc, SPIRV)"),
    "GGML_OPENMP": Flag("ON", "OpenMP threads for the CPU part (the reported GGML_USE_OPENMP)"),
}


# Named variants, layered on the profile: (engine, variant) → {define: Flag}.
VARIANTS: dict[tuple[str, str], dict[str, Flag]] = {
    ("ik_llama.cpp", "fast-build"): {
        "GGML_IQK_FA_ALL_QUANTS": Flag(
            "OFF",
            "IQK flash-attention CPU kernels for f16, q8_0, q8_KV and q6_0 K/V caches only "
            "(ggml/src/iqk/fa/* take minutes each on small machines); a q4_0, q4_1 or iq4_nl "
            "cache then stops the server with the flag to rebuild with",
        ),
        "GGML_CUDA_FA_ALL_QUANTS": Flag(
            "OFF", "CUDA flash-attention kernels for the common K/V types only", False, ("cuda",)
        ),
    },
    ("llama.cpp", "fast-build"): {
        "GGML_CUDA_FA_QUANTS": Flag(
            "f16-f16;q8_0-q8_0",
            "CUDA flash-attention kernels for f16 and q8_0 K/V caches only",
            False,
            ("cuda",),
        ),
    },
    ("llama.cpp", "portable"): {
        "GGML_NATIVE": Flag("OFF", "no -march=native: the binary runs on other x86 CPUs"),
        "GGML_BACKEND_DL": Flag("ON", "backends as loadable libraries"),
        "GGML_CPU_ALL_VARIANTS": Flag(
            "ON", "one CPU backend per instruction set, picked at run time"
        ),
    },
    # ik_llama.cpp has no run-time CPU variant selection (no GGML_BACKEND_DL): its portable
    # build has one fixed x86-64-v3 baseline, the instruction sets its IQK kernels are for
    ("ik_llama.cpp", "portable"): {
        "GGML_NATIVE": Flag(
            "OFF", "no -march=native: the binary runs on any x86-64-v3 CPU (Haswell, Zen 1 on)"
        ),
        **{
            name: Flag("ON", f"{what} (x86-64-v3 baseline; a CPU without it cannot run the build)")
            for name, what in (
                ("GGML_AVX", "AVX"),
                ("GGML_AVX2", "AVX2"),
                ("GGML_FMA", "FMA"),
                ("GGML_F16C", "F16C"),
            )
        },
    },
    ("llama.cpp", "rpc"): {"GGML_RPC": Flag("ON", "build the RPC backend and rpc-server")},
    ("ik_llama.cpp", "rpc"): {"GGML_RPC": Flag("ON", "build the RPC backend and rpc-server")},
}


def _lookup(
    table: dict[tuple[str, str], dict[str, Flag]], engine: str, key: str, kind: str
) -> dict[str, Flag]:
    try:
        return table[(engine, key)]
    except KeyError:
        known = sorted(k for e, k in table if e == engine)
        raise LlamaspecError(
            f"No {key!r} {kind} for {engine}.{did_you_mean(key, known)} "
            f"{kind.capitalize()}s for {engine}: {', '.join(known) or '(none)'}."
        ) from None


def variant(engine: str, name: str) -> dict[str, Flag]:
    return _lookup(VARIANTS, engine, name, "variant")


def variant_flags(engine: str, name: str, backend: str) -> dict[str, Flag]:
    """A variant's flags that apply to `backend`; a variant with none for it is an error."""
    layer = {
        k: f for k, f in variant(engine, name).items() if not f.backends or backend in f.backends
    }
    if not layer:
        wanted = sorted({b for f in variant(engine, name).values() for b in f.backends})
        raise LlamaspecError(
            f"Variant {name!r} changes nothing for {engine} with backend {backend!r}; it applies "
            f"to backend(s) {', '.join(wanted)}. Drop --variant {name} or pick that backend."
        )
    return layer


def profile(engine: str, backend: str) -> dict[str, Flag]:
    return _lookup(PROFILES, engine, backend, "build profile")


def parse_define(text: str, origin: str) -> Define:
    """Parse `K=V` or `-DK=V` (optionally `K:TYPE=V`) and reject malformed input early."""
    raw = text[2:] if text.startswith("-D") else text
    if "=" not in raw:
        raise LlamaspecError(
            f"--define {text!r} has no value: write it as NAME=VALUE, e.g. --define GGML_OPENMP=ON."
        )
    name, value = raw.split("=", 1)
    name = name.split(":", 1)[0].strip()
    if not NAME.match(name):
        raise LlamaspecError(
            f"--define {text!r}: {name!r} is not a CMake variable name (letters, digits and _ "
            "only). Write it as NAME=VALUE, e.g. --define GGML_OPENMP=ON."
        )
    if name.startswith(("GGML_", "LLAMA_")) and value == "":
        raise LlamaspecError(f"--define {text!r} sets {name} to an empty value; give a value.")
    return Define(name, value, origin)


def merge(
    engine: str,
    backend: str,
    extras: Sequence[Define],
    declared: set[str] | None = None,
    variants: Sequence[str] = (),
) -> list[Define]:
    """Profile defines overlaid by extras (later wins), in a stable order. Profile flags
    marked only_if_declared are dropped when `declared` (the tree's options) lacks them."""
    merged: dict[str, Define] = {
        name: Define(name, flag.value, f"profile {engine}/{backend}")
        for name, flag in profile(engine, backend).items()
        if not (flag.only_if_declared and declared is not None and name not in declared)
    }
    for name in variants:
        layer = variant_flags(engine, name, backend)
        for define, flag in layer.items():
            merged[define] = Define(define, flag.value, f"variant {name}")
    for d in extras:
        merged[d.name] = d
    return list(merged.values())


_UNUSED = re.compile(
    r"Manually-specified variables were not used by the project:\s*\n\n((?:\s+\S+\n)+)"
)
_OPTION = re.compile(r"\b(?:option|cmake_dependent_option)\s*\(\s*([A-Za-z0-9_]+)", re.I)
_SET_CACHE = re.compile(r"\bset\s*\(\s*([A-Za-z0-9_]+)\s+[^)]*\bCACHE\b", re.I)


def unused_defines(configure_output: str) -> list[str]:
    """Names CMake reports under 'Manually-specified variables were not used'."""
    m = _UNUSED.search(configure_output)
    return [ln.strip() for ln in m.group(1).splitlines() if ln.strip()] if m else []


def tree_options(tree: Path) -> set[str]:
    """Every option()/CACHE variable the tree declares (for did-you-mean)."""
    names: set[str] = set()
    for path in (*tree.rglob("CMakeLists.txt"), *tree.rglob("*.cmake")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        names.update(_OPTION.findall(text))
        names.update(_SET_CACHE.findall(text))
    return names


def check_unused(
    output: str, defines: Iterable[Define], known: Iterable[str], cache: Mapping[str, str]
) -> None:
    """Raise when CMake ignored any define, naming the closest real option and its origin.

    llamaspec's own defines are not typos: a tree may ignore them (e.g. CMAKE_C_FLAGS, which
    carries the reproducible-build flags, in a C++-only project)."""
    by_name = {d.name: d for d in defines}
    unused = [
        n
        for n in unused_defines(output)
        if not (n in by_name and by_name[n].origin.startswith("llamaspec"))
    ]
    if not unused:
        return
    choices = sorted({*known, *cache})
    lines = []
    for name in unused:
        origin = by_name[name].origin if name in by_name else "the command line"
        lines.append(
            f"{name} (from {origin}) is not an option of this tree.{did_you_mean(name, choices)}"
        )
    raise LlamaspecError(
        "CMake ignored defines that would have silently done nothing: "
        + " ".join(lines)
        + " Fix the spelling or drop the define; nothing was built."
    )


# CMake's own variables and find_package() hints are not declared by the tree.
_EXTERNAL = re.compile(r"^(CMAKE_|CPACK_)|_(DIR|ROOT|INCLUDE_DIR|LIBRARY|EXECUTABLE|PATH)$")


def check_known(defines: Iterable[Define], known: set[str]) -> None:
    """Before CMake runs: every GGML_/LLAMA_/... define must be declared by this tree.

    CMake's own "not used" report misses names that the tree mentions without reading
    (e.g. GGML_USE_OPENMP, a compile definition, not an option)."""
    bad = [
        d
        for d in defines
        if not d.origin.startswith("llamaspec")
        and not _EXTERNAL.search(d.name)
        and d.name not in known
    ]
    if bad:
        lines = [
            f"{d.name} (from {d.origin}) is not an option of this tree." + _hint(d, known)
            for d in bad
        ]
        raise LlamaspecError(
            " ".join(lines) + " Fix the spelling or drop the define; nothing was configured."
        )


# Negated spellings users carry over from old instructions → the positive option of today.
INVERTED = {"GGML_CUDA_DISABLE_GRAPHS": ("GGML_CUDA_GRAPHS", "GGML_CUDA_USE_GRAPHS")}


def _hint(d: Define, known: set[str]) -> str:
    for option in INVERTED.get(d.name, ()):
        if option in known:
            return f" Did you mean '{option}=OFF' (today's option is positive)?"
    return did_you_mean(d.name, known)


def markdown() -> str:
    """The tables of every profile and variant define in docs/reference/build-options.md,
    generated from the data above."""
    engines = ("llama.cpp", "ik_llama.cpp")
    cols = [(e, b) for e in engines for b in ("cpu", "cuda", "vulkan")]
    names = list(dict.fromkeys(n for c in cols for n in PROFILES[c]))
    head = "| define | " + " | ".join(f"{e} {b}" for e, b in cols) + " | meaning |"
    rows = [head, "|---" * (len(cols) + 2) + "|"]
    for name in names:
        cells = [f"`{PROFILES[c][name].value}`" if name in PROFILES[c] else "—" for c in cols]
        meanings = dict.fromkeys(
            PROFILES[c][name].meaning
            + (" (only where the tree declares it)" if PROFILES[c][name].only_if_declared else "")
            for c in cols
            if name in PROFILES[c]
        )
        rows.append(f"| `{name}` | " + " | ".join(cells) + " | " + " / ".join(meanings) + " |")
    rows += ["", "| variant | engine | backends | define | meaning |", "|---|---|---|---|---|"]
    for (engine, var), table in VARIANTS.items():
        for name, flag in table.items():
            where = ", ".join(flag.backends) or "all"
            rows.append(
                f"| `{var}` | {engine} | {where} | `{name}={flag.value}` | {flag.meaning} |"
            )
    return "\n".join(rows) + "\n"


# What a CPU must have to run a build: GGML's instruction-set options and the /proc/cpuinfo
# flag that names each.
CPU_FLAGS: dict[str, str] = {
    "GGML_SSE42": "sse4_2",
    "GGML_AVX": "avx",
    "GGML_F16C": "f16c",
    "GGML_FMA": "fma",
    "GGML_AVX2": "avx2",
    "GGML_BMI2": "bmi2",
    "GGML_AVX_VNNI": "avx_vnni",
    "GGML_AVX512": "avx512f",
    "GGML_AVX512_VBMI": "avx512vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16",
    "GGML_AMX_TILE": "amx_tile",
    "GGML_AMX_INT8": "amx_int8",
}
# ik_llama.cpp turns these on by default when GGML_NATIVE is off (upstream does not)
_IK_NOT_NATIVE = ("GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C")


def cpu_needs(engine: str, defines: Iterable[Mapping[str, str]]) -> list[str] | None:
    """The /proc/cpuinfo flags a CPU needs to run a build with these defines (as the
    manifest records them), or None for a GGML_NATIVE=ON build (whatever the build
    machine has). Run-time CPU variant selection (GGML_CPU_ALL_VARIANTS) needs none."""
    values = {d["name"]: d["value"] for d in defines}
    if cmake_bool(values.get("GGML_NATIVE", "ON")) is not False:
        return None
    if cmake_bool(values.get("GGML_CPU_ALL_VARIANTS", "OFF")):
        return []
    on = {n for n, v in values.items() if cmake_bool(v)}
    if engine == "ik_llama.cpp":
        on |= {n for n in _IK_NOT_NATIVE if cmake_bool(values.get(n, "ON"))}
    return [flag for name, flag in CPU_FLAGS.items() if name in on]


def host_cpu_flags(cpuinfo: str) -> list[str]:
    """The instruction sets of CPU_FLAGS that a /proc/cpuinfo text's first CPU has."""
    line = next((ln for ln in cpuinfo.splitlines() if ln.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return [flag for flag in CPU_FLAGS.values() if flag in have]
