"""Images: labels, tags, the matrix, host detection, tool detection and their errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamaspec.config import load_engines
from llamaspec.engine import profiles as flags
from llamaspec.errors import LlamaspecError
from llamaspec.images import commands, registry, remote, tools
from llamaspec.images import specs as images
from llamaspec.images.build import all_build_args
from llamaspec.images.smoke import server_shim
from llamaspec.paths import cache_dir

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
# A CUDA 13 build for five architectures, as CMake records them (`-real`/`-virtual` kept).
CUDA_MANIFEST = {
    **MANIFEST,
    "backend": "cuda",
    "cuda_archs": "75-real;80;86;89;90-virtual",
    "cuda_toolkit": {"version": "13.0", "origin": "PyPI wheels"},
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
        "io.llamaspec.cuda": "",
        "io.llamaspec.cuda-archs": "",
    }
    assert images.labels_txt(MANIFEST).splitlines()[1] == f"engine-commit={PIN}"


def test_cuda_builds_are_tagged_and_labelled_with_their_toolkit_and_archs() -> None:
    cuda = CUDA_MANIFEST
    labels = images.image_labels(cuda, "", "")
    assert labels["io.llamaspec.cuda"] == "13.0"
    assert labels["io.llamaspec.cuda-archs"] == "75,80,86,89,90"
    assert images.tags(images.ImageSpec(backend="cuda"), cuda) == [
        "localhost/llamaspec:llama.cpp-cuda13-0c1e570-2a65556682b3",
        "localhost/llamaspec:llama.cpp-cuda13",
    ]


def test_label_args_match_the_dockerfile_check() -> None:
    """The runtime stage printf's its label arguments in labels.txt's order and compares."""
    args = images.label_args(MANIFEST, "src", "rev")
    fields = ("engine", "engine-commit", "patches", "backend", "artifact-id", "cuda", "cuda-archs")
    fmt = "".join(f"{f}={{}}\n" for f in fields)
    names = ("ENGINE", "ENGINE_COMMIT", "PATCH_IDS", "BACKEND", "ARTIFACT_ID")
    names += ("CUDA_VERSION", "CUDA_ARCHS")
    assert fmt.format(*(args[n] for n in names)) == images.labels_txt(MANIFEST)
    for backend in images.BACKENDS:
        text = (ROOT / "docker" / f"Dockerfile.{backend}").read_text()
        assert "printf '" + fmt.replace("{}", "%s").replace("\n", r"\n") + "'" in text
        args_line = " ".join(f'"${{{n}}}"' for n in names)
        assert args_line in " ".join(text.replace("\\\n", " ").split())
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
    # the Dockerfile keeps its CUDA archs; every image is portable (run-time CPU variants)
    assert args == {"ENGINE": "llama.cpp", "BACKEND": "cuda", "VARIANTS": "portable"}
    rpc = images.ImageSpec(variants=("rpc", "portable")).build_args()["VARIANTS"]
    assert rpc == "portable,rpc"
    # TREE is always given: buildah resolves `FROM ${TREE}` only from a build argument
    assert all_build_args(images.ImageSpec())["TREE"] == "build"
    assert all_build_args(images.ImageSpec(), "artifact")["TREE"] == "artifact"


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
    docker = tools.Docker("docker")
    cmd = docker.build_argv(
        Path("d/Dockerfile.cpu"), Path("."), "runtime", args,
        tools.BuildSettings(cache="type=gha,scope=llama.cpp-cpu"), tags=["r/x:t"], push=True,
    )  # fmt: skip
    assert cmd[:3] == ["docker", "buildx", "build"]
    assert cmd[cmd.index("--cache-to") + 1] == "type=gha,mode=max,scope=llama.cpp-cpu"
    assert "--push" in cmd and "--load" not in cmd and cmd[-1] == "."
    cmd = docker.build_argv(Path("D"), Path("."), "manifest", args, output=tmp_path)
    assert "--push" not in cmd and "--load" not in cmd and "--cache-from" not in cmd
    assert cmd[cmd.index("--output") + 1] == f"type=local,dest={tmp_path}"
    buildah = tools.Buildah("buildah")
    settings = tools.BuildSettings(volumes=((tmp_path, tools.STAGE_CCACHE),), pull_never=True)
    cmd = buildah.build_argv(
        Path("d/Dockerfile.cpu"), Path("."), "manifest", args, settings, output=tmp_path,
        ca_bundle=Path("/ca.pem"),
    )  # fmt: skip
    assert cmd[:4] == ["buildah", "bud", "--isolation", "chroot"]
    assert "--pull=never" in cmd and f"{tmp_path}:{tools.STAGE_CCACHE}" in cmd
    assert cmd[cmd.index("--output") + 1] == f"type=local,dest={tmp_path}"
    assert cmd[cmd.index("--build-arg") + 1] == "ENGINE=llama.cpp"
    assert cmd[cmd.index("--secret") + 1] == "id=ca,src=/ca.pem"
    runtime = buildah.build_argv(Path("D"), Path("."), "runtime", args, tags=["a", "b"], push=True)
    assert "--push" not in runtime and "--load" not in runtime  # buildah pushes afterwards
    assert [runtime[i + 1] for i, w in enumerate(runtime) if w == "-t"] == ["a", "b"]


def test_build_stage_caches_are_where_buildah_mounts_the_hosts(tmp_path: Path) -> None:
    """Every Dockerfile's build stage points LLAMASPEC_CACHE and CCACHE_DIR at the paths
    buildah mounts the host's downloads and ccache into."""
    mounts = {inside: host for host, inside in tools.host_caches(tmp_path / "ccache")}
    assert mounts == {
        f"{tools.STAGE_CACHE}/downloads": cache_dir() / "downloads",
        tools.STAGE_CCACHE: tmp_path / "ccache",
    }
    env = f"ENV LLAMASPEC_CACHE={tools.STAGE_CACHE} CCACHE_DIR={tools.STAGE_CCACHE}\n"
    dockerfiles = sorted((ROOT / "docker").glob("Dockerfile.*"))
    assert [d.name for d in dockerfiles] == [f"Dockerfile.{b}" for b in sorted(images.BACKENDS)]
    for dockerfile in dockerfiles:
        build_stage = dockerfile.read_text().split(" AS build\n")[1].split("\nFROM ")[0]
        assert env in build_stage, dockerfile.name


