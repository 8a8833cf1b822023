"""The CPU image for upstream, built for real with buildah from docker/Dockerfile.cpu.

No registry is reachable: the Debian base is made with debootstrap and imported under the
Dockerfile's default base name. The image the tests inspect is built around the artifact
the suite already built (`--from-artifact`, nothing compiled again; portable, as every
image is); it must carry that artifact (id, manifest, binary), run on an emulated older
CPU, pass the smoke test from inside the image and stay within the size budget. One test
builds the image the publishing workflow builds, compiling in the image's build stage, and
checks it makes the same artifact as the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec.errors import LlamaspecError
from llamaspec.images import specs as images
from llamaspec.images import tools
from llamaspec.images.base import make_base_image
from llamaspec.runtime.client import base_args, running

from helpers import llamaspec

pytestmark = pytest.mark.integration
BUILDAH = tools.Buildah()
# Differ between any two builds: when and how long.
VOLATILE = {"built_at", "build_seconds"}


@pytest.fixture(scope="module")
def base_image() -> str:
    base = images.BASES["cpu"][0]
    if not BUILDAH.image_exists(base):
        make_base_image("bookworm", base, Console())
    return base


def build_image(tmp_path_factory, *args: str) -> dict:
    out = tmp_path_factory.mktemp("image") / "build.json"
    proc = llamaspec("docker", "build", "--tool", "buildah", "--out", str(out), *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    print(f"image build: {record['seconds']}")
    return record


@pytest.fixture(scope="module")
def cpu_image(base_image, upstream_artifact, tmp_path_factory) -> dict:
    """The image around the suite's build, which is `portable` as every image is."""
    dist = str(upstream_artifact.path.parent)
    return build_image(tmp_path_factory, "--from-artifact", upstream_artifact.id, "--dist", dist)


@contextlib.contextmanager
def mounted(ref: str) -> Iterator[Path]:
    """The image's root file system (a working container, mounted), removed afterwards."""
    ctr = subprocess.run(
        ["buildah", "from", "--pull-never", ref], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        root = subprocess.run(
            ["buildah", "mount", ctr], capture_output=True, text=True, check=True
        ).stdout.strip()
        yield Path(root)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False, timeout=120)


def test_image_server_answers_on_an_older_cpu(cpu_image, gemma_path, tmp_path: Path) -> None:
    """The image's own llama-server and libraries (qemu's -L makes the image's root the
    program's /, its loader and glibc included) on an emulated Nehalem (SSE4.2, no AVX):
    ggml picks its sse42 CPU backend at run time and the server answers a completion.
    A GGML_NATIVE=ON build of this pin stops there with an illegal instruction
    (reports/portable-*.md, `llamaspec bench-portable`)."""
    log = tmp_path / "emulated.log"
    with mounted(cpu_image["tags"][0]) as root:
        server = root / "opt" / "llamaspec" / "bin" / "llama-server"
        emulator = ["qemu-x86_64", "-cpu", "Nehalem", "-L", str(root)]
        args = [*base_args(gemma_path, ctx=512), "-t", "2", "-lv", "4"]
        with running(server, args, log, ready_timeout=600, prefix=emulator) as srv:
            reply = srv.post("/completion", {"prompt": "The capital of France is",
                                             "n_predict": 8, "temperature": 0})  # fmt: skip
    text = log.read_text(errors="replace")
    assert reply["content"].strip() and reply["timings"]["predicted_n"] == 8, reply
    assert re.search(r"loaded CPU backend from \S+/libggml-cpu-sse42\.so", text), text[-2000:]
    # the features the loaded CPU backend uses, as ggml reports them: none of AVX's
    (features,) = re.findall(r"system_info: .*", text)
    assert "SSSE3 = 1" in features and "AVX" not in features, features


def test_in_image_build_makes_the_same_artifact(
    base_image, upstream_artifact, tmp_path_factory
) -> None:
    """What the publishing workflow builds: llamaspec compiles in the image's build stage
    and makes the artifact the host made from the same inputs. The host's ccache is mounted
    in and its objects are hits there (same relative paths, same locale)."""
    before = ccache_stats()
    record = build_image(
        tmp_path_factory, "--engine", "llama.cpp", "--backend", "cpu",
        "--registry", "localhost/in-image",
    )  # fmt: skip
    assert "build_stage" in record["seconds"]
    assert record["artifact_id"] == upstream_artifact.id
    assert record["binary_sha256"] == upstream_artifact.manifest["binary_sha256"]
    assert record["tags"][0].startswith("localhost/in-image/llamaspec:llama.cpp-cpu-0c1e570-")
    hits, misses = (a - b for a, b in zip(ccache_stats(), before, strict=True))
    print(f"in-image compile: {hits} ccache hits, {misses} misses")
    # (nothing compiled at all where buildah's layer cache still holds the build stage)
    assert misses * 10 <= hits, (hits, misses)


