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

from llamaspec.engine import build, sources
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
        build.load_artifact(dist, bad)


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
    assert proc.returncode == 2 and "LLAMASPEC_CACHE=" in proc.stderr
    assert "Traceback" not in proc.stderr


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
    assert f"--dist {dist}" in msg and "Traceback" not in proc.stderr
    assert "source:" not in proc.stdout  # nothing was fetched
    assert time.monotonic() - t0 < 60