def test_buildx_cache_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMASPEC_BUILDX_CACHE", "type=gha,scope=x")
    assert tools.Docker().build_settings("base", None, print).cache == "type=gha,scope=x"
    monkeypatch.delenv("LLAMASPEC_BUILDX_CACHE")
    assert tools.Docker().build_settings("base", None, print) == tools.BuildSettings()


def test_run_commands_for_both_tools(tmp_path: Path) -> None:
    argv = ["/opt/llamaspec/bin/llama-server", "--port", "8081"]
    mounts, env = [(tmp_path, "/models")], {"GGML_VK_VISIBLE_DEVICES": "0"}
    assert tools.Docker("/d").run_argv("img:t", argv, mounts, env, network=True) == [
        "/d", "run", "--rm", "-i", "--network", "host",
        "--entrypoint", "/opt/llamaspec/bin/llama-server",
        "-v", f"{tmp_path}:/models:ro", "-e", "GGML_VK_VISIBLE_DEVICES=0",
        "img:t", "--port", "8081",
    ]  # fmt: skip
    # a check that needs no network gets none where the tool can isolate it (issue 54)
    check = tools.Docker("/d").run_argv("img:t", ["getconf", "GNU_LIBC_VERSION"])
    assert check[check.index("--network") + 1] == "none"
    assert "--network" not in tools.Buildah("/b").run_argv("ctr", ["true"])  # chroot: host only
    assert tools.Buildah("/b").run_argv("ctr", argv, mounts, env) == [
        "/b", "run", "--isolation", "chroot",
        "-v", f"{tmp_path}:/models:ro", "--env", "GGML_VK_VISIBLE_DEVICES=0",
        "ctr", "--", *argv,
    ]  # fmt: skip
    assert tools.Docker().pull_argv("r/x:t") == ["docker", "pull", "r/x:t"]
    assert tools.Buildah().pull_argv("r/x:t") == ["buildah", "pull", "--quiet", "r/x:t"]


def test_both_tools_implement_the_whole_interface() -> None:
    members = [
        name
        for name, value in vars(tools.ContainerTool).items()
        if callable(value) and not name.startswith("_")
    ]
    assert {"build_argv", "run_argv", "inspect", "pull_argv", "push", "added_bytes"} <= set(members)
    for tool in (tools.Docker(), tools.Buildah()):
        assert isinstance(tool, tools.ContainerTool)
        missing = [m for m in members if not callable(getattr(tool, m, None))]
        assert not missing, (tool.name, missing)


def test_no_branching_on_the_tool_name_outside_the_tools() -> None:
    """Tool differences live in Docker and Buildah; nothing else asks which one it has."""
    src = ROOT / "src" / "llamaspec"
    for path in [*(src / "images").glob("*.py"), *(src / "cli").glob("*.py")]:
        text = path.read_text()
        assert not re.search(r"\.name\s*[!=]=\s*[\"'](docker|buildah)", text), path
        assert not re.search(r"[\"'](docker|buildah)[\"']\s*[!=]=\s*\w+\.name", text), path


