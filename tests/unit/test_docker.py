"""Images: labels, tags, the matrix, host detection, tool detection and their errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.config import load_engines
from llamaspec.errors import LlamaspecError
from llamaspec.images import specs as images
from llamaspec.images import tools as containers
from llamaspec.images.stage import system_libs

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
PIN = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
MANIFEST = {
    "artifact_id": "llamacpp-cpu-2a65556682b3",
    "engine": "llama.cpp",
    "commit": PIN,
    "backend": "cpu",
    "patches": [{"id": "spec-checkpointing", "status": "in-base"}],
}


def cli(*args: str, path: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llamaspec.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": path, "LLAMASPEC_CACHE": str(home), "HOME": str(home)},
        check=False,
        timeout=120,
    )


def one_paragraph(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return " ".join(proc.stderr.split())


def test_labels_come_from_the_manifest() -> None:
    labels = images.image_labels(MANIFEST, "https://example.org/llamaspec", "abc123")
    assert labels == {
        "org.opencontainers.image.source": "https://example.org/llamaspec",
        "org.opencontainers.image.revision": "abc123",
        "io.llamaspec.engine": "llama.cpp",
        "io.llamaspec.engine-commit": PIN,
        "io.llamaspec.patches": "spec-checkpointing=in-base",
        "io.llamaspec.backend": "cpu",
        "io.llamaspec.artifact-id": "llamacpp-cpu-2a65556682b3",
    }
    assert images.labels_txt(MANIFEST).splitlines()[1] == f"engine-commit={PIN}"


def test_label_args_match_the_dockerfile_check() -> None:
    """The runtime stage printf's its label arguments in labels.txt's order and compares."""
    args = images.label_args(MANIFEST, "src", "rev")
    printed = "engine={}\nengine-commit={}\npatches={}\nbackend={}\nartifact-id={}\n".format(
        args["ENGINE"],
        args["ENGINE_COMMIT"],
        args["PATCH_IDS"],
        args["BACKEND"],
        args["ARTIFACT_ID"],
    )
    assert printed == images.labels_txt(MANIFEST)
    for backend in images.BACKENDS:
        text = (ROOT / "docker" / f"Dockerfile.{backend}").read_text()
        assert r"engine=%s\nengine-commit=%s\npatches=%s\nbackend=%s\nartifact-id=%s\n" in text
        for arg in args:
            assert f"ARG {arg}=" in text, (backend, arg)


def test_tags_immutable_and_rolling() -> None:
    spec = images.ImageSpec(registry="ghcr.io/Someone")
    assert images.tags(spec, MANIFEST) == [
        "ghcr.io/someone/llamaspec:llama.cpp-cpu-0c1e570-2a65556682b3",
        "ghcr.io/someone/llamaspec:llama.cpp-cpu",
    ]
    pinned = images.ImageSpec(variants=("rpc",))
    assert images.tags(pinned, MANIFEST) == [
        "localhost/llamaspec:llama.cpp-cpu-0c1e570-2a65556682b3"
    ]


def test_refuses_an_image_whose_labels_do_not_match() -> None:
    labels = images.image_labels(MANIFEST, "", "")
    images.check_labels(labels, "img", "llama.cpp", "cpu", PIN)
    with pytest.raises(LlamaspecError) as err:
        images.check_labels(labels, "img", "ik_llama.cpp", "cpu", None)
    assert "engine is 'llama.cpp', not 'ik_llama.cpp'" in str(err.value)
    assert "trusts the labels, not the tag" in str(err.value)
    with pytest.raises(LlamaspecError, match="engine-commit is '0c1e"):
        images.check_labels(labels, "img", "llama.cpp", "cpu", "1" * 40)
    with pytest.raises(LlamaspecError, match="no io.llamaspec.artifact-id"):
        images.check_labels({}, "img", "llama.cpp", "cpu", None)


def test_patch_set_argument() -> None:
    assert images.parse_patches("a, -b,none,+c") == (["a", "c"], ["b"], True)
    assert images.parse_patches("") == ([], [], False)


def test_build_args_leave_out_empty_values() -> None:
    args = images.ImageSpec(backend="cuda").build_args()
    assert args == {"ENGINE": "llama.cpp", "BACKEND": "cuda"}  # Dockerfile keeps its archs


def test_bake_file_is_current_and_matrix_covers_every_pair() -> None:
    engines = load_engines(ROOT)
    assert (ROOT / "docker" / "docker-bake.hcl").read_text() == images.bake(engines)
    rows = images.matrix(list(engines))
    assert {(r["engine"], r["backend"]) for r in rows} == {
        (e, b) for e in engines for b in images.BACKENDS
    }
    assert all((ROOT / r["dockerfile"]).is_file() for r in rows)
    assert {r["backend"] for r in rows if r["smoke"] == "true"} == {"cpu", "vulkan"}


def test_build_commands_for_both_tools(tmp_path: Path) -> None:
    args = {"ENGINE": "llama.cpp"}
    docker = containers.Tool("docker", "docker")
    cmd = containers.build_command(
        docker, Path("d/Dockerfile.cpu"), Path("."), "runtime", args, tags=["r/x:t"],
        push=True, cache="type=gha,scope=llama.cpp-cpu",
    )  # fmt: skip
    assert cmd[:3] == ["docker", "buildx", "build"]
    assert cmd[cmd.index("--cache-to") + 1] == "type=gha,mode=max,scope=llama.cpp-cpu"
    assert "--push" in cmd and "--load" not in cmd and cmd[-1] == "."
    buildah = containers.Tool("buildah", "buildah")
    cmd = containers.build_command(
        buildah, Path("d/Dockerfile.cpu"), Path("."), "manifest", args,
        output=tmp_path, volumes=[(tmp_path, "/root/.cache/ccache")], pull_never=True,
    )  # fmt: skip
    assert cmd[:4] == ["buildah", "bud", "--isolation", "chroot"]
    assert "--pull=never" in cmd and f"{tmp_path}:/root/.cache/ccache" in cmd
    assert cmd[cmd.index("--output") + 1] == f"type=local,dest={tmp_path}"
    assert cmd[cmd.index("--build-arg") + 1] == "ENGINE=llama.cpp"


def test_push_digest_is_read_from_the_push_output() -> None:
    out = "latest: digest: sha256:" + "ab" * 32 + " size: 1573\n"
    assert containers.push_digest(out) == "sha256:" + "ab" * 32
    assert containers.push_digest("denied: permission") is None


@pytest.mark.parametrize(
    ("files", "backend"),
    [
        (["proc/driver/nvidia/gpus/0000:01:00.0/information"], "cuda"),
        (["usr/share/vulkan/icd.d/radeon_icd.json", "dev/dri/renderD128"], "vulkan"),
        (["usr/share/vulkan/icd.d/radeon_icd.json"], "cpu"),
        (["usr/share/vulkan/icd.d/lvp_icd.json", "dev/dri/renderD128"], "cpu"),
        ([], "cpu"),
    ],
)
def test_host_detection(files: list[str], backend: str, tmp_path: Path) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert containers.detect_host(tmp_path, which=lambda _name: None).backend == backend


def test_run_hint_renders_the_recipe_for_the_engine() -> None:
    engines = load_engines(ROOT)
    ref = "r/llamaspec:llama.cpp-cuda"
    up = containers.run_hint(ref, "cuda", engines["llama.cpp"], PIN, "qwen2.5-coder-7b", ROOT)
    assert 'docker run --rm --gpus all -p 8080:8080 -v "$PWD/models:/models:ro" ' + ref in up
    assert "-m /models/qwen2.5-coder-7b-q8_0.gguf" in up
    assert "--spec-type draft-simple --spec-draft-model /models/qwen2.5-coder-0.5b-q8_0.gguf" in up
    assert "--host" not in up and "--port" not in up  # the image's entrypoint sets them
    ik = engines["ik_llama.cpp"]
    hint = containers.run_hint("r/x", "cpu", ik, ik.pin, "gemma3-270m-self", ROOT)
    assert "-md /models/gemma-3-270m-q4_k_m.gguf --draft-max 8" in hint and "--gpus" not in hint
    with pytest.raises(LlamaspecError, match="Did you mean 'qwen2.5-coder-7b'"):
        containers.run_hint("r/x", "cpu", ik, ik.pin, "qwen2.5-coder-7", ROOT)


def test_system_libraries_exclude_the_base_set(tmp_path: Path) -> None:
    """Real ldd on a real binary: the C library stays out, anything else is copied."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    binary = Path(sys.executable).resolve()
    shutil.copy2(binary, tmp_path / "bin" / "server")
    found = system_libs(tmp_path)
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
    assert "libc.so.6" in ldd and "libc.so.6" not in found
    assert not any(n.startswith(("libm.so", "ld-linux", "libstdc++")) for n in found)
    expected = {
        ln.split()[0]
        for ln in ldd.splitlines()
        if "=>" in ln and not containers_base(ln.split()[0])
    }
    assert set(found) == expected