def ccache_stats() -> tuple[int, int]:
    """(hits, misses) of the host's ccache, which the image's build stage uses."""
    out = subprocess.run(
        ["ccache", "--print-stats"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    stats = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    hits = int(stats["direct_cache_hit"]) + int(stats["preprocessed_cache_hit"])
    return hits, int(stats["cache_miss"])


def test_image_carries_the_local_build(cpu_image, upstream_artifact) -> None:
    assert "build_stage" not in cpu_image["seconds"]  # nothing compiled in the image
    local = upstream_artifact.manifest
    ref = cpu_image["tags"][0]
    assert cpu_image["artifact_id"] == upstream_artifact.id
    with BUILDAH.working_container(ref) as ctr:
        inside = json.loads(BUILDAH.read_file(ctr, "/opt/llamaspec/manifest.json"))
    differ = sorted(k for k in local.keys() | inside.keys() if local.get(k) != inside.get(k))
    assert set(differ) <= VOLATILE, {k: (local.get(k), inside.get(k)) for k in differ}
    labels = BUILDAH.labels(ref)
    for key, value in images.image_labels(local, "", "").items():
        if key.startswith(images.LABEL_PREFIX):
            assert labels[key] == value
    assert labels["org.opencontainers.image.revision"]


def test_tags_name_engine_commit_and_artifact(cpu_image, upstream_artifact) -> None:
    digest = upstream_artifact.id.rsplit("-", 1)[1]
    assert cpu_image["tags"] == [
        f"localhost/llamaspec:llama.cpp-cpu-0c1e570-{digest}",
        "localhost/llamaspec:llama.cpp-cpu",
    ]


def test_runtime_config(cpu_image) -> None:
    config = BUILDAH.inspect(cpu_image["tags"][0])
    assert config["User"] == "llama"
    assert "8080/tcp" in config["ExposedPorts"]
    assert config["Entrypoint"] == ["/opt/llamaspec/bin/entrypoint.sh"]
    assert config["Healthcheck"]["Test"] == ["CMD", "/opt/llamaspec/bin/healthcheck.sh"]
    assert "LLAMASPEC_HOST=0.0.0.0" in config["Env"] and "LLAMASPEC_PORT=8080" in config["Env"]


def test_size_budget(cpu_image, tmp_path: Path) -> None:
    proc = llamaspec("docker", "size", "--reports", str(tmp_path), cpu_image["tags"][0])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(next(tmp_path.glob("docker-size-*.json")).read_text())
    print(f"image size: {report['added_mb']} MB over {report['base']}")
    assert report["within_budget"], report
    assert "libgomp.so.1" in report["system_libraries"]


def test_labels_refuse_another_engine_or_pin(cpu_image) -> None:
    """What `docker pull` does with a pulled image whose labels are not what was asked."""
    ref = cpu_image["tags"][1]
    labels = BUILDAH.labels(ref)
    images.check_labels(labels, ref, "llama.cpp", "cpu", "0c1e57098bba43ac29e6e3b677cdceebdd22334f")
    with pytest.raises(LlamaspecError, match="engine is 'llama.cpp', not 'ik_llama.cpp'"):
        images.check_labels(labels, ref, "ik_llama.cpp", "cpu", None)
    with pytest.raises(LlamaspecError, match="engine-commit is '0c1e5709"):
        images.check_labels(labels, ref, "llama.cpp", "cpu", "f" * 40)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until `url` answers 200; the process must stay alive (its log is the message)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        late = time.monotonic() >= deadline
        assert not late, f"{url} did not answer in {timeout} s: " + log.read_text()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[str]:
    """Debian's docker-registry on a free loopback port with its storage in a temporary
    directory: the registry a pull goes to. Stopped when the module's tests are done."""
    root = tmp_path_factory.mktemp("registry")
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    exe = shutil.which("docker-registry")
    assert exe, "docker-registry is not installed (apt-get install docker-registry)"
    with (root / "registry.log").open("w") as log:
        proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(f"http://127.0.0.1:{port}/v2/", proc, root / "registry.log", 30)
        yield f"127.0.0.1:{port}/ci"
    finally:
        proc.terminate()
        proc.wait(30)


def _local_images() -> list[str]:
    """The ids of llamaspec's images in buildah's storage (built or pulled), so that a pull
    must fetch them again; by id, since a pull by digest leaves a name without a tag."""
    out = subprocess.run(
        ["buildah", "images", "--format", "{{.ID}} {{.Name}}"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    rows = (line.split() for line in out.splitlines() if line.strip())
    return sorted({i for i, name in rows if name.startswith(("localhost/", "127.0.0.1:"))})


def test_registry_round_trip(cpu_image, registry, upstream_artifact, tmp_path: Path) -> None:
    """Push the image to a real registry on loopback, remove it here, then `docker pull`
    chooses the tag for this host, checks the labels in the registry before any layer is
    downloaded, pulls, and the pulled image passes the smoke test: the container serves the
    embedded model, answers /health, and gives the same completion with speculation on.
    Then the `docker run` line `recipe show --format docker` prints for it runs as printed."""
    remote = images.image_ref(registry, images.rolling_tag("llama.cpp", "cpu"))
    subprocess.run(["buildah", "tag", cpu_image["tags"][0], remote], check=True, timeout=120)
    pushed = BUILDAH.push(remote)
    assert pushed and pushed.startswith("sha256:")
    # nothing of the image is left here (but the Debian base): the pull must download it
    for ref in _local_images():
        subprocess.run(["buildah", "rmi", "--force", ref], check=True, timeout=120)
    subprocess.run(["buildah", "rmi", "--prune"], check=False, timeout=300)
    assert not BUILDAH.image_exists(remote)
    proc = llamaspec("docker", "pull", "--tool", "buildah", "--registry", registry)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "this host → cpu" in output
    assert f"registry {registry} (--registry)" in output
    assert f"{remote}: labels checked in the registry, pulling the layers" in output
    # the tag resolved to one digest, and that digest is what was pulled (then tagged here)
    assert f"{remote} is {remote.rsplit(':', 1)[0]}@sha256:" in output
    assert "was NOT verified: cosign is not installed" in output  # nothing signed it here
    assert upstream_artifact.id in output and "docker run --rm -p 127.0.0.1:8080:8080" in output
    assert BUILDAH.labels(remote)["io.llamaspec.artifact-id"] == upstream_artifact.id

    dist = str(upstream_artifact.path.parent)
    proc = llamaspec(
        "docker", "smoke", "--tool", "buildah", "--reports", str(tmp_path),
        "--compare-dist", dist, remote,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "smoke: PASSED" in output and "HEALTHCHECK ok" in output
    # the pulled image's bytes are its manifest's, and the host build's of the same artifact
    assert f"files match the image's manifest; identical to the host build {dist}" in output
    report = json.loads(next(tmp_path.glob("docker-smoke-*/smoke.json")).read_text())
    assert report["passed"] and report["accepted"] > 0
    for result in report["results"]:
        assert result["verdict"]["kind"] in ("identical", "near-tie"), result["prompt"]
    run_recipe_line(remote, tmp_path)


@contextlib.contextmanager
def docker_line_running(line: str, log: Path) -> Iterator[str]:
    """Run a printed `docker run` line with buildah, as Docker would run it: the same image
    and its own entrypoint, the same read-only mounts, environment and arguments. Its
    `-p 127.0.0.1:H:8080` becomes the entrypoint's LLAMASPEC_HOST/LLAMASPEC_PORT (chroot
    isolation shares this machine's network), so the server answers at exactly the published
    address. Any option this does not know fails the test. Yields the server's URL."""
    text = "\n".join(ln for ln in line.splitlines() if not ln.startswith("#"))
    words = shlex.split(text.replace("\\\n", " "))  # a line continuation, as sh reads it
    assert words[:3] == ["docker", "run", "--rm"], words
    rest, mounts, env, port = words[3:], [], {}, None
    while rest[0].startswith("-"):
        flag, value = rest.pop(0), rest.pop(0)
        if flag == "-p":
            host, published, inside = value.split(":")
            assert host == "127.0.0.1" and inside == "8080", value  # loopback only
            port = int(published)
        elif flag == "-v":
            src, dst, mode = value.rsplit(":", 2)
            assert mode == "ro" and Path(src).is_file(), value  # a real file, read-only
            mounts.append((src, dst))
        elif flag == "-e":
            key, _, val = value.partition("=")
            env[key] = val
        else:
            pytest.fail(f"the docker line has {flag} {value}, which this test cannot run")
    ref, args = rest[0], rest[1:]
    assert port, "the line publishes no port"
    entrypoint = BUILDAH.inspect(ref)["Entrypoint"]
    env.update(LLAMASPEC_HOST="127.0.0.1", LLAMASPEC_PORT=str(port))
    with BUILDAH.working_container(ref) as ctr, log.open("w") as out:
        cmd = BUILDAH.run_argv(ctr, [*entrypoint, *args], mounts, env)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(url + "/health", proc, log, 300)
            yield url
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(60)


def run_recipe_line(remote: str, tmp_path: Path) -> None:
    """README's Docker run: `recipe show NAME --format docker` for the pulled image, run as
    printed; an OpenAI client gets a completion, and a speculative one whose drafts the
    server accepted (the recipe's ngram-mod flags reached the server in the image)."""
    from openai import OpenAI

    port = free_port()
    proc = llamaspec(
        "recipe", "show", "gemma3-270m-ngram", "--format", "docker", "--image", remote,
        "--port", str(port),
    )  # fmt: skip
    line = proc.stdout
    assert proc.returncode == 0, line + proc.stderr
    assert f"-p 127.0.0.1:{port}:8080" in line and ":/models/gemma-3-270m-q4_k_m.gguf:ro" in line
    assert "--spec-type ngram-mod" in line or "ngram-mod" in line, line
    assert "--chat-template deepseek" in line, line  # the GGUF has none: one it answers
    question = "Name the capital of France."
    with docker_line_running(line, tmp_path / "docker-line.log") as url:
        client = OpenAI(base_url=url + "/v1", api_key="none", timeout=300)
        chat = client.chat.completions.create(
            model="gemma", temperature=0, max_tokens=16,
            messages=[{"role": "user", "content": question}],
        )  # fmt: skip
        reply = chat.choices[0].message.content or ""
        assert reply.strip() and not echoes(reply, question), reply
        code = "def add(a, b):\n    return a + b\n\n" * 6 + "def add(a, b):\n"
        spec = client.completions.create(model="gemma", prompt=code, temperature=0, max_tokens=48)
        timings = spec.model_extra["timings"]
        print(f"docker line: {timings.get('draft_n_accepted')}/{timings.get('draft_n')} accepted")
        assert spec.choices[0].text.strip() and timings["draft_n_accepted"] > 0, timings


def echoes(reply: str, question: str) -> bool:
    """Whether a chat reply repeats the question or the chat markup around it, as a base
    model does with a template its vocabulary lacks (ChatML's `<|im_start|>` for Gemma),
    instead of answering it."""
    said = " ".join(reply.lower().split())
    asked = " ".join(question.lower().rstrip(".?!").split())
    markup = ("im_start", "im_end", "<start_of_turn>", "<end_of_turn>")
    return asked in said or any(m in reply for m in markup)


def test_a_tag_the_registry_lacks_is_named_with_the_tags_it_has(registry) -> None:
    """The registry's answer is read for what it means: no such tag, and which tags there
    are (listed from the registry), never a guess that it could not be reached."""
    proc = llamaspec(
        "docker", "pull", "--tool", "buildah", "--registry", registry, "--backend", "cpu",
        "--tag", "no-such-tag",
    )  # fmt: skip
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert f"{registry} has no image {registry}/llamaspec:no-such-tag" in text, text
    # the round trip's push, where it ran first; an empty registry has no repository yet
    assert "The tags there: " in text or "has no tags there at all" in text, text


def test_a_pull_whose_labels_do_not_match_downloads_nothing(registry) -> None:
    """Asking for another pin: refused from the registry's labels, no layer pulled."""
    for ref in _local_images():
        subprocess.run(["buildah", "rmi", "--force", ref], check=True, timeout=120)
    proc = llamaspec(
        "docker", "pull", "--tool", "buildah", "--registry", registry, "--backend", "cpu",
        "--pin", "f" * 40,
    )  # fmt: skip
    text = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, text
    assert "engine-commit is '0c1e5709" in text and "Traceback" not in text
    assert not BUILDAH.image_exists(images.image_ref(registry, "llama.cpp-cpu"))