def test_server_shim_quotes_every_argument(tmp_path: Path) -> None:
    """A model directory with a space and a quote reaches the tool as one argument."""
    echo = tmp_path / "tool"
    echo.write_text('#!/bin/sh\nfor a in "$@"; do printf \'%s\\n\' "$a"; done\n')
    echo.chmod(0o755)
    models = tmp_path / "it's a dir $HOME"
    shim = server_shim(tools.Buildah(str(echo)), "ctr", models, tmp_path / "shim")
    out = subprocess.run([str(shim), "--alias", "a b"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "run", "--isolation", "chroot", "-v", f"{models}:/models:ro",
        "ctr", "--", "/opt/llamaspec/bin/llama-server", "--alias", "a b",
    ]  # fmt: skip


def test_push_digest_is_read_from_the_push_output() -> None:
    out = "latest: digest: sha256:" + "ab" * 32 + " size: 1573\n"
    assert tools.push_digest(out) == "sha256:" + "ab" * 32
    assert tools.push_digest("denied: permission") is None


def test_pull_errors_tell_unreachable_from_missing() -> None:
    err = registry.pull_error(
        "Error: dial tcp 127.0.0.1:9: connect: connection refused", "127.0.0.1:9/x/llamaspec:t",
        "127.0.0.1:9/x", "llama.cpp", "cpu",
    )  # fmt: skip
    assert "Cannot reach the registry 127.0.0.1:9" in str(err)
    assert "llamaspec docker build --engine llama.cpp --backend cpu" in str(err)
    err = registry.pull_error(
        "manifest unknown", "ghcr.io/o/llamaspec:t", "ghcr.io/o", "ik_llama.cpp", "cuda"
    )
    assert "ghcr.io/o has no image ghcr.io/o/llamaspec:t (manifest unknown)" in str(err)


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
    assert registry.detect_host(tmp_path, which=lambda _name: None).backend == backend


def test_run_hint_renders_the_recipe_for_the_engine() -> None:
    engines = load_engines(ROOT)
    ref = "r/llamaspec:llama.cpp-cuda"
    up = registry.run_hint(ref, "cuda", engines["llama.cpp"], PIN, "qwen2.5-coder-7b", ROOT)
    assert (
        'docker run --rm --gpus all -p 127.0.0.1:8080:8080 -v "$PWD/models:/models:ro" ' + ref in up
    )
    assert "# other machines on purpose, use `-p 8080:8080` and add `--api-key" in up
    assert "-m /models/qwen2.5-coder-7b-q8_0.gguf" in up
    assert "--spec-type draft-simple --spec-draft-model /models/qwen2.5-coder-0.5b-q8_0.gguf" in up
    assert "--host" not in up and "--port" not in up  # the image's entrypoint sets them
    ik = engines["ik_llama.cpp"]
    hint = registry.run_hint("r/x", "cpu", ik, ik.pin, "gemma3-270m-self", ROOT)
    assert "-md /models/gemma-3-270m-q4_k_m.gguf --draft-max 8" in hint and "--gpus" not in hint
    with pytest.raises(LlamaspecError, match="Did you mean 'qwen2.5-coder-7b'"):
        registry.run_hint("r/x", "cpu", ik, ik.pin, "qwen2.5-coder-7", ROOT)


def stand_ins(where: Path, **scripts: str) -> str:
    """A directory of tiny shell scripts named like the container tools (detection only)."""
    where.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (where / name).write_text(f"#!/bin/sh\n{body}\n")
        (where / name).chmod(0o755)
    return str(where)


NO_ENGINE = (
    'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. '
    'Is the docker daemon running?" >&2; exit 1'
)
ENGINE = 'case "$1" in info) echo 27.3.1;; buildx) echo "github.com/docker/buildx v0.17";; esac'
ENGINE_NO_BUILDX = 'case "$1" in info) echo 27.3.1;; *) exit 125;; esac'
BUILDAH = "echo buildah version 1.28.2"


@pytest.mark.parametrize(
    ("scripts", "choice", "picked"),
    [
        ({"buildah": BUILDAH}, "auto", "buildah"),
        ({"docker": ENGINE, "buildah": BUILDAH}, "auto", "docker"),
        ({"docker": NO_ENGINE, "buildah": BUILDAH}, "auto", "buildah"),
        ({"docker": ENGINE, "buildah": BUILDAH}, "buildah", "buildah"),
        ({"docker": ENGINE}, "docker", "docker"),
    ],
)
def test_detect_picks_one_tool(scripts: dict, choice: str, picked: str, tmp_path: Path) -> None:
    path = stand_ins(tmp_path / "bin", **scripts)
    tool = tools.detect(choice, path=path)
    assert (tool.name, tool.path) == (picked, f"{path}/{picked}")
    assert isinstance(tool, tools.Docker if picked == "docker" else tools.Buildah)


@pytest.mark.parametrize(
    ("scripts", "choice", "message"),
    [
        ({}, "auto", "neither docker nor buildah is on PATH"),
        ({"docker": NO_ENGINE}, "auto", "a docker CLI is installed but no Docker engine answers"),
        ({"docker": NO_ENGINE}, "docker", "no Docker engine answers (Cannot connect to the"),
        ({"docker": ENGINE_NO_BUILDX}, "docker", "the buildx plugin is missing"),
        ({"buildah": BUILDAH}, "docker", "there is no docker CLI on PATH"),
        ({"docker": ENGINE}, "buildah", "buildah is not installed"),
        ({"buildah": BUILDAH}, "podman", "Unknown container tool 'podman'"),
    ],
)
def test_detect_says_what_is_missing(
    scripts: dict, choice: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(LlamaspecError) as err:
        tools.detect(choice, path=stand_ins(tmp_path / "bin", **scripts))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["docker", "build", "--engine", "llama.ccp"], "Did you mean 'llama.cpp'"),
        (["docker", "build", "--backend", "vulcan"], "Did you mean 'vulkan'"),
        (["docker", "pull", "--backend", "cuda", "--engine", "ik-llama.cpp"], "'ik_llama.cpp'"),
        (["docker", "pull", "--engine", "ik-llama.cpp"], "Did you mean 'ik_llama.cpp'"),
        (["docker", "pull", "--backend", "vulcan"], "Did you mean 'vulkan'"),
        (["docker", "pull", "--pin", "0c1e570"], "is not a full 40-character commit SHA"),
        (["docker", "pull", "--recipe", "qwen2.5-coder-7"], "Did you mean 'qwen2.5-coder-7b'"),
        (["docker", "build", "--pin", "0c1e570"], "is not a full 40-character commit SHA"),
        (["docker", "pull", "--backend", "cuda"], "this host has no NVIDIA driver"),
        (["docker", "push", "--record", "nothing.json"], "Cannot read the build record"),
        (["docker", "size", "img", "--record", "nothing.json"], "Cannot read the build record"),
        (["docker", "smoke", "Bad Name"], "Bad Name"),
    ],
)
def test_bad_input_is_named_before_any_container_tool(
    args: list[str], message: str, tmp_path: Path
) -> None:
    """No tool at all, and a docker CLI without an engine: the typo is what is reported."""
    empty = stand_ins(tmp_path / "empty")
    assert message in one_paragraph(cli(*args, path=empty, home=tmp_path))
    only_docker = stand_ins(tmp_path / "docker", docker=NO_ENGINE)
    assert message in one_paragraph(cli(*args, path=only_docker, home=tmp_path))