def containers_base(name: str) -> bool:
    from llamaspec.images.stage import BASE_LIBS

    return bool(BASE_LIBS.match(name))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["docker", "build", "--engine", "llama.ccp"], "Did you mean 'llama.cpp'"),
        (["docker", "build", "--backend", "vulcan"], "Did you mean 'vulkan'"),
        (["docker", "pull", "--backend", "cuda", "--engine", "ik-llama.cpp"], "'ik_llama.cpp'"),
        (["docker", "build", "--pin", "0c1e570"], "is not a full 40-character commit SHA"),
    ],
)
def test_bad_input_is_one_clear_error(args: list[str], message: str, tmp_path: Path) -> None:
    assert message in one_paragraph(cli(*args, path=os.environ["PATH"], home=tmp_path))


def test_no_container_tool_says_what_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    text = one_paragraph(cli("docker", "smoke", "x", path=str(empty), home=tmp_path))
    assert "neither docker nor buildah is on PATH" in text
    assert "apt-get install buildah" in text and "buildx" in text


@pytest.mark.skipif(not shutil.which("docker"), reason="needs the docker CLI")
def test_docker_cli_without_an_engine_is_named(tmp_path: Path) -> None:
    only = tmp_path / "bin"
    only.mkdir()
    (only / "docker").symlink_to(shutil.which("docker"))
    env_docker = subprocess.run(["docker", "info"], capture_output=True, check=False)
    if env_docker.returncode == 0:
        pytest.skip("a Docker engine runs here")
    text = one_paragraph(cli("docker", "smoke", "x", path=str(only), home=tmp_path))
    assert "a docker CLI is installed but no Docker engine answers" in text


