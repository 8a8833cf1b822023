"""Build-stage logic that needs no compiler: defines, artifact ids, error extraction."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from llamaspec.engine import build
from llamaspec.engine import profiles as flags
from llamaspec.engine.patch_queue import PatchedTree, PatchStatus
from llamaspec.engine.sources import SourceTree
from llamaspec.engine.toolchain import Toolchain
from llamaspec.errors import LlamaspecError

from gitrepos import make_engine

pytestmark = pytest.mark.unit

TOOLS = Toolchain("cmake", "3.25.1", "ninja", "1.11.1", "c++", "c++ (Debian 12.2.0) 12.2.0", None)


def patched(origin: str = "pypi-sdist", applied: tuple[str, ...] = ()) -> PatchedTree:
    src = SourceTree(Path("/x"), "llama.cpp", "a" * 40, origin, "d", False, "key-" + origin)  # type: ignore[arg-type]
    statuses = tuple(PatchStatus(p, p, "applied", "f" * 64, "file:x") for p in applied)
    return PatchedTree(src, Path("/x"), statuses)


def aid(tree: PatchedTree, defines=(), tools: Toolchain = TOOLS) -> str:
    engine = make_engine("a" * 40)
    merged = [
        *flags.merge("llama.cpp", "cpu", list(defines)),
        *build.internal_defines(engine, tree),
    ]
    return build.artifact_id(engine, tree, "cpu", merged, tools)


def test_artifact_id_is_stable_and_ignores_where_the_source_came_from() -> None:
    assert aid(patched()) == aid(patched())
    assert aid(patched("git")) == aid(patched("pypi-sdist"))
    assert aid(patched()).startswith("llamacpp-cpu-")


def test_artifact_id_changes_with_what_changes_the_binary() -> None:
    base = aid(patched())
    assert aid(patched(applied=("p1",))) != base
    assert aid(patched(), [flags.parse_define("GGML_OPENMP=OFF", "cli")]) != base
    newer = dataclasses.replace(TOOLS, cxx_version="c++ (Debian 13) 13.1")
    assert aid(patched(), tools=newer) != base


def test_version_stamp_marks_patched_builds() -> None:
    engine = make_engine("a" * 40, build_number=11312)
    stamp = {d.name: d.value for d in build.internal_defines(engine, patched(applied=("p",)))}
    assert stamp["LLAMA_BUILD_COMMIT"] == "aaaaaaa+1p"
    assert stamp["LLAMA_BUILD_NUMBER"] == "11312"


@pytest.mark.parametrize(
    ("text", "name", "value"),
    [("GGML_OPENMP=ON", "GGML_OPENMP", "ON"), ("-DFOO:BOOL=OFF", "FOO", "OFF"), ("A=", "A", "")],
)
def test_parse_define(text: str, name: str, value: str) -> None:
    d = flags.parse_define(text, "cli")
    assert (d.name, d.value, d.arg) == (name, value, f"-D{name}={value}")


@pytest.mark.parametrize("text", ["GGML_CUDA_DISABLE_GRAPHS", "-D=1", "GGML CUDA=ON", "GGML_X="])
def test_bad_define_is_caught_before_cmake(text: str) -> None:
    with pytest.raises(LlamaspecError, match="--define"):
        flags.parse_define(text, "cli")


CONFIGURE_OUT = """-- Generating done
CMake Warning:
  Manually-specified variables were not used by the project:

    GGML_USE_OPENMP
    LLAMA_FOO