def test_no_container_tool_says_what_to_install(tmp_path: Path) -> None:
    text = one_paragraph(cli("docker", "smoke", "x", path=stand_ins(tmp_path / "b"), home=tmp_path))
    assert "neither docker nor buildah is on PATH" in text
    assert "apt-get install buildah" in text and "buildx" in text


def test_docker_cli_without_an_engine_is_named(tmp_path: Path) -> None:
    only = stand_ins(tmp_path / "bin", docker=NO_ENGINE)
    text = one_paragraph(cli("docker", "smoke", "x", path=only, home=tmp_path))
    assert "a docker CLI is installed but no Docker engine answers" in text
    assert "Is the docker daemon running?" in text


def _stages(dockerfile: Path) -> dict[str, str]:
    """Stage name → its text (from its FROM line to the next FROM)."""
    text = dockerfile.read_text()
    parts = re.split(r"(?m)^FROM ", text)[1:]
    return {p.split("\n", 1)[0].split(" AS ")[-1].strip(): p for p in parts}


@pytest.mark.parametrize("backend", images.BACKENDS)
def test_runtime_stage_ships_only_the_staged_tree(backend: str) -> None:
    """No compiler, no headers, no devel image: the runtime stage copies /opt/llamaspec from
    the tree stage (the build stage's, or an artifact staged from dist/: TREE) and its base
    is the runtime base."""
    dockerfile = ROOT / "docker" / f"Dockerfile.{backend}"
    stages = _stages(dockerfile)
    assert list(stages) == ["build", "manifest", "artifact", "tree", "runtime"]
    assert "ARG TREE=build" in dockerfile.read_text()
    assert stages["tree"].startswith("${TREE} AS tree")
    assert "COPY .llamaspec-stage/ /opt/llamaspec/" in stages["artifact"]
    assert stages["artifact"].startswith("scratch AS artifact")
    runtime = stages["runtime"]
    assert runtime.startswith("${BASE_IMAGE} AS runtime")
    assert re.findall(r"COPY --from=(\S+) (\S+)", runtime) == [("tree", "/opt/llamaspec")]
    for devel in ("g++", "cmake", "ninja", "-dev ", "nvcc", "cuda-toolkit", "python3"):
        assert devel not in runtime, devel
    default_base = re.search(r"ARG BASE_IMAGE=(\S+)", dockerfile.read_text()).group(1)
    assert default_base == images.BASES[backend][0]
    if backend == "cuda":  # no NVIDIA image: Debian, the PyPI toolkit, bundled CUDA libraries
        assert images.BASES["cuda"] == images.BASES["cpu"]
        assert "nvidia" not in dockerfile.read_text().split("FROM ", 1)[1]
        assert "NVIDIA_VISIBLE_DEVICES=all" in runtime
        assert "cmake>=3.26,<4" in stages["build"] and "ENV PATH=/venv/bin" in stages["build"]
    assert "USER llama" in runtime and "EXPOSE 8080" in runtime and "HEALTHCHECK" in runtime