def test_unreachable_registry_suggests_docker_build(tmp_path: Path) -> None:
    """A real pull from a registry nobody listens on (loopback, closed port)."""
    assert shutil.which("buildah"), "buildah is installed by .ci/run"
    text = one_paragraph(
        cli(
            "docker", "pull", "--tool", "buildah", "--backend", "cpu",
            "--registry", "127.0.0.1:9/nobody", path=os.environ["PATH"], home=tmp_path,
        )
    )  # fmt: skip
    assert "Cannot reach the registry 127.0.0.1:9" in text
    assert "nox -s docker-build -- --engine llama.cpp --backend cpu" in text


def _stages(dockerfile: Path) -> dict[str, str]:
    """Stage name → its text (from its FROM line to the next FROM)."""
    text = dockerfile.read_text()
    parts = re.split(r"(?m)^FROM ", text)[1:]
    return {p.split("\n", 1)[0].split(" AS ")[-1].strip(): p for p in parts}


@pytest.mark.parametrize("backend", images.BACKENDS)
def test_runtime_stage_ships_only_the_staged_tree(backend: str) -> None:
    """No compiler, no headers, no devel image: the runtime stage copies /opt/llamaspec from
    the build stage and its base is the runtime base (for CUDA, NVIDIA's *runtime* image)."""
    dockerfile = ROOT / "docker" / f"Dockerfile.{backend}"
    stages = _stages(dockerfile)
    assert list(stages) == ["build", "manifest", "runtime"]
    runtime = stages["runtime"]
    assert runtime.startswith("${BASE_IMAGE} AS runtime")
    assert re.findall(r"COPY --from=(\S+) (\S+)", runtime) == [("build", "/opt/llamaspec")]
    for devel in ("g++", "cmake", "ninja", "-dev ", "nvcc", "cuda-toolkit", "python3"):
        assert devel not in runtime, devel
    default_base = re.search(r"ARG BASE_IMAGE=(\S+)", dockerfile.read_text()).group(1)
    assert default_base == images.BASES[backend][0]
    if backend == "cuda":
        assert "-runtime-" in default_base and "-devel-" in images.BASES["cuda"][1]
    assert "USER llama" in runtime and "EXPOSE 8080" in runtime and "HEALTHCHECK" in runtime
