"""Reproducible builds without a compiler: prefix maps, flag defines, dates, comparison."""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.engine import build, rebuild
from llamaspec.engine import profiles as flags
from llamaspec.engine import reproducible as repro
from llamaspec.engine.artifact import Artifact
from llamaspec.engine.patch_queue import PatchedTree
from llamaspec.engine.sources import SourceTree
from llamaspec.engine.toolchain import Toolchain
from llamaspec.errors import LlamaspecError
from llamaspec.images import smoke

from gitrepos import make_engine

pytestmark = pytest.mark.unit
TOOLS = Toolchain("cmake", "3.25.1", "ninja", "1.11.1", "c++", "c++ (Debian 12.2.0) 12.2.0", None)


def remap(maps: list[str], path: str, debug: bool = False) -> str:
    """How GCC applies prefix maps: of the options that match, the last one given wins.
    `-fdebug-prefix-map` counts for debug info only, `-ffile-prefix-map` for both."""
    chosen = None
    for m in maps:
        opt, _, spec = m.partition("=")
        if opt == "-fdebug-prefix-map" and not debug:
            continue
        old, _, new = spec.partition("=")
        if path.startswith(old):
            chosen = new + path[len(old) :]
    return path if chosen is None else chosen


def test_maps_give_ccache_and_plain_compiles_the_same_file_names(tmp_path: Path) -> None:
    tree = tmp_path / "sources" / "llama.cpp" / "0c1e570-pypi"
    bdir = tree / build.BUILD_SUBDIR / "llamacpp-cpu-0123456789ab"
    maps = repro.path_maps(tree, bdir, ccache_relative=True)
    assert maps == [
        f"-ffile-prefix-map={tree}/=",
        "-ffile-prefix-map=../../=",
        "-ffile-prefix-map=./=",
        f"-fdebug-prefix-map={bdir}=.",
        f"-ffile-prefix-map={bdir}/=",
    ]
    # the forms one file's name takes: plain compile, ccache with base_dir at the tree
    assert remap(maps, f"{tree}/ggml/src/ggml.c") == "ggml/src/ggml.c"
    assert remap(maps, "../../ggml/src/ggml.c") == "ggml/src/ggml.c"
    assert remap(maps, f"{tree}/src/models/llama.cpp") == "src/models/llama.cpp"  # unity include
    assert remap(maps, f"{bdir}/common/build-info.cpp") == "common/build-info.cpp"
    assert remap(maps, "common/build-info.cpp") == "common/build-info.cpp"  # ccache's form
    assert remap(maps, f"{bdir}/gen.h") == remap(maps, "./gen.h") == "gen.h"  # -I<build>, -I.
    assert remap(maps, str(bdir), debug=True) == "."  # DW_AT_comp_dir
    assert remap(maps, "/usr/include/stdio.h") == "/usr/include/stdio.h"
    # another tree at another depth, built without ccache: the same names
    other_tree, other_build = tmp_path / "x" / "tree", tmp_path / "y" / "z" / "build"
    other = repro.path_maps(other_tree, other_build, ccache_relative=False)
    assert len(other) == 3 and not any("../" in m for m in other)
    assert remap(other, f"{other_tree}/ggml/src/ggml.c") == "ggml/src/ggml.c"
    assert remap(other, f"{other_build}/common/build-info.cpp") == "common/build-info.cpp"


