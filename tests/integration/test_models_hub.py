"""Downloads and header checks against a local server speaking the hub's protocol, driven
through the real CLI and the real `huggingface_hub` client (HF_ENDPOINT)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ggufs import vocab, write_gguf
from hubserver import GOOD_TOKEN, Hub

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _model(repo: str, file: str, **extra: object) -> dict:
    return {"repo": repo, "file": file, "tokenizer": "test", "license": "mit", **extra}


class Env:
    """A project root with its own models.yaml, an HF cache and a hub, all in tmp."""

    def __init__(self, tmp: Path, hub: Hub) -> None:
        self.root = tmp / "project"
        self.root.mkdir()
        self.hf_home = tmp / "hf"
        self.user_lock = tmp / "data" / "llamaspec.lock"  # pulls pin here, not in the root
        self.hub = hub
        self.models: dict[str, dict] = {}
        self.pairs: dict[str, dict] = {}
        self.env = {
            **os.environ,
            "LLAMASPEC_ROOT": str(self.root),
            "LLAMASPEC_CACHE": str(tmp / "cache"),
            "LLAMASPEC_DATA": str(tmp / "data"),
            "HF_HOME": str(self.hf_home),
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            "COLUMNS": "200",
        }
        self.env.pop("HF_TOKEN", None)

    def write(self) -> None:
        (self.root / "models.yaml").write_text(
            yaml.safe_dump({"models": self.models, "pairs": self.pairs})
        )

    def cli(
        self, *args: str, pre: tuple[str, ...] = (), timeout: int = 600, **env: str
    ) -> subprocess.CompletedProcess:
        self.write()
        return subprocess.run(
            [*pre, sys.executable, "-m", "llamaspec.cli", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            env={**self.env, **env},
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str) -> subprocess.Popen:
        self.write()
        return subprocess.Popen(
            [sys.executable, "-m", "llamaspec.cli", *args],
            cwd=self.root,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def blobs(self) -> list[Path]:
        return [p for p in self.hf_home.rglob("blobs/*") if p.is_file()]


@pytest.fixture
def env(tmp_path: Path):
    with Hub() as hub:
        yield Env(tmp_path, hub)


def _pair(
    env: Env, tmp: Path, *, draft_tokens: list[str] | None = None, target_bytes: int = 1 << 20
) -> None:
    target = write_gguf(tmp / "t.gguf", vocab(300), payload_bytes=target_bytes)
    draft = write_gguf(tmp / "d.gguf", draft_tokens or vocab(300), payload_bytes=1 << 16)
    env.hub.add("org/target-GGUF", "target-q8_0.gguf", target)
    env.hub.add("org/draft-GGUF", "draft-q8_0.gguf", draft)
    env.models["tgt"] = _model("org/target-GGUF", "target-q8_0.gguf")
    env.models["dft"] = _model("org/draft-GGUF", "draft-q8_0.gguf")
    env.pairs["p"] = {"target": "tgt", "draft": "dft"}


def test_pull_checks_downloads_verifies_and_locks(env: Env, tmp_path: Path) -> None:
    _pair(env, tmp_path)
    proc = env.cli("models", "pull", "p")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "vocab size" in out and "within 128, ok" in out
    lock = yaml.safe_load(env.user_lock.read_text())
    assert not (env.root / "llamaspec.lock").exists()  # no user command writes the project's
    target_sha = env.hub.repos["org/target-GGUF"].files["target-q8_0.gguf"].sha256
    assert lock["models"]["tgt"]["sha256"] == {"target-q8_0.gguf": target_sha}
    assert lock["models"]["tgt"]["revision"] == env.hub.repos["org/target-GGUF"].commit
    assert len(env.blobs()) == 2
    served = len(env.hub.content_gets())
    again = env.cli("models", "pull", "p")
    assert again.returncode == 0, again.stdout + again.stderr
    # Second pull: the header check reads the local files, the download is a cache hit.
    assert len(env.hub.content_gets()) == served


def test_header_check_uses_range_reads_and_refuses_before_download(
    env: Env, tmp_path: Path
) -> None:
    _pair(env, tmp_path, draft_tokens=vocab(300 + 129), target_bytes=16 << 20)
    proc = env.cli("models", "pull", "p")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    msg = " ".join(proc.stderr.split())
    assert "draft vocab 429 vs target 300: difference 129, over the 128 allowed" in msg
    assert "Nothing was downloaded" in msg
    gets = env.hub.content_gets()
    assert gets and all(g.range and g.range.startswith("bytes=0-") for g in gets)
    target_gets = [g for g in gets if "target" in g.path]
    assert sum(g.sent for g in target_gets) < (tmp_path / "t.gguf").stat().st_size // 2
    assert env.blobs() == []


def test_interrupted_download_resumes(env: Env, tmp_path: Path) -> None:
    big = write_gguf(tmp_path / "big.gguf", vocab(50), payload_bytes=24 << 20)
    env.hub.add("org/big-GGUF", "big.gguf", big)
    env.models["big"] = _model("org/big-GGUF", "big.gguf")
    env.pairs["big-ngram"] = {"target": "big", "spec": "ngram"}
    env.hub.throttle = 8 << 20
    proc = env.popen("models", "pull", "big-ngram")
    deadline = time.monotonic() + 60
    partial: list[Path] = []
    while time.monotonic() < deadline:
        partial = [p for p in env.hf_home.rglob("*.incomplete") if p.stat().st_size > 4 << 20]
        if partial:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert partial, "the download never started"
    had = partial[0].stat().st_size
    env.hub.throttle = None
    done = env.cli("models", "pull", "big-ngram")
    assert done.returncode == 0, done.stdout + done.stderr
    resumed = [g for g in env.hub.content_gets() if g.range and not g.range.startswith("bytes=0-")]
    assert resumed, [g.range for g in env.hub.content_gets()]
    start = int(resumed[-1].range.removeprefix("bytes=").split("-")[0])
    assert start >= had - (1 << 20)
    assert resumed[-1].sent == big.stat().st_size - start


def test_dropped_connection_is_retried_and_verified(env: Env, tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "x.gguf", vocab(50), payload_bytes=4 << 20)
    env.hub.add("org/x-GGUF", "x.gguf", f)
    env.models["x"] = _model("org/x-GGUF", "x.gguf")
    env.pairs["x-ngram"] = {"target": "x", "spec": "ngram"}
    env.hub.drop_after = 1 << 20
    proc = env.cli("models", "pull", "x-ngram")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gets = env.hub.content_gets()
    assert len(gets) == 2 and gets[0].sent == 1 << 20, gets
    (blob,) = env.blobs()
    assert blob.read_bytes() == f.read_bytes()


def test_corrupt_content_is_removed_and_reported(env: Env, tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf", vocab(50))
    bad = write_gguf(tmp_path / "bad.gguf", vocab(51))
    good_sha = env.hub.add("org/y-GGUF", "y.gguf", good).sha256
    # The hub advertises the right sha256 but serves other bytes.
    env.hub.add("org/y-GGUF", "y.gguf", bad, etag=good_sha)
    env.models["y"] = _model("org/y-GGUF", "y.gguf", sha256=good_sha)
    env.pairs["y-ngram"] = {"target": "y", "spec": "ngram"}
    proc = env.cli("models", "pull", "y-ngram")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    msg = " ".join(proc.stderr.split())
    assert f"expected {good_sha}" in msg and "corrupt file was removed" in msg
    assert env.blobs() == []
    assert not list(env.hf_home.rglob("snapshots/*/y.gguf"))


def test_catalog_sha_differs_from_hub(env: Env, tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "z.gguf", vocab(50))
    env.hub.add("org/z-GGUF", "z.gguf", f)
    env.models["z"] = _model("org/z-GGUF", "z.gguf", sha256="0" * 64)
    env.pairs["z-ngram"] = {"target": "z", "spec": "ngram"}
    proc = env.cli("models", "pull", "z-ngram")
    assert proc.returncode == 2
    assert "changed upstream or the catalog is wrong" in " ".join(proc.stderr.split())
    assert env.hub.content_gets() == []


@pytest.mark.parametrize(
    ("repo", "file", "message"),
    [
        ("org/w-GGUF", "missing.gguf", "missing.gguf is not in org/w-GGUF"),
        ("org/nope-GGUF", "w.gguf", "Repository org/nope-GGUF was not found"),
    ],
)
def test_missing_file_or_repo(env: Env, tmp_path: Path, repo: str, file: str, message: str) -> None:
    env.hub.add("org/w-GGUF", "w.gguf", write_gguf(tmp_path / "w.gguf", vocab(50)))
    env.models["w"] = _model(repo, file)
    env.pairs["w-ngram"] = {"target": "w", "spec": "ngram"}
    proc = env.cli("models", "pull", "w-ngram")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_gated_repo_needs_a_token(env: Env, tmp_path: Path) -> None:
    env.hub.add("org/g-GGUF", "g.gguf", write_gguf(tmp_path / "g.gguf", vocab(50)), gated=True)
    env.models["g"] = _model("org/g-GGUF", "g.gguf")
    env.pairs["g-ngram"] = {"target": "g", "spec": "ngram"}
    proc = env.cli("models", "pull", "g-ngram")
    assert proc.returncode == 2
    msg = " ".join(proc.stderr.split())
    assert "gated repository" in msg and "HF_TOKEN" in msg
    ok = env.cli("models", "pull", "g-ngram", HF_TOKEN=GOOD_TOKEN)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_not_enough_disk_stops_before_download(env: Env, tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "h.gguf", vocab(50))
    env.hub.add("org/h-GGUF", "h.gguf", f, size=1 << 60)  # the hub says 1 EiB
    env.models["h"] = _model("org/h-GGUF", "h.gguf")
    env.pairs["h-ngram"] = {"target": "h", "spec": "ngram"}
    proc = env.cli("models", "pull", "h-ngram")
    assert proc.returncode == 2
    assert "Not enough disk space" in " ".join(proc.stderr.split())
    assert env.hub.content_gets() == []


def test_real_gemma_header_over_http(env: Env, gemma_path: Path) -> None:
    """The real 253 MB Gemma file judged from its header over HTTP, against the local copy."""
    env.hub.add("google/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf", gemma_path)
    env.models["remote"] = _model("google/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf")
    env.models["local"] = {
        "source": "embedded",
        "file": "gemma-3-270m-q4_k_m.gguf",
        "tokenizer": "gemma3",
        "license": "gemma",
    }
    # One file as its own draft: kept only to prove the check, so it says plumbing.
    env.pairs["mixed"] = {"target": "remote", "draft": "local", "plumbing": True}
    proc = env.cli("models", "check", "mixed")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plumbing pair" in " ".join(proc.stdout.split())
    assert "ids 5..262143 identical" in proc.stdout
    sent = sum(g.sent for g in env.hub.content_gets())
    assert 0 < sent < gemma_path.stat().st_size // 10


def test_split_gguf_pulls_every_part(env: Env, tmp_path: Path) -> None:
    first = write_gguf(tmp_path / "s1.gguf", vocab(300), payload_bytes=1 << 16)
    second = tmp_path / "s2.gguf"
    second.write_bytes(b"GGUF" + bytes(range(256)) * 512)
    names = [f"Q4_K_M/big-Q4_K_M-0000{i}-of-00002.gguf" for i in (1, 2)]
    env.hub.add("org/split-GGUF", names[0], first)
    env.hub.add("org/split-GGUF", names[1], second)
    env.models["split"] = _model("org/split-GGUF", names[0])
    env.pairs["split-ngram"] = {"target": "split", "spec": "ngram"}
    proc = env.cli("models", "pull", "split-ngram")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lock = yaml.safe_load(env.user_lock.read_text())
    assert list(lock["models"]["split"]["sha256"]) == names
    assert len(env.blobs()) == 2
    assert "big-Q4_K_M-00001-of-00002.gguf" in proc.stdout


@pytest.mark.parametrize("where", ["payload", "header"])
def test_corrupt_cached_model_is_detected_and_downloaded_again(
    env: Env, tmp_path: Path, where: str
) -> None:
    """A cached file is verified on use: a damaged one is removed and fetched again, and
    llamaspec.lock keeps the true sha256 (not the damaged file's)."""
    f = write_gguf(tmp_path / "c.gguf", vocab(50), payload_bytes=1 << 20)
    env.hub.add("org/c-GGUF", "c.gguf", f)
    env.models["c"] = _model("org/c-GGUF", "c.gguf")
    env.pairs["c-ngram"] = {"target": "c", "spec": "ngram"}
    first = env.cli("models", "pull", "c-ngram")
    assert first.returncode == 0, first.stdout + first.stderr
    lock_before = env.user_lock.read_text()
    (blob,) = env.blobs()
    data = bytearray(blob.read_bytes())
    at = 8 if where == "header" else len(data) // 2
    data[at : at + 100] = bytes(b ^ 0xFF for b in data[at : at + 100])
    blob.write_bytes(bytes(data))
    gets = len(env.hub.content_gets())
    again = env.cli("models", "pull", "c-ngram")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "corrupt" in again.stdout and "downloading it again" in " ".join(again.stdout.split())
    (blob,) = env.blobs()
    assert blob.read_bytes() == f.read_bytes()
    assert env.user_lock.read_text() == lock_before
    full = [g for g in env.hub.content_gets()[gets:] if not g.range]
    assert len(full) == 1 and full[0].sent == f.stat().st_size


def test_a_new_file_is_hashed_once(env: Env, tmp_path: Path) -> None:
    """One sha256 record per downloaded file: the .incomplete file is hashed, then renamed
    with its digest remembered, not hashed again under its final name."""
    f = write_gguf(tmp_path / "o.gguf", vocab(50), payload_bytes=1 << 20)
    env.hub.add("org/o-GGUF", "o.gguf", f)
    env.models["o"] = _model("org/o-GGUF", "o.gguf")
    env.pairs["o-ngram"] = {"target": "o", "spec": "ngram"}
    proc = env.cli("models", "pull", "o-ngram")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stamps = list((tmp_path / "cache" / "sha256").iterdir())
    assert len(stamps) == 1 and not stamps[0].name.endswith("incomplete")
    assert stamps[0].read_text() == env.hub.repos["org/o-GGUF"].files["o.gguf"].sha256


@pytest.mark.parametrize(
    ("commit", "etag"),
    [("../../../escaped", None), ("a" * 40, "../../escaped"), ("A" * 40, None), ("a" * 39, None)],
)
def test_server_ids_are_checked_before_they_become_paths(
    env: Env, tmp_path: Path, commit: str, etag: str | None
) -> None:
    f = write_gguf(tmp_path / "e.gguf", vocab(50))
    env.hub.add("org/e-GGUF", "e.gguf", f, etag=etag)
    env.hub.repos["org/e-GGUF"].commit = commit
    env.models["e"] = _model("org/e-GGUF", "e.gguf")
    env.pairs["e-ngram"] = {"target": "e", "spec": "ngram"}
    proc = env.cli("models", "pull", "e-ngram")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    msg = " ".join(proc.stderr.split())
    assert "refuses it" in msg and "Traceback" not in proc.stderr
    assert env.blobs() == [] and not list(tmp_path.rglob("escaped*"))
    assert env.hub.content_gets() == []


def test_mtp_pair_without_heads_is_refused_from_the_remote_header(env: Env, tmp_path: Path) -> None:
    f = write_gguf(tmp_path / "nomtp.gguf", vocab(50), payload_bytes=8 << 20)
    env.hub.add("org/nomtp-GGUF", "nomtp.gguf", f)
    env.models["nomtp"] = _model("org/nomtp-GGUF", "nomtp.gguf", mtp=True)
    env.pairs["nomtp-mtp"] = {"target": "nomtp", "spec": "mtp"}
    proc = env.cli("models", "pull", "nomtp-mtp")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "has none: no tensor named *nextn*" in " ".join(proc.stderr.split())
    gets = env.hub.content_gets()
    assert gets and all(g.range and g.range.startswith("bytes=0-") for g in gets)
    assert sum(g.sent for g in gets) < f.stat().st_size // 2
    assert env.blobs() == []


def test_a_changed_cached_file_is_not_used_until_pulled_again(env: Env, tmp_path: Path) -> None:
    _pair(env, tmp_path)
    assert env.cli("models", "pull", "p").returncode == 0
    local = env.cli("models", "check", "p")
    assert local.returncode == 0 and "range read" not in local.stdout  # verified local files
    target = next(b for b in env.blobs() if b.stat().st_size > 1 << 20)
    with target.open("r+b") as f:
        f.seek(target.stat().st_size - 100)
        f.write(b"\0" * 100)
    again = env.cli("models", "check", "p")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "target-q8_0.gguf (range read)" in " ".join(again.stdout.split())


# a network namespace of its own, loopback up (the servers bench starts listen there) and no
# other interface: the hub this test runs is not reachable from inside, nor is anything else
OFFLINE = ("unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "offline")


def test_a_pulled_pair_serves_benches_and_pulls_offline(
    env: Env, tmp_path: Path, gemma_path: Path, upstream_artifact
) -> None:
    """A pair pulled and verified once is used with no network at all (a network namespace
    without one) and with HF_HUB_OFFLINE=1; a pair that is not in the cache, offline, is one
    paragraph that says what to do."""
    env.hub.add("org/gemma-GGUF", "gemma-3-270m-q4_k_m.gguf", gemma_path)
    env.models["g"] = _model("org/gemma-GGUF", "gemma-3-270m-q4_k_m.gguf", tokenizer="gemma3")
    env.pairs["g-ngram"] = {"target": "g", "spec": "ngram"}
    (env.root / "engines.yaml").write_text((ROOT / "engines.yaml").read_text())
    shutil.copytree(ROOT / "patches", env.root / "patches")
    (env.root / "recipes").mkdir()
    (env.root / "recipes" / "g-ngram.yaml").write_text(
        yaml.safe_dump(
            {
                "pair": "g-ngram",
                "description": "the hub's Gemma with ngram-mod",
                "spec": {"types": ["ngram-mod"]},
                "server": {"ctx": 4096, "parallel": 1},
            }
        )
    )
    assert env.cli("models", "pull", "g-ngram").returncode == 0
    asked = len(env.hub.log)
    art = ["--artifact", upstream_artifact.id, "--dist", str(upstream_artifact.path.parent)]

    pull = env.cli("models", "pull", "g-ngram", pre=OFFLINE)
    assert pull.returncode == 0, pull.stdout + pull.stderr
    assert "g ok (verified in the cache)" in pull.stdout
    show = env.cli("recipe", "show", "g-ngram", *art, pre=OFFLINE)
    assert show.returncode == 0 and "--spec-type ngram-mod" in show.stdout, show.stderr
    assert "snapshots" in show.stdout  # the cached file's path, not a download
    bench = env.cli(
        "bench", "g-ngram", *art, "--workload", "copy", "--repetitions", "1",
        "--concurrency", "1", "--no-cost-model", "--reports", str(tmp_path / "reports"),
        pre=OFFLINE,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout + bench.stderr
    stem = f"bench-g-ngram-{upstream_artifact.id}.json"
    report = json.loads((tmp_path / "reports" / stem).read_text())
    assert report["workloads"][0]["summary"]["spec_tps_median"] > 0
    flagged = env.cli("models", "pull", "g-ngram", HF_HUB_OFFLINE="1")
    assert flagged.returncode == 0, flagged.stdout + flagged.stderr
    assert len(env.hub.log) == asked  # not one request, in or out of the namespace

    # a pair never pulled: offline it is one paragraph, with either kind of offline
    _pair(env, tmp_path)
    for pre, extra, says in (
        ((), {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set and org/target-GGUF/"),
        (OFFLINE, {}, "Could not reach"),
    ):
        proc = env.cli("models", "pull", "p", pre=pre, **extra)
        assert proc.returncode != 0 and says in proc.stderr, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 6