def test_tool_calls_have_a_time_limit_and_a_checked_exit_status(tmp_path: Path) -> None:
    path = stand_ins(
        tmp_path / "bin", hangs="sleep 30", fails='echo "Error: image not known" >&2; exit 125'
    )
    with pytest.raises(LlamaspecError, match="did not finish within 0.5 s"):
        tools.call([f"{path}/hangs", "inspect"], "inspect x", timeout=0.5)
    with pytest.raises(LlamaspecError) as err:
        tools.Buildah(f"{path}/fails").inspect("img")
    assert "Cannot inspect img" in str(err.value) and "status 125" in str(err.value)
    assert "(Error: image not known)" in str(err.value)
    assert not tools.Docker(f"{path}/fails").image_exists("img")


def smi(tmp_path: Path, output: str, status: int = 0) -> str:
    """A stand-in nvidia-smi (no GPU here) answering the driver/compute-capability query."""
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {status}\n")
    path.chmod(0o755)
    return str(path)


def test_the_driver_and_gpu_choose_the_cuda_tag(tmp_path: Path) -> None:
    host = registry.cuda_host(lambda _: smi(tmp_path, "580.65.06, 8.6\n550.1, 9.0\n"))
    assert host == registry.CudaHost("580.65.06", 86)
    assert host.tag_backend() == "cuda13"
    assert registry.CudaHost("550.54.15", 90).tag_backend() == "cuda12"
    with pytest.raises(LlamaspecError, match=r"470.82 is too old .*cuda13 needs 580"):
        registry.CudaHost("470.82", 86).tag_backend()
    with pytest.raises(LlamaspecError, match="did not name a GPU"):
        registry.cuda_host(lambda _: smi(tmp_path, "No devices were found", 6))
    with pytest.raises(LlamaspecError, match="no NVIDIA driver"):
        registry.cuda_host(lambda _: None)


def test_a_cuda_image_is_refused_for_a_gpu_or_driver_it_cannot_run() -> None:
    labels = images.image_labels(CUDA_MANIFEST, "", "")
    registry.check_cuda_image(labels, "img", registry.CudaHost("580.1", 86))
    with pytest.raises(LlamaspecError, match=r"sm_75, sm_80, sm_86, sm_89, sm_90.*sm_61") as err:
        registry.check_cuda_image(labels, "img", registry.CudaHost("580.1", 61))
    assert "--cuda-arch 61" in str(err.value)
    with pytest.raises(LlamaspecError, match=r"CUDA 13.0, which needs an NVIDIA driver 580"):
        registry.check_cuda_image(labels, "img", registry.CudaHost("550.1", 86))


def test_the_registry_is_one_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--registry, else LLAMASPEC_REGISTRY, else the user config, else the published one."""
    monkeypatch.delenv("LLAMASPEC_REGISTRY", raising=False)
    monkeypatch.setenv("LLAMASPEC_CONFIG", str(tmp_path / "config.yaml"))
    (tmp_path / "config.yaml").write_text("jobs: 2\n")
    assert registry.configured_registry(None) == (images.DEFAULT_REGISTRY, "the default")
    (tmp_path / "config.yaml").write_text("registry: 127.0.0.1:5000/team\n")
    assert registry.configured_registry(None) == (
        "127.0.0.1:5000/team",
        str(tmp_path / "config.yaml"),
    )
    monkeypatch.setenv("LLAMASPEC_REGISTRY", "registry.example.org/x")
    assert registry.configured_registry(None)[1] == "LLAMASPEC_REGISTRY"
    assert registry.configured_registry("r.example/y") == ("r.example/y", "--registry")
    monkeypatch.delenv("LLAMASPEC_REGISTRY")
    (tmp_path / "config.yaml").write_text("registry: https://Registry/\n")
    with pytest.raises(LlamaspecError, match="registry"):
        registry.configured_registry(None)


def test_loopback_registries_are_plain_http() -> None:
    """As Docker's engine does: a registry on loopback has no TLS; any other keeps it."""
    for ref in ("127.0.0.1:5000/t/llamaspec:x", "localhost:5000/llamaspec:x", "[::1]:5/a:b"):
        assert remote.loopback(ref), ref
        assert "--tls-verify=false" in tools.Buildah("buildah").pull_argv(ref)
    for ref in ("ghcr.io/llamaspec/llamaspec:x", "127.example.org/x:y", "llamaspec:x"):
        assert not remote.loopback(ref), ref
        assert "--tls-verify=false" not in tools.Buildah("buildah").pull_argv(ref)


def test_docker_run_quotes_mounts_and_drops_the_entrypoints_flags() -> None:
    line = commands.docker_run(
        "img:t", "vulkan", ["llama-server", "-m", "/models/a b.gguf", "--host", "h", "--port", "1"],
        [("/data/my models/blob", "/models/a b.gguf"), ('"$PWD/models"', "/models")], 8081,
    )  # fmt: skip
    run, server = line.splitlines()[-2:]
    assert run == (
        "docker run --rm --device /dev/dri -p 127.0.0.1:8081:8080 "
        "-v '/data/my models/blob:/models/a b.gguf:ro' -v \"$PWD/models:/models:ro\" img:t \\"
    )
    assert server.strip() == "-m '/models/a b.gguf'"