def test_a_symlinked_tree_is_mapped_as_given_and_as_resolved(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    maps = repro.path_maps(tmp_path / "link", tmp_path / "link" / "b", ccache_relative=False)
    assert f"-ffile-prefix-map={tmp_path / 'link'}/=" in maps
    assert f"-ffile-prefix-map={real}/=" in maps
    assert repro.needles(tmp_path / "link") == sorted([str(tmp_path / "link"), str(real)])


def test_manifest_shows_the_maps_without_this_machines_paths(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    bdir = tree / ".llamaspec-build" / "id"
    shown = repro.shown(repro.path_maps(tree, bdir, True), tree, bdir)
    assert shown == [
        "-ffile-prefix-map=<source>/=",
        "-ffile-prefix-map=../../=",
        "-ffile-prefix-map=./=",
        "-fdebug-prefix-map=<build>=.",
        "-ffile-prefix-map=<build>/=",
    ]
    assert str(tmp_path) not in json.dumps(shown)


def test_flag_defines_keep_the_users_flags_and_quote_paths(tmp_path: Path) -> None:
    spaced = tmp_path / "my tree"
    maps = repro.path_maps(spaced, spaced / "b", False)
    user = [flags.parse_define("CMAKE_CXX_FLAGS=-O2 -g", "--define")]
    out = {d.name: d for d in repro.flag_defines(user, maps, {"CFLAGS": "-pipe"})}
    cxx, c = out["CMAKE_CXX_FLAGS"], out["CMAKE_C_FLAGS"]
    assert cxx.value.startswith("-O2 -g ") and c.value.startswith("-pipe ")
    assert shlex.split(cxx.value)[2:] == maps  # a path with a space stays one argument
    assert cxx.origin == f"--define + {repro.ORIGIN}" and c.origin == f"$CFLAGS + {repro.ORIGIN}"
    assert cxx.key == f"-O2 -g <{repro.MAPS_VERSION}>" and str(tmp_path) not in c.key
    merged = repro.with_flags([*user, flags.parse_define("GGML_NATIVE=OFF", "cli")], [cxx, c])
    assert [d.name for d in merged] == ["GGML_NATIVE", "CMAKE_CXX_FLAGS", "CMAKE_C_FLAGS"]
    assert [d for d in merged if d.name == "CMAKE_CXX_FLAGS"] == [cxx]


def _aid(defines: list[flags.Define]) -> str:
    src = SourceTree(Path("/x"), "llama.cpp", "a" * 40, "git", "d", False, "k")
    tree = PatchedTree(src, Path("/x"), ())
    return build.artifact_id(make_engine("a" * 40), tree, "cpu", defines, TOOLS)


def test_artifact_id_sees_the_maps_by_version_not_by_path(tmp_path: Path) -> None:
    base = flags.merge("llama.cpp", "cpu", [])

    def with_maps(tree: Path, env: dict[str, str]) -> str:
        maps = repro.path_maps(tree, tree / "b", True)
        return _aid(repro.with_flags(base, repro.flag_defines(base, maps, env)))

    assert with_maps(tmp_path / "a", {}) == with_maps(tmp_path / "other" / "c", {})
    assert with_maps(tmp_path / "a", {}) != with_maps(tmp_path / "a", {"CXXFLAGS": "-O1"})
    assert with_maps(tmp_path / "a", {}) != _aid(base)  # the maps change the binary


def test_native_unless_turned_off() -> None:
    assert repro.is_native(flags.merge("llama.cpp", "cpu", []))
    assert not repro.is_native(flags.merge("llama.cpp", "cpu", [], variants=["portable"]))
    off = [flags.parse_define("GGML_NATIVE=OFF", "--define")]
    assert not repro.is_native(flags.merge("ik_llama.cpp", "cpu", off))
    assert repro.is_native([])  # ggml's own default


def test_source_date_epoch_from_the_pin_date_or_the_commit(tmp_path: Path) -> None:
    engine = make_engine("a" * 40)  # pin_date 2026-01-01
    when = int(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp())
    assert repro.source_date_epoch(engine, "a" * 40, tmp_path)[0] == when
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_COMMITTER_DATE": "2025-03-04T05:06:07+0000",
    }
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()
    epoch, where = repro.source_date_epoch(engine, sha, repo)
    assert epoch == int(dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.timezone.utc).timestamp())
    assert sha[:12] in where
    assert repro.source_date_epoch(engine, None, repo)[0] == 0


def _artifact(root: Path, lib: bytes = b"lib", path_in_binary: str = "") -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "bin" / "llama-server").write_bytes(b"\x7fELF" + path_in_binary.encode())
    (root / "lib" / "libllama.so.0.5.0").write_bytes(lib)
    (root / "lib" / "libllama.so.0").symlink_to("libllama.so.0.5.0")
    return root


def test_compare_names_each_differing_file_and_link(tmp_path: Path) -> None:
    a = repro.shipped(_artifact(tmp_path / "a"))
    b = repro.shipped(_artifact(tmp_path / "b", lib=b"other"))
    assert a["lib/libllama.so.0"] == "->libllama.so.0.5.0"
    assert repro.compare(a, a) == []
    assert repro.compare(a, b) == ["lib/libllama.so.0.5.0"]
    del b["lib/libllama.so.0"]
    assert repro.compare(a, b) == ["lib/libllama.so.0", "lib/libllama.so.0.5.0"]


