"""Backend profiles, --cuda-arch, conflicting backends, the user config and header checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.engine import backends, preflight
from llamaspec.engine import profiles as flags
from llamaspec.engine.pipeline import BuildSpec, resolve_options
from llamaspec.errors import LlamaspecError

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("native", ("native",)),
        ("all", ("all",)),
        ("86;89", ("86", "89")),
        ("86, 89", ("86", "89")),
        ("90a-real;120-virtual", ("90a-real", "120-virtual")),
    ],
)
def test_cuda_arch_forms(text: str, parsed: tuple[str, ...]) -> None:
    assert backends.parse_cuda_arch(text) == parsed
    assert backends.cuda_arch_define(parsed, "x").value == ";".join(parsed)


@pytest.mark.parametrize("text", ["sm_86", "86;;eighty", "", "native;86", "8"])
def test_bad_cuda_arch_is_rejected(text: str) -> None:
    with pytest.raises(LlamaspecError, match="is not a list of CUDA architectures"):
        backends.parse_cuda_arch(text)


def test_every_engine_has_cpu_cuda_and_vulkan_profiles_with_meanings() -> None:
    for engine in ("llama.cpp", "ik_llama.cpp"):
        for backend in backends.BACKENDS:
            prof = flags.profile(engine, backend)
            assert all(f.meaning for f in prof.values()), (engine, backend)
    ik = {k: f.value for k, f in flags.profile("ik_llama.cpp", "cuda").items()}
    assert ik["GGML_CUDA"] == "ON" and ik["GGML_BLAS"] == "OFF"
    assert ik["GGML_CUDA_FA_ALL_QUANTS"] == "ON" and ik["GGML_SCHED_MAX_COPIES"] == "1"
    assert ik["GGML_CUDA_IQK_FORCE_BF16"] == "ON" and ik["GGML_CUDA_MIN_BATCH_OFFLOAD"] == "64"
    up = flags.profile("llama.cpp", "cuda")
    assert up["GGML_CUDA_FA_QUANTS"].value == "all" and "GGML_CUDA_FA_ALL_QUANTS" not in up
    assert flags.profile("llama.cpp", "vulkan")["GGML_VULKAN"].value == "ON"


def test_fast_build_applies_per_backend() -> None:
    cuda = {d.name: d.value for d in flags.merge("llama.cpp", "cuda", [], variants=["fast-build"])}
    assert cuda["GGML_CUDA_FA_QUANTS"] == "f16-f16;q8_0-q8_0"
    with pytest.raises(LlamaspecError, match="changes nothing for llama.cpp with backend 'cpu'"):
        flags.merge("llama.cpp", "cpu", [], variants=["fast-build"])
    ik_cpu = {d.name for d in flags.merge("ik_llama.cpp", "cpu", [], variants=["fast-build"])}
    assert "GGML_IQK_FA_ALL_QUANTS" in ik_cpu and "GGML_CUDA_FA_ALL_QUANTS" not in ik_cpu


@pytest.mark.parametrize(
    ("known", "suggestion"),
    [
        ({"GGML_CUDA_USE_GRAPHS"}, "GGML_CUDA_USE_GRAPHS=OFF"),
        ({"GGML_CUDA_GRAPHS"}, "GGML_CUDA_GRAPHS=OFF"),
    ],
)
def test_negated_graphs_flag_points_at_todays_positive_option(known, suggestion) -> None:
    d = flags.parse_define("GGML_CUDA_DISABLE_GRAPHS=1", "--define")
    with pytest.raises(LlamaspecError, match=suggestion):
        flags.check_known([d], known)


def test_conflicting_backends() -> None:
    cuda_on = flags.parse_define("GGML_CUDA=ON", "--define")
    with pytest.raises(LlamaspecError, match="turns on the cuda backend.*use --backend cuda"):
        backends.check_conflicts("cpu", [cuda_on])
    with pytest.raises(LlamaspecError, match="Conflicting backends.*GGML_VULKAN=ON"):
        backends.check_conflicts(
            "cuda", flags.merge("llama.cpp", "cuda", [flags.parse_define("GGML_VULKAN=ON", "x")])
        )
    with pytest.raises(LlamaspecError, match="turns off the cuda backend"):
        backends.check_conflicts(
            "cuda", flags.merge("llama.cpp", "cuda", [flags.parse_define("GGML_CUDA=OFF", "x")])
        )
    backends.check_conflicts("vulkan", flags.merge("llama.cpp", "vulkan", []))


def _config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    monkeypatch.setenv("LLAMASPEC_CONFIG", str(path))
    return path


def test_precedence_cli_over_user_config_over_profile(tmp_path, monkeypatch) -> None:
    path = _config(
        tmp_path,
        monkeypatch,
        "jobs: 3\ndefines:\n  GGML_NATIVE: off\n  GGML_OPENMP: ON\n"
        "backends:\n  cuda:\n    cuda_arch: '86;89'\n    variants: [fast-build]\n",
    )
    opts = resolve_options(BuildSpec(backend="cuda", defines=("GGML_OPENMP=OFF",)), "llama.cpp")
    merged = {
        d.name: d for d in flags.merge("llama.cpp", "cuda", opts.defines, None, opts.variants)
    }
    assert merged["GGML_NATIVE"].value == "OFF"  # YAML's boolean off becomes CMake's OFF
    assert merged["GGML_NATIVE"].origin == f"user config {path}"
    assert merged["GGML_OPENMP"].value == "OFF" and merged["GGML_OPENMP"].origin == "--define"
    assert merged["CMAKE_CUDA_ARCHITECTURES"].value == "86;89"
    assert merged["GGML_CUDA_FA_QUANTS"].origin == "variant fast-build"
    assert merged["GGML_BLAS"].origin == "profile llama.cpp/cuda"
    assert opts.archs == ("86", "89") and opts.jobs == 3 and opts.config_file == str(path)
    cli = resolve_options(BuildSpec(backend="cuda", cuda_arch="90", jobs=1), "llama.cpp")
    assert cli.archs == ("90",) and cli.jobs == 1
    cpu = resolve_options(BuildSpec(backend="cpu"), "llama.cpp")
    assert cpu.archs is None and cpu.variants == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("defines:\n  GGML_CUDA: ON\n", "turns on the cuda backend"),
        ("jbos: 2\n", "unknown key 'jbos'. Did you mean 'jobs'"),
        ("cuda_arch: sm_86\n", "user config .*config.yaml 'sm_86' is not a list of CUDA"),
        ("backends:\n  rocm: {}\n", "backends.rocm"),
        ("jobs: 0\n", "jobs"),
    ],
)
def test_bad_user_config_is_one_clear_error(tmp_path, monkeypatch, text, message) -> None:
    _config(tmp_path, monkeypatch, text)
    with pytest.raises(LlamaspecError, match=message):
        resolve_options(
            BuildSpec(backend="cpu" if "cuda_arch" not in text else "cuda"), "llama.cpp"
        )


def _headers(root: Path, patch: int, macros: tuple[str, ...]) -> Path:
    core = root / "vulkan" / "vulkan_core.h"
    core.parent.mkdir(parents=True)
    core.write_text(
        f"#define VK_HEADER_VERSION {patch}\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n"
        + "".join(f"#define {m} 1\n" for m in macros)
    )
    return root


def _vk_tree(root: Path, uses_layer_settings: bool) -> Path:
    src = root / "ggml" / "src" / "ggml-vulkan"
    src.mkdir(parents=True)
    body = "std::vector<vk::LayerSettingEXT> s;" if uses_layer_settings else "int x;"
    (src / "ggml-vulkan.cpp").write_text(body)
    (src / "CMakeLists.txt").write_text("find_package(SPIRV-Headers CONFIG REQUIRED)\n")
    return root


def test_old_vulkan_headers_are_named_with_the_fix(tmp_path: Path) -> None:
    old = _headers(tmp_path / "old", 239, ("VK_KHR_surface",))
    new = _headers(tmp_path / "new", 309, ("VK_EXT_layer_settings",))
    assert preflight.header_info(old) == ("1.3.239", {"VK_KHR_surface"})
    tree = _vk_tree(tmp_path / "tree", uses_layer_settings=True)
    assert preflight.vulkan_needs(tree) == [("vk::LayerSettingEXT", "VK_EXT_layer_settings")]
    user = [flags.parse_define(f"Vulkan_INCLUDE_DIR={old}", "--define")]
    checks, extra = preflight.vulkan_checks(tree, user)
    bad = {c.name: c for c in checks}["Vulkan headers"]
    assert not bad.ok and "1.3.239" in bad.found and "VK_EXT_layer_settings" in bad.found
    assert "llamaspec doctor --fix-vulkan-headers" in bad.fix and not extra
    user = [flags.parse_define(f"Vulkan_INCLUDE_DIR={new}", "--define")]
    good = {c.name: c for c in preflight.vulkan_checks(tree, user)[0]}["Vulkan headers"]
    assert good.ok and "1.3.309" in good.found
    older_tree = _vk_tree(tmp_path / "older", uses_layer_settings=False)
    user = [flags.parse_define(f"Vulkan_INCLUDE_DIR={old}", "--define")]
    assert {c.name: c for c in preflight.vulkan_checks(older_tree, user)[0]}["Vulkan headers"].ok


def test_cmake_minimum_is_the_highest_the_backend_reads(tmp_path: Path) -> None:
    (tmp_path / "ggml" / "src" / "ggml-cuda").mkdir(parents=True)
    (tmp_path / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14...3.28)\n")
    (tmp_path / "ggml" / "src" / "ggml-cuda" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)  # archs\n"
    )
    assert preflight.cmake_minimum(tmp_path, "cuda") == (3, 18)
    assert preflight.cmake_minimum(tmp_path, "cpu") == (3, 14)


def test_build_without_glslc_stops_before_fetching(tmp_path: Path) -> None:
    """A PATH with cmake, ninja and c++ but no glslc: the Vulkan build stops at preflight."""
    import shutil

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("cmake", "ninja", "c++"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llamaspec.cli",
            "build",
            "--backend",
            "vulkan",
            "--dist",
            str(tmp_path / "d"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "LLAMASPEC_CACHE": str(tmp_path), "HOME": str(tmp_path)},
        check=False,
        timeout=120,
    )
    text = " ".join(proc.stderr.split())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    if not all((bin_dir / t).exists() for t in ("cmake", "ninja", "c++")):
        assert "is not installed" in text or "No C++ compiler" in text
        return
    assert "Preflight for the vulkan backend failed, so nothing was configured" in text
    assert "[glslc] no glslc. Fix: `apt-get install glslc`" in text
    assert not (tmp_path / "d").exists() and not (tmp_path / "sources").exists()


def test_the_docs_document_every_profile_and_variant_define() -> None:
    assert flags.markdown() in (ROOT / "docs/reference/build-options.md").read_text(), (
        "the docs' profile tables are stale: paste llamaspec.engine.profiles.markdown() "
        "into docs/reference/build-options.md"
    )


@pytest.mark.parametrize(
    ("value", "meaning"),
    [
        ("ON", True),
        ("on", True),
        ("Yes", True),
        ("y", True),
        ("1", True),
        ("2", True),
        ("-1", True),
        ("0.5", True),
        ("OFF", False),
        ("no", False),
        ("N", False),
        ("0", False),
        ("0.0", False),
        ("", False),
        ("IGNORE", False),
        ("NOTFOUND", False),
        ("CUDA-NOTFOUND", False),
        ("maybe", None),
        ("enabled", None),
        ("disable", None),
    ],
)
def test_cmake_booleans_are_judged_as_cmake_does(value: str, meaning: bool | None) -> None:
    assert flags.cmake_bool(value) is meaning


@pytest.mark.parametrize(("value", "on"), [("maybe", None), ("enabled", None), ("2", True)])
def test_backend_switch_values_are_read_as_cmake_reads_them(value: str, on: bool | None) -> None:
    define = flags.parse_define(f"GGML_CUDA={value}", "--define")
    if on is None:
        with pytest.raises(LlamaspecError, match=f"GGML_CUDA={value} .* neither ON nor OFF"):
            backends.check_conflicts("cpu", [define])
    else:  # CMake reads 2 as true: a CUDA build, not the cpu build asked for
        with pytest.raises(LlamaspecError, match="turns on the cuda backend"):
            backends.check_conflicts("cpu", [define])
    with pytest.raises(LlamaspecError, match="GGML_CUDA"):
        resolve_options(BuildSpec(backend="cpu", defines=(f"GGML_CUDA={value}",)), "llama.cpp")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("jobs: yes\n", "jobs"),
        ("jobs: '4'\n", "jobs"),
        ("jobs: -4\n", "jobs"),
    ],
)
def test_jobs_must_be_a_positive_integer(tmp_path, monkeypatch, text, message) -> None:
    _config(tmp_path, monkeypatch, text)
    with pytest.raises(LlamaspecError, match=message):
        resolve_options(BuildSpec(backend="cpu"), "llama.cpp")


@pytest.mark.parametrize("jobs", [0, -4])
def test_cli_jobs_below_one_are_refused(jobs: int, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("LLAMASPEC_CONFIG", os.devnull)
    with pytest.raises(LlamaspecError, match=f"--jobs {jobs} is not a number of parallel"):
        resolve_options(BuildSpec(backend="cpu", jobs=jobs), "llama.cpp")


@pytest.mark.parametrize("kind", ["directory", "missing", "not-utf8"])
def test_llamaspec_config_must_name_a_readable_file(tmp_path, monkeypatch, kind: str) -> None:
    path = tmp_path / "config.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-utf8":
        path.write_bytes(b"jobs: \xff\n")
    monkeypatch.setenv("LLAMASPEC_CONFIG", str(path))
    message = {"directory": "is a directory", "missing": "does not exist", "not-utf8": "not UTF-8"}
    with pytest.raises(LlamaspecError, match=message[kind]) as err:
        resolve_options(BuildSpec(backend="cpu"), "llama.cpp")
    assert "\n" not in err.value.message


def test_private_vulkan_headers_are_verified_on_use() -> None:
    from llamaspec.engine.vulkan import headers as vkheaders

    target = vkheaders.prefix()
    core = target.include_dir / "vulkan" / "vulkan_core.h"
    core.parent.mkdir(parents=True)
    core.write_text("#define VK_HEADER_VERSION 309\n")
    (target.include_dir / "vulkan" / "vulkan.hpp").write_text("// hpp\n")
    assert not target.complete  # not marked yet
    vkheaders.mark_complete(target.root, vkheaders.DEBS["amd64"])
    assert target.complete
    core.write_text("#define VK_HEADER_VERSION 239\n")  # changed after unpacking
    assert not target.complete
    core.write_text("#define VK_HEADER_VERSION 309\n")
    assert target.complete
    (target.include_dir / "vulkan" / "vulkan.hpp").unlink()
    assert not target.complete


def test_unpacking_dirs_of_killed_runs_are_removed(tmp_path: Path) -> None:
    from llamaspec import procs
    from llamaspec.engine.vulkan import headers as vkheaders

    parent = vkheaders.prefix().root.parent
    stale = parent / f".tmp-{vkheaders.RELEASE}-999999999"
    (stale / "usr").mkdir(parents=True)
    live = parent / f".tmp-{vkheaders.RELEASE}-{os.getppid()}"
    live.mkdir()
    procs.remove_stale(parent, f".tmp-{vkheaders.RELEASE}-*")
    assert not stale.exists() and live.exists()