def _entrypoint(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[list[str], str]:
    """docker/entrypoint.sh with a stand-in llama-server that prints its arguments and
    LLAMA_ARG_MODEL; what it ran and the port it wrote for the health check."""
    server = tmp_path / "root" / "bin" / "llama-server"
    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text('#!/bin/sh\nprintf "%s\\n" "$@" "model=$LLAMA_ARG_MODEL"\n')
    server.chmod(0o755)
    port_file = tmp_path / "port"
    base = {"PATH": "/usr/bin:/bin", "LLAMASPEC_ROOT": str(tmp_path / "root")}
    base.update({"LLAMASPEC_PORT_FILE": str(port_file), "LLAMASPEC_HOST": "0.0.0.0"})
    base["LLAMASPEC_GATE_FILE"] = str(tmp_path / "gate")
    proc = subprocess.run(
        ["sh", str(ROOT / "docker" / "entrypoint.sh"), *args],
        env={**base, "LLAMASPEC_PORT": "8080", **env},
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return proc.stdout.splitlines(), port_file.read_text().strip()


def test_entrypoint_takes_llama_arg_variables_and_the_port_asked_for(tmp_path: Path) -> None:
    ran, port = _entrypoint(tmp_path, ["-c", "4096"], {})
    assert ran == ["--host", "0.0.0.0", "--port", "8080", "-c", "4096", "model="] and port == "8080"
    env = {"LLAMA_ARG_PORT": "9001", "LLAMA_ARG_MODEL": "/models/m.gguf"}
    ran, port = _entrypoint(tmp_path, [], env)
    assert ran == ["--host", "0.0.0.0", "--port", "9001", "model=/models/m.gguf"] and port == "9001"
    ran, port = _entrypoint(tmp_path, ["--port", "7000", "--host=127.0.0.1"], env)
    assert ran[:4] == ["--host", "127.0.0.1", "--port", "7000"] and port == "7000"


def test_entrypoint_refuses_a_cpu_without_what_the_build_needs(tmp_path: Path) -> None:
    """cpu-needs.txt (written by the stage from the manifest) against this CPU's flags: a
    flag no CPU has stops the start with a sentence; flags this CPU has let it start."""
    root = tmp_path / "root"
    root.mkdir()
    mine = flags.host_cpu_flags(Path("/proc/cpuinfo").read_text())
    (root / "cpu-needs.txt").write_text(f"{' '.join(mine)}\nwhy\n")
    ran, _ = _entrypoint(tmp_path, [], {})
    assert ran[:2] == ["--host", "0.0.0.0"]
    (root / "cpu-needs.txt").write_text("sse2 no_such_flag\nik_llama.cpp baseline\n")
    with pytest.raises(subprocess.CalledProcessError) as err:
        _entrypoint(tmp_path, [], {})
    text = " ".join(err.value.stderr.split())
    assert "this CPU lacks no_such_flag, which this image's llama-server needs" in text
    assert "(ik_llama.cpp baseline)" in text and err.value.stdout == ""


def test_entrypoint_of_a_cuda_image_without_a_driver_says_so_and_starts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "labels.txt").write_text("engine=llama.cpp\nbackend=cuda\n")
    ran, _ = _entrypoint(tmp_path, ["-ngl", "99"], {})
    assert ran[-2:] == ["99", "model="]  # started
    no_driver = (
        "libcuda.so.1"
        not in subprocess.run(
            ["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=False
        ).stdout
    )
    proc = subprocess.run(
        ["sh", str(ROOT / "docker" / "entrypoint.sh")],
        env={"PATH": "/usr/bin:/bin:/sbin", "LLAMASPEC_ROOT": str(root),
             "LLAMASPEC_PORT_FILE": str(tmp_path / "port")},
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    said = "no CUDA device: the NVIDIA driver (libcuda.so.1) is not in this container"
    assert (said in " ".join(proc.stderr.split())) is no_driver


def test_healthcheck_follows_the_port_the_server_listens_on(tmp_path: Path) -> None:
    """A real HTTP server answering /health on a free port: healthy there, not elsewhere."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port_file = tmp_path / "port"

    def healthy(**env: str) -> bool:
        env = {"PATH": "/usr/bin:/bin", "LLAMASPEC_PORT_FILE": str(port_file), **env}
        script = str(ROOT / "docker" / "healthcheck.sh")
        return subprocess.run(["bash", script], env=env, timeout=30).returncode == 0

    try:
        port = str(httpd.server_address[1])
        port_file.write_text(port + "\n")
        assert healthy(LLAMASPEC_PORT="9")  # the entrypoint's port file wins
        port_file.unlink()
        assert healthy(LLAMASPEC_PORT=port) and not healthy(LLAMASPEC_PORT="9")
    finally:
        httpd.shutdown()


def test_entrypoint_writes_the_speculation_gate_file_and_turns_metrics_on(tmp_path: Path) -> None:
    """A draft model or MTP head in the arguments: /metrics on (unless set) and the gate
    file with what is loaded, the likely cause and the fix; no speculation: neither."""
    gate = tmp_path / "gate"
    server = tmp_path / "root" / "bin" / "llama-server"

    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text('#!/bin/sh\nprintf "%s\\n" "$@" "metrics=$LLAMA_ARG_ENDPOINT_METRICS"\n')
    server.chmod(0o755)

    def run(args: list[str], env: dict[str, str] | None = None) -> list[str]:
        proc = subprocess.run(
            ["sh", str(ROOT / "docker" / "entrypoint.sh"), *args],
            env={"PATH": "/usr/bin:/bin", "LLAMASPEC_ROOT": str(tmp_path / "root"),
                 "LLAMASPEC_PORT_FILE": str(tmp_path / "port"),
                 "LLAMASPEC_GATE_FILE": str(gate), **(env or {})},
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        return proc.stdout.splitlines()

    ran = run(["-m", "/models/t.gguf", "-md", "/models/d.gguf"])
    assert "metrics=1" in ran and "--metrics" not in ran
    loaded, cause, fix = gate.read_text().splitlines()
    assert loaded == "draft model /models/d.gguf (-md)"
    assert (
        "#23988" in cause and "#25345" in cause and fix.startswith("add --spec-type draft-simple")
    )
    run(["-m", "t", "--spec-draft-model=d", "--spec-type", "draft-simple,ngram-mod"])
    assert gate.read_text().splitlines()[1] == "not clear from the command line"
    run(["-m", "t", "--spec-type", "draft-mtp"])
    assert "MTP head" in gate.read_text()
    assert "metrics=0" in run(["-m", "t", "-md", "d"], {"LLAMA_ARG_ENDPOINT_METRICS": "0"})
    ran = run(["-m", "t", "--spec-type", "ngram-mod"])
    assert not gate.exists() and "metrics=" in ran
    run(["-m", "t", "-md", "d"], {"LLAMASPEC_SPEC_GATE": "off"})
    assert not gate.exists()
    run(["-m", "t"], {"LLAMA_ARG_SPEC_DRAFT_MODEL": "/models/d.gguf"})
    assert gate.read_text().startswith("draft model /models/d.gguf (LLAMA_ARG_SPEC_DRAFT_MODEL)")


def test_healthcheck_says_when_a_loaded_draft_drafts_nothing(tmp_path: Path) -> None:
    """/metrics with a loaded draft: quiet until enough tokens, then the gate's paragraph on
    stdout (the health log) and once in the server's log; healthy unless the gate is `fail`."""
    import http.server
    import threading

    page = {"text": ""}

    class Server(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page["text"].encode() if self.path == "/metrics" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    gate, log = tmp_path / "gate", tmp_path / "server.log"

    def check(**env: str) -> tuple[int, str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "LLAMASPEC_PORT": str(httpd.server_address[1]),
            "LLAMASPEC_PORT_FILE": str(tmp_path / "none"),
            "LLAMASPEC_GATE_FILE": str(gate),
            "LLAMASPEC_GATE_LOG": str(log),
            **env,
        }
        script = str(ROOT / "docker" / "healthcheck.sh")
        proc = subprocess.run(
            ["bash", script], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        return proc.returncode, proc.stdout

    idle = (
        "# TYPE llamacpp:tokens_predicted_total counter\r\n"
        "llamacpp:tokens_predicted_total {n}\r\n"
        "llamacpp:spec_decode_num_draft_tokens_total {d}\r\n"
        "llamacpp:spec_decode_num_drafts_total {d}\r\n"
    )
    try:
        page["text"] = idle.format(n=100, d=0)
        assert check() == (0, "")  # no gate file: no draft loaded
        gate.write_text("draft model /models/d.gguf (-md)\nthe cause\nthe fix\n")
        page["text"] = idle.format(n=24, d=0)
        assert check() == (0, "")  # too few tokens to judge
        page["text"] = idle.format(n="1.23457e+06", d=0)
        status, said = check()
        assert status == 0 and said.startswith("llamaspec: SPECULATION GATE: llama-server loads")
        assert "draft model /models/d.gguf (-md), but nothing was drafted" in said
        assert "over 1.23457e+06 generated tokens" in said and "Likely cause: the cause." in said
        assert "Fix: the fix." in said and len(said.splitlines()) == 1
        assert check()[0] == 0 and log.read_text() == said  # the server's log: once
        assert check(LLAMASPEC_SPEC_GATE="fail") == (1, said)
        assert check(LLAMASPEC_SPEC_GATE="off") == (0, "")
        page["text"] = idle.format(n=100, d=40)
        assert check() == (0, "")  # drafting
        page["text"] = "llamacpp:tokens_predicted_total 100\n"  # ik_llama.cpp: no counters
        assert check(LLAMASPEC_SPEC_GATE="fail") == (0, "")
    finally:
        httpd.shutdown()


def test_a_pull_verifies_the_workflows_signature_where_cosign_is_installed(tmp_path: Path) -> None:
    from rich.console import Console

    def cosign(status: int, said: str) -> str:
        path = tmp_path / f"cosign{status}"
        path.write_text(f"#!/bin/sh\necho '{said}' >&2\necho \"$@\" > {path}.args\nexit {status}\n")
        path.chmod(0o755)
        return str(path)

    console = Console(record=True, width=200)
    assert not registry.verify_signature("r/x:t", console, lambda _: None)
    assert "was NOT verified: cosign is not installed" in console.export_text()
    good = cosign(0, "ok")
    assert registry.verify_signature("r/x:t", console, lambda _: good)
    args = Path(good + ".args").read_text().split()
    assert args[0] == "verify" and args[-1] == "r/x:t"
    assert args[args.index("--certificate-oidc-issuer") + 1] == registry.SIGNER_ISSUER
    bad = cosign(1, "Error: no matching signatures")
    with pytest.raises(LlamaspecError, match="could not verify .* no matching signatures"):
        registry.verify_signature("r/x:t", console, lambda _: bad)


def test_entrypoint_rpc_server_mode(tmp_path: Path) -> None:
    """`rpc-server` as the first argument runs the image's rpc-server (0.0.0.0:50052 inside
    the container unless -H/-p are given) and warns; an image without one says why."""
    base = {"PATH": "/usr/bin:/bin", "LLAMASPEC_ROOT": str(tmp_path / "root")}
    entry = ["sh", str(ROOT / "docker" / "entrypoint.sh"), "rpc-server"]
    (tmp_path / "root" / "bin").mkdir(parents=True)
    missing = subprocess.run(entry, env=base, capture_output=True, text=True, check=False)
    assert missing.returncode == 1 and "without the rpc variant" in missing.stderr
    rpc = tmp_path / "root" / "bin" / "ggml-rpc-server"
    rpc.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    rpc.chmod(0o755)
    ran = subprocess.run([*entry, "-d", "CPU"], env=base, capture_output=True, text=True)
    assert ran.stdout.split() == ["-p", "50052", "-H", "0.0.0.0", "-d", "CPU"]
    assert "no authentication and no encryption" in ran.stderr
    ran = subprocess.run([*entry, "-H", "10.0.0.2", "-p", "7"], env=base, capture_output=True)
    assert ran.stdout.decode().split() == ["-H", "10.0.0.2", "-p", "7"]


def test_buildah_pulls_a_missing_base_before_any_from_never_pulls_or_says_how_to_make_it(
    tmp_path: Path,
) -> None:
    """The message and the behaviour agree: a base not in local storage is pulled there and
    then (working containers use `buildah from --pull=never`); when the pull fails, the
    error names `llamaspec docker base`, the offline way to make it."""
    calls = tmp_path / "calls"
    path = stand_ins(
        tmp_path / "bin",
        pulls=f'echo "$@" >> {calls}; [ "$1" = pull ]',
        offline=f'echo "$@" >> {calls}; [ "$1" = pull ] && echo "Error: no route" >&2; exit 125',
    )
    said: list[str] = []
    settings = tools.Buildah(f"{path}/pulls").build_settings("base:x", None, said.append)
    assert settings.pull_never
    assert calls.read_text().splitlines() == [
        "inspect --type image base:x",
        "pull --quiet base:x",
    ]
    assert said == ["docker-build: base:x is not in local storage; pulling it"]
    with pytest.raises(LlamaspecError) as err:
        tools.Buildah(f"{path}/offline").build_settings("base:x", None, said.append)
    text = str(err.value)
    assert "llamaspec docker base --tag base:x" in text and "no route" in text
    assert "\n" not in text and "will pull" not in text


def test_the_build_context_of_an_installed_package_is_a_temporary_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker build --from-artifact` stages the artifact inside its build context: a
    checkout's own folder, but never the installed package's (issue 54), which is copied to
    a temporary folder, removed afterwards, the original untouched."""
    import contextlib

    from llamaspec.images import build

    root = tmp_path / "installed"
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "Dockerfile.cpu").write_text("FROM scratch\n")
    with contextlib.ExitStack() as stack:
        assert build.context_root(root, stack) == root  # a writable checkout builds in place
    monkeypatch.setattr(build, "is_packaged", lambda r: r == root)
    with contextlib.ExitStack() as stack:
        ctx = build.context_root(root, stack)
        assert ctx != root and (ctx / "docker" / "Dockerfile.cpu").is_file()
        (ctx / ".llamaspec-stage").mkdir()  # staging works in the copy
    assert not ctx.exists() and sorted(p.name for p in root.iterdir()) == ["docker"]