def test_scan_finds_build_host_paths_in_the_bytes(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    leaky = _artifact(tmp_path / "a", path_in_binary=f"{tree}/ggml/src/ggml.c")
    assert repro.scan(leaky, repro.needles(tree)) == {"bin/llama-server": [str(tree)]}
    clean = _artifact(tmp_path / "b", path_in_binary="ggml/src/ggml.c")
    assert repro.scan(clean, repro.needles(tree)) == {}


def test_hint_names_diffoscope_or_how_to_get_it(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert "/usr/bin/diffoscope " in repro.hint(a, b, ["lib/x.so"], "/usr/bin/diffoscope")
    text = repro.hint(a, b, ["lib/x.so"], None)
    assert "pip install diffoscope" in text and f"cmp -l {a / 'lib/x.so'}" in text


def test_install_links_dynamic_backends_into_bin_and_records_every_sha256(tmp_path: Path) -> None:
    """GGML_BACKEND_DL builds: ggml looks for libggml-cpu-*.so next to the executable."""
    bdir = tmp_path / "build"
    (bdir / "bin").mkdir(parents=True)
    server = bdir / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 1 (build 1, commit aaaaaaa)'\n")
    server.chmod(0o755)
    (bdir / "bin" / "libggml-cpu-haswell.so").write_bytes(b"module")
    (bdir / "bin" / "libggml-base.so.0.9").write_bytes(b"base")
    (bdir / "bin" / "libggml-base.so").symlink_to("libggml-base.so.0.9")
    engine = make_engine("a" * 40)
    manifest = {"artifact_id": "x", "commit": "a" * 40}
    out = tmp_path / "dist" / "x"
    art = build.install(bdir, engine, out, manifest, Console(quiet=True), backend_dl=True)
    assert os.readlink(out / "bin" / "libggml-cpu-haswell.so") == "../lib/libggml-cpu-haswell.so"
    assert (out / "bin" / "libggml-cpu-haswell.so").read_bytes() == b"module"
    assert not (out / "bin" / "libggml-base.so").exists()  # a linked library, not a backend
    files = art.manifest["files_sha256"]
    assert files["bin/libggml-cpu-haswell.so"] == "->../lib/libggml-cpu-haswell.so"
    assert files["bin/llama-server"] == art.manifest["binary_sha256"]
    assert set(files) == set(repro.shipped(out))
    plain = build.install(bdir, engine, tmp_path / "dist" / "y", manifest, Console(quiet=True))
    assert not (plain.path / "bin" / "libggml-cpu-haswell.so").exists()


def _plain(path: Path) -> PatchedTree:
    return PatchedTree(SourceTree(path, "llama.cpp", None, "local", "", False, ""), path, ())


def test_a_native_build_is_not_rebuilt_for_the_check(tmp_path: Path) -> None:
    art = Artifact("x", tmp_path, {"reproducible": repro.NATIVE}, True)
    console = Console(record=True, width=200)
    defines = tuple(flags.merge("llama.cpp", "cpu", []))
    built = build.Built(
        art, make_engine("a" * 40), _plain(tmp_path), defines, tmp_path / "b", TOOLS, None
    )
    got = rebuild.check(built, console)
    assert got is art
    text = console.export_text()
    assert "host-specific (GGML_NATIVE=ON)" in text and "--variant portable" in text
    assert not list(tmp_path.iterdir())


def test_an_equal_recorded_check_is_not_run_again(tmp_path: Path) -> None:
    record = {"checked": True, "equal": True, "host_paths": {}, "sha256_a": "ab" * 32}
    art = Artifact("x", tmp_path, {"reproducible": record}, True)
    console = Console(record=True, width=200)
    portable = flags.merge("llama.cpp", "cpu", [], variants=["portable"])
    built = build.Built(
        art, make_engine("a" * 40), _plain(tmp_path), tuple(portable), tmp_path, TOOLS, None
    )
    assert rebuild.check(built, console) is art
    text = console.export_text()
    assert "reproducible: equal" in text and "ab" * 32 in text


class _LocalTool:
    """Runs an image's command on this machine, with `root` standing for /opt/llamaspec."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run_argv(self, ctr: str, argv: list[str], mounts=(), env=None, network=False) -> list[str]:
        return [a.replace(smoke.ROOT, str(self.root)) for a in argv]


def test_image_files_must_match_their_manifest_and_the_host_build(tmp_path: Path) -> None:
    image = _artifact(tmp_path / "image")
    host = _artifact(tmp_path / "dist" / "llamacpp-cpu-0123456789ab")
    manifest = {"artifact_id": host.name, "files_sha256": repro.shipped(image)}
    (host / "manifest.json").write_text(json.dumps({**manifest, "binary_sha256": "x"}))
    tool = _LocalTool(image)
    got = smoke.check_files(tool, "ctr", manifest, "img", tmp_path / "dist")  # type: ignore[arg-type]
    assert got["checked"] and got["files"] == 3 and got["host"]["equal"]
    (image / "lib" / "libllama.so.0.5.0").write_bytes(b"changed")
    with pytest.raises(LlamaspecError, match=r"libllama.so.0.5.0 in /opt/llamaspec do not match"):
        smoke.check_files(tool, "ctr", manifest, "img", None)  # type: ignore[arg-type]
    manifest["files_sha256"] = repro.shipped(image)  # a host build with other bytes
    with pytest.raises(LlamaspecError, match="other bytes than the host build"):
        smoke.check_files(tool, "ctr", manifest, "img", tmp_path / "dist")  # type: ignore[arg-type]
    assert smoke.check_files(tool, "ctr", {}, "img", None) == {"checked": False}


def test_a_tree_may_ignore_llamaspecs_own_flags_but_not_the_users() -> None:
    out = "Manually-specified variables were not used by the project:\n\n    CMAKE_C_FLAGS\n\n"
    ours = repro.flag_defines([], ["-ffile-prefix-map=/t/="], {})
    flags.check_unused(out, ours, [], {})  # a C++-only project: no C flags to carry
    users = repro.flag_defines([flags.parse_define("CMAKE_C_FLAGS=-O1", "--define")], [], {})
    with pytest.raises(LlamaspecError, match=r"CMAKE_C_FLAGS \(from --define \+ llamaspec"):
        flags.check_unused(out, users, [], {})


def _manifest(native: str = "OFF") -> dict:
    maps = repro.flag_defines([], ["-ffile-prefix-map=/t/="], {"CXXFLAGS": "-O2 -g"})
    return {
        "defines": [
            {"name": "CMAKE_BUILD_TYPE", "value": "Release", "origin": "profile", "key": None},
            {"name": "GGML_NATIVE", "value": native, "origin": "variant portable", "key": None},
            *({**vars(d)} for d in maps),
        ]
    }


def test_the_baseline_drops_llamaspecs_flags_but_keeps_the_users() -> None:
    from llamaspec.maint.repro_bench import baseline_defines

    assert baseline_defines(_manifest()) == [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=OFF",
        "-DCMAKE_CXX_FLAGS=-O2 -g",  # the user's $CXXFLAGS, without the prefix map
    ]


def test_the_reproducibility_bench_refuses_a_native_build(tmp_path: Path) -> None:
    from llamaspec.engine.artifact import Artifact
    from llamaspec.maint.repro_bench import bench_reproducible

    art = Artifact("llamacpp-cpu-0123456789ab", tmp_path, _manifest("ON"), False)
    with pytest.raises(LlamaspecError, match="host-specific by design.*--variant portable"):
        bench_reproducible(art, tmp_path / "reports", Console())
    assert not (tmp_path / "reports").exists()


def test_the_reproducibility_report_explains_each_baseline_difference() -> None:
    from llamaspec.maint.repro_bench import markdown

    same, a, b = "5" * 64, "a" * 64, "b" * 64
    report = {
        "artifact_id": "llamacpp-cpu-0123456789ab",
        "engine": "llama.cpp",
        "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        "variants": ["portable"],
        "toolchain": {"compiler": "c++ 12.2.0", "cmake": "3.25.1"},
        "machine": {"description": "Some CPU, 2 cores; no GPU"},
        "date": "2026-11-23T09:00:00+00:00",
        "equal": True,
        "baseline": {
            "how": "plain cmake",
            "seconds": [350.0, 352.5],
            "files_compared": 2,
            "differing": ["lib/libggml-base.so"],
            "sha256": {"bin/llama-server": [same, same], "lib/libggml-base.so": [a, b]},
            "host_paths": {"A": {"lib/libggml-base.so": ["/x/tree"]}, "B": {}},
            "explained": {"lib/libggml-base.so": "build-host paths in its bytes"},
        },
        "llamaspec": {
            "first_build": "cold",
            "seconds_total": 700.0,
            "inputs": {
                "source_date_epoch": 1,
                "source_date_from": "pin_date",
                "path_maps": ["-ffile-prefix-map=<source>/="],
            },
            "record": {
                "equal": True,
                "sha256_a": same,
                "sha256_b": same,
                "files_compared": 2,
                "differing": [],
                "host_paths": {},
            },
            "files_sha256": {"bin/llama-server": same},
        },
    }
    md = markdown(report)
    assert "**Verdict: equal.**" in md and f"`{same}` and `{same}`" in md
    assert "1 of 2 files differ" in md
    assert "| `lib/libggml-base.so` | `aaaaaaaaaaaaaaaa…` | `bbbbbbbbbbbbbbbb…` | build-host " in md
    assert "(1 distinct paths)" in md and "| `bin/llama-server` | `5555" in md
    assert "`-ffile-prefix-map=<source>/=`" in md