-- Build files have been written to: /b
"""


def test_unused_defines_become_did_you_mean_errors(tmp_path: Path) -> None:
    (tmp_path / "CMakeLists.txt").write_text('option(GGML_OPENMP "use OpenMP" ON)\n')
    assert flags.unused_defines(CONFIGURE_OUT) == ["GGML_USE_OPENMP", "LLAMA_FOO"]
    defines = [flags.parse_define("GGML_USE_OPENMP=ON", "--define")]
    with pytest.raises(LlamaspecError) as err:
        flags.check_unused(CONFIGURE_OUT, defines, flags.tree_options(tmp_path), {})
    text = str(err.value)
    assert "GGML_USE_OPENMP (from --define)" in text and "Did you mean 'GGML_OPENMP'" in text
    flags.check_unused("-- all good", defines, [], {})


def test_profile_lookup_and_override() -> None:
    merged = {
        d.name: d
        for d in flags.merge(
            "llama.cpp", "cpu", [flags.parse_define("GGML_NATIVE=OFF", "--define")]
        )
    }
    assert merged["GGML_NATIVE"].value == "OFF" and merged["GGML_NATIVE"].origin == "--define"
    assert merged["LLAMA_CURL"].value == "OFF"
    with pytest.raises(LlamaspecError, match="No 'cpux' build profile"):
        flags.profile("llama.cpp", "cpux")


def test_first_error_shows_the_compiler_error_not_the_whole_log() -> None:
    log = "\n".join(
        [f"[{i}/9] Building CXX object x{i}.o" for i in range(5)]
        + [
            "FAILED: foo.o",
            "/src/foo.cpp:3:5: error: 'bar' was not declared in this scope",
            "    3 |     bar();",
            "      |     ^~~",
        ]
        + [f"noise {i}" for i in range(1000)]
    )
    shown = build.first_error(log)
    assert "error: 'bar' was not declared" in shown and "noise 500" not in shown
    assert len(shown.splitlines()) < 12


def test_undeclared_define_is_caught_before_cmake_with_did_you_mean() -> None:
    known = {"GGML_OPENMP", "LLAMA_BUILD_SERVER"}
    user = flags.parse_define("GGML_USE_OPENMP=ON", "--define")
    with pytest.raises(LlamaspecError, match=r"GGML_USE_OPENMP \(from --define\).*'GGML_OPENMP'"):
        flags.check_known([user], known)
    # CMake's own variables, find_package hints and llamaspec's stamps pass
    ok = [
        flags.parse_define("CMAKE_CUDA_ARCHITECTURES=86", "--define"),
        flags.parse_define("Vulkan_INCLUDE_DIR=/x", "--define"),
        flags.Define("LLAMA_BUILD_COMMIT", "abc", "llamaspec (version stamp)"),
    ]
    flags.check_known(ok, known)


def test_profile_flags_only_where_the_tree_declares_them() -> None:
    names = {d.name for d in flags.merge("llama.cpp", "cpu", [], declared={"GGML_NATIVE"})}
    assert "LLAMA_CURL" not in names and "LLAMA_USE_PREBUILT_UI" not in names
    assert "GGML_NATIVE" in names
    assert "LLAMA_CURL" in {d.name for d in flags.merge("llama.cpp", "cpu", [])}


def test_variants_layer_between_profile_and_cli() -> None:
    merged = {d.name: d for d in flags.merge("ik_llama.cpp", "cpu", [], variants=["fast-build"])}
    assert merged["GGML_IQK_FA_ALL_QUANTS"].value == "OFF"
    assert merged["GGML_IQK_FA_ALL_QUANTS"].origin == "variant fast-build"
    cli = [flags.parse_define("GGML_IQK_FA_ALL_QUANTS=ON", "--define")]
    over = {d.name: d for d in flags.merge("ik_llama.cpp", "cpu", cli, variants=["fast-build"])}
    assert over["GGML_IQK_FA_ALL_QUANTS"].value == "ON"
    with pytest.raises(LlamaspecError, match="No 'portble' variant for ik_llama.cpp"):
        flags.merge("ik_llama.cpp", "cpu", [], variants=["portble"])


@pytest.mark.parametrize(
    ("engine", "variants", "needs"),
    [
        ("llama.cpp", [], None),  # GGML_NATIVE=ON: whatever the build machine has
        ("llama.cpp", ["portable"], []),  # CPU code chosen at run time
        ("ik_llama.cpp", ["portable"], ["avx", "f16c", "fma", "avx2"]),  # x86-64-v3
        ("ik_llama.cpp", [], None),
    ],
)
def test_what_a_cpu_needs_to_run_a_build(engine, variants, needs) -> None:
    merged = flags.merge(engine, "cpu", [], variants=variants)
    as_manifest = [{"name": d.name, "value": d.value} for d in merged]
    assert flags.cpu_needs(engine, as_manifest) == needs


def test_cpu_needs_follow_the_defines_and_ik_defaults() -> None:
    # ik_llama.cpp turns AVX/AVX2/FMA/F16C on when GGML_NATIVE is off; upstream does not
    off = [{"name": "GGML_NATIVE", "value": "OFF"}]
    assert flags.cpu_needs("ik_llama.cpp", off) == ["avx", "f16c", "fma", "avx2"]
    assert flags.cpu_needs("llama.cpp", off) == []
    no_avx2 = [*off, {"name": "GGML_AVX2", "value": "OFF"}, {"name": "GGML_AVX512", "value": "1"}]
    assert flags.cpu_needs("ik_llama.cpp", no_avx2) == ["avx", "f16c", "fma", "avx512f"]
    cpuinfo = "processor\t: 0\nflags\t\t: fpu sse4_2 avx f16c fma avx2 bmi2 ht\n"
    assert flags.host_cpu_flags(cpuinfo) == ["sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"]
    assert flags.host_cpu_flags("") == []


def test_build_dir_lives_inside_trees_llamaspec_owns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLAMASPEC_CACHE", str(cache))
    owned = cache / "work" / "llama.cpp" / "abc-123"
    (owned / ".git" / "info").mkdir(parents=True)
    old = cache / "build" / "llamacpp-cpu-1"
    old.mkdir(parents=True)  # the older layout: a real directory
    (old / "CMakeCache.txt").write_text("stale")
    got = build.build_dir_for(owned, "llamacpp-cpu-1")
    assert got == owned / build.BUILD_SUBDIR / "llamacpp-cpu-1" and got.is_dir()
    assert old.is_symlink() and old.resolve() == got.resolve()
    assert not (got / "CMakeCache.txt").exists()
    assert f"/{build.BUILD_SUBDIR}/" in (owned / ".git" / "info" / "exclude").read_text()
    assert build.build_dir_for(owned, "llamacpp-cpu-1") == got  # idempotent
    assert build.ccache_env(owned) == {"CCACHE_BASEDIR": str(owned.resolve())}
    # two trees that differ only in name give the same relative paths from their build dirs
    other = cache / "work" / "llama.cpp" / "abc-456"
    other.mkdir(parents=True)
    rel = [
        Path(os.path.relpath(t / "ggml" / "src" / "ggml.c", d))
        for t, d in ((owned, got), (other, build.build_dir_for(other, "llamacpp-cpu-2")))
    ]
    assert rel[0] == rel[1] == Path("../../ggml/src/ggml.c")


def test_a_users_own_checkout_is_not_written_into(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMASPEC_CACHE", str(tmp_path / "cache"))
    checkout = tmp_path / "my-llama.cpp"
    checkout.mkdir()
    got = build.build_dir_for(checkout, "llamacpp-cpu-9")
    assert got == tmp_path / "cache" / "build" / "llamacpp-cpu-9" and not got.is_symlink()
    assert not (checkout / build.BUILD_SUBDIR).exists()
    assert build.ccache_env(checkout) == {}


def test_only_shared_libraries_are_taken_from_the_build_tree(tmp_path: Path) -> None:
    """A mid-2026 upstream build runs npm for its web UI: node_modules holds a directory
    named `lodash.sortby`, which `*.so*` matched and the install step failed on."""
    from llamaspec.engine.build import shared_libs

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "libllama.so").write_bytes(b"\x7fELF")
    (tmp_path / "bin" / "libggml.so.0.9").write_bytes(b"\x7fELF")
    (tmp_path / "bin" / "libggml.so").symlink_to("libggml.so.0.9")
    ui = tmp_path / "tools" / "ui" / "ui-src" / "node_modules"
    (ui / "lodash.sortby").mkdir(parents=True)
    (ui / "libthing.so").mkdir()  # a directory with a library's name
    (ui / "x" / "libjs.so").parent.mkdir()
    (ui / "x" / "libjs.so").write_text("")  # under node_modules: not the build's
    (tmp_path / "CMakeFiles" / "libtmp.so").parent.mkdir()
    (tmp_path / "CMakeFiles" / "libtmp.so").write_bytes(b"")
    (tmp_path / "bin" / "libnot.so.txt").write_text("")
    assert sorted(shared_libs(tmp_path)) == ["libggml.so", "libggml.so.0.9", "libllama.so"]
