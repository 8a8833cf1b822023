"""Registries: the signer a pull trusts, the one digest it verifies and pulls, what a
registry's refusal means, registry addresses, and the small image fixes of issue 42 (the
entrypoint's CPU refusal, buildah's leftovers, the image's source label, the pull help).

Container tools and cosign are stand-ins written by the tests (the unit tier has none);
the error texts are what the real tools printed: skopeo 1.9 and buildah 1.28 against
Debian's docker-registry 2.8 with htpasswd auth (addresses and paths made neutral), and
docker's own words as users reported them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from llamaspec import procs
from llamaspec.config import load_engines
from llamaspec.errors import LlamaspecError
from llamaspec.images import build, registry, remote, tools
from llamaspec.images import specs as images

from runcli import cli

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
ENGINE = load_engines(ROOT)["llama.cpp"]
DIGEST = "sha256:" + "d5" * 32
OTHER = "sha256:" + "0e" * 32
LABELS = {
    "io.llamaspec.engine": "llama.cpp",
    "io.llamaspec.backend": "cpu",
    "io.llamaspec.artifact-id": "llamacpp-cpu-000000000000",
}
WORKFLOW = "https://github.com/{}/.github/workflows/docker.yml@{}"


# --- the signer ----------------------------------------------------------------------------


def test_the_signer_follows_the_registry_namespace_or_the_setting() -> None:
    assert registry.signer_repo("ghcr.io/acme", {})[0] == "acme/llamaspec"
    assert registry.signer_repo("ghcr.io/llamaspec", {})[0] == "llamaspec/llamaspec"
    # elsewhere (a mirror, a nested namespace): the repository that publishes the default
    for where in ("127.0.0.1:5000/team", "registry.example.org/acme", "ghcr.io/acme/team"):
        assert registry.signer_repo(where, {})[0] == registry.PUBLISHER == "llamaspec/llamaspec"
    env = {registry.SIGNER_ENV: "Fork-Owner/llamaspec.next"}
    assert registry.signer_repo("ghcr.io/acme", env) == (
        "Fork-Owner/llamaspec.next",
        "LLAMASPEC_SIGNER_REPO",
    )
    for bad in ("", "acme", "acme/llamaspec/extra", "https://github.com/acme/llamaspec", "a b/c"):
        with pytest.raises(
            LlamaspecError, match="is not a GitHub repository: give it as OWNER/REPO"
        ):
            registry.signer_repo("ghcr.io/acme", {registry.SIGNER_ENV: bad})


@pytest.mark.parametrize(
    ("identity", "accepted"),
    [
        (WORKFLOW.format("acme/llamaspec", "refs/heads/main"), True),
        # the workflow publishes from main only: a run dispatched by hand on a tag is not
        # a publishing run, whatever the tag (issue 54)
        (WORKFLOW.format("acme/llamaspec", "refs/tags/v1.2.0"), False),
        (WORKFLOW.format("Acme/LlamaSpec", "refs/heads/main"), True),  # GitHub ignores case
        # another repository's workflow of the same name: the hole this closes
        (WORKFLOW.format("mallory/llamaspec", "refs/heads/main"), False),
        (WORKFLOW.format("acme/llamaspec-fork", "refs/heads/main"), False),
        (WORKFLOW.format("acme/llamaspecx", "refs/heads/main"), False),
        (WORKFLOW.format("xacme/llamaspec", "refs/heads/main"), False),
        # the right repository, but not its publishing runs
        (WORKFLOW.format("acme/llamaspec", "refs/heads/feature"), False),
        (WORKFLOW.format("acme/llamaspec", "refs/heads/main-evil"), False),
        (WORKFLOW.format("acme/llamaspec", "refs/pull/7/merge"), False),
        (WORKFLOW.format("acme/llamaspec", "refs/tags/v1/x"), False),
        ("https://github.com/acme/llamaspec/.github/workflows/release.yml@refs/heads/main", False),
        (
            "https://github.com/acme/llamaspec/.github/workflows/docker.yml.evil@refs/heads/main",
            False,
        ),
        ("https://gitlab.com/acme/llamaspec/.github/workflows/docker.yml@refs/heads/main", False),
    ],
)
def test_the_signer_identity_is_one_repositorys_publishing_workflow(
    identity: str, accepted: bool
) -> None:
    """The expression cosign gets (`--certificate-identity-regexp`, matched as Go's
    regexp.MatchString does: anywhere, so it is anchored) against certificate identities."""
    pattern = registry.signer_identity("acme/llamaspec")
    assert bool(re.search(pattern, identity)) is accepted


def fake_cosign(tmp_path: Path, san: str, digest: str = DIGEST) -> Path:
    """A cosign that holds the signature's certificate identity `san` against the
    expression it is given, as cosign does, and prints the verified payload (JSON)."""
    path = tmp_path / "bin" / "cosign"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = [{"critical": {"image": {"docker-manifest-digest": digest}}}]
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, re, sys\n"
        "args = sys.argv[1:]\n"
        f"open({str(path) + '.log'!r}, 'a').write(json.dumps(args) + '\\n')\n"
        "pattern = args[args.index('--certificate-identity-regexp') + 1]\n"
        f"if not re.search(pattern, {san!r}):\n"
        "    print('Error: no matching signatures: none of the expected identities matched "
        "what was in the certificate', file=sys.stderr)\n"
        "    sys.exit(1)\n"
        f"print({json.dumps(payload)!r})\n"
    )
    path.chmod(0o755)
    return path


def calls(script: Path) -> list[list[str]]:
    log = Path(str(script) + ".log")
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_signature_from_another_repository_is_refused(tmp_path: Path) -> None:
    console = Console(record=True, width=300)
    ref = f"ghcr.io/acme/llamaspec@{DIGEST}"
    foreign = fake_cosign(tmp_path / "a", WORKFLOW.format("mallory/llamaspec", "refs/heads/main"))
    with pytest.raises(LlamaspecError, match=r"Refusing .*acme/llamaspec's publishing workflow"):
        registry.verify_signature(ref, console, lambda _: str(foreign))
    (args,) = calls(foreign)
    assert args[args.index("--certificate-identity-regexp") + 1] == registry.signer_identity(
        "acme/llamaspec"
    )
    assert args[args.index("--certificate-oidc-issuer") + 1] == registry.SIGNER_ISSUER
    own = fake_cosign(tmp_path / "b", WORKFLOW.format("acme/llamaspec", "refs/heads/main"))
    verified = registry.verify_signature(ref, console, lambda _: str(own))
    assert verified is not None and verified.digests == {DIGEST}


# --- one digest: inspected, verified, pulled -----------------------------------------------


class FakeTool:
    """What `registry.pull` needs of a container tool, with every reference it is given
    written down in order."""

    name = "fake"

    def __init__(self, tmp_path: Path, pull_status: int = 0, said: str = "") -> None:
        self.log: list[tuple[str, ...]] = []
        self.script = tmp_path / "bin" / "pull"
        self.script.parent.mkdir(parents=True, exist_ok=True)
        self.script.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {pull_status}\n")
        self.script.chmod(0o755)

    def pull_argv(self, ref: str) -> list[str]:
        self.log.append(("pull", ref))
        return [str(self.script), ref]

    def tag(self, ref: str, new: str) -> None:
        self.log.append(("tag", ref, new))

    def labels(self, ref: str) -> dict[str, str]:
        self.log.append(("labels", ref))
        return dict(LABELS)


def fake_skopeo(tmp_path: Path, digest: str = DIGEST, status: int = 0, said: str = "") -> Path:
    path = tmp_path / "bin" / "skopeo"
    path.parent.mkdir(parents=True, exist_ok=True)
    out = json.dumps({"Digest": digest, "Labels": LABELS, "Tags": ["llama.cpp-cpu"]})
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(path) + '.log'!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"print({said!r}, file=sys.stderr)\n"
        f"print({out!r}) if {status} == 0 else None\n"
        f"sys.exit({status})\n"
    )
    path.chmod(0o755)
    return path


def pull(tool: FakeTool, where: str = "ghcr.io/acme") -> str:
    return registry.pull(tool, ENGINE, "cpu", None, where, None, Console(record=True, width=300))


def test_a_pull_verifies_and_pulls_the_one_digest_the_tag_resolved_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    skopeo = fake_skopeo(tmp_path)
    cosign = fake_cosign(tmp_path, WORKFLOW.format("acme/llamaspec", "refs/heads/main"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # none of the real tools
    tool = FakeTool(tmp_path)
    ref = "ghcr.io/acme/llamaspec:llama.cpp-cpu"
    pinned = f"ghcr.io/acme/llamaspec@{DIGEST}"
    assert pull(tool) == ref
    assert [a[-1] for a in calls(skopeo)] == [f"docker://{ref}"]  # resolved once
    assert [a[-1] for a in calls(cosign)] == [pinned]  # that digest verified
    assert tool.log == [("pull", pinned), ("tag", pinned, ref), ("labels", ref)]


def test_without_skopeo_the_digest_cosign_verified_is_the_one_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cosign = fake_cosign(tmp_path, WORKFLOW.format("acme/llamaspec", "refs/heads/main"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # none of the real tools
    tool = FakeTool(tmp_path)
    ref = "ghcr.io/acme/llamaspec:llama.cpp-cpu"
    pull(tool)
    assert [a[-1] for a in calls(cosign)] == [ref]
    pinned = f"ghcr.io/acme/llamaspec@{DIGEST}"
    assert tool.log == [("pull", pinned), ("tag", pinned, ref), ("labels", ref)]


def test_a_tag_that_moved_between_inspect_and_verify_is_not_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_skopeo(tmp_path, digest=DIGEST)
    fake_cosign(tmp_path, WORKFLOW.format("acme/llamaspec", "refs/heads/main"), digest=OTHER)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # none of the real tools
    tool = FakeTool(tmp_path)
    with pytest.raises(LlamaspecError, match=f"the registry named {DIGEST}, but cosign verified"):
        pull(tool)
    assert tool.log == []


def test_without_cosign_the_inspected_digest_is_still_the_one_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_skopeo(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # none of the real tools
    tool = FakeTool(tmp_path)
    pull(tool, "127.0.0.1:5000/ci")
    pinned = f"127.0.0.1:5000/ci/llamaspec@{DIGEST}"
    assert tool.log[:2] == [
        ("pull", pinned),
        ("tag", pinned, "127.0.0.1:5000/ci/llamaspec:llama.cpp-cpu"),
    ]


def test_metadata_calls_have_their_own_short_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """skopeo is told the deadline (`--command-timeout`) and stopped soon after it; the
    hour a layer transfer may take is not what a label check waits."""
    seen: list[tuple[list[str], float]] = []
    real = procs.run

    def run(cmd, *, timeout, **kw):
        seen.append((list(cmd), timeout))
        return real(cmd, timeout=timeout, **kw)

    monkeypatch.setattr(procs, "run", run)
    skopeo = fake_skopeo(tmp_path)
    remote.inspect("ghcr.io/acme/llamaspec:t", lambda _: str(skopeo))
    remote.list_tags("ghcr.io/acme/llamaspec", lambda _: str(skopeo))
    assert len(seen) == 2
    for argv, timeout in seen:
        assert argv[1:3] == ["--command-timeout", f"{remote.METADATA_S}s"]
        assert timeout <= remote.METADATA_S + 10 < tools.TRANSFER_S / 10
    # a skopeo that does not stop by itself is stopped, and that is "no answer"
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(remote, "METADATA_S", -9.5)  # stopped after 0.5 s
    with pytest.raises(remote.RemoteError) as err:
        remote.inspect("ghcr.io/acme/llamaspec:t", lambda _: str(hang))
    assert remote.classify(str(err.value)) == "timeout"


# --- what a registry's refusal means -------------------------------------------------------

# What the real tools printed when a registry turned them down (see the file's "about").
CAPTURED = json.loads((Path(__file__).with_name("registry_errors.json")).read_text())["cases"]


def said(name: str) -> str:
    return CAPTURED[name]["output"]


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_a_registrys_refusal_is_read_for_what_it_means(name: str) -> None:
    assert remote.classify(said(name)) == CAPTURED[name]["kind"]


def refuse(output: str, tags=None) -> str:
    ref, where = "ghcr.io/acme/llamaspec:llama.cpp-cpu", "ghcr.io/acme"
    return " ".join(str(registry.pull_error(output, ref, where, "llama.cpp", "cpu", tags)).split())


def test_each_refusal_says_what_happened_and_what_to_do() -> None:
    build = "llamaspec docker build --engine llama.cpp --backend cpu"
    auth = refuse(said("skopeo-inspect-no-credentials"))
    for words in (
        "refused access without valid credentials",
        "docker login ghcr.io",
        "buildah login ghcr.io",
        "REGISTRY_AUTH_FILE",
        "read:packages",
        build,
    ):
        assert words in auth
    assert "unauthorized: authentication required" in auth  # what the tool said, unwrapped
    server = refuse(said("skopeo-inspect-http-500"))
    assert "answered with a server error" in server and "500 (Internal Server Error)" in server
    tls = refuse(said("skopeo-inspect-self-signed"))
    assert "The TLS connection to the registry ghcr.io failed" in tls and "x509:" in tls
    assert "/etc/containers/certs.d/ghcr.io/ca.crt" in tls
    slow = refuse(said("skopeo-inspect-never-answers"))
    assert f"did not answer within {remote.METADATA_S} s" in slow
    assert "REGISTRY_AUTH_FILE names" in refuse(said("buildah-authfile-missing"))
    for name, case in CAPTURED.items():
        if case["kind"] != "missing":
            assert "has no image" not in refuse(case["output"]), name
    missing = refuse(
        said("skopeo-inspect-missing-tag"),
        ["llama.cpp-cpu-0c1e570-2a65556682b3", "llama.cpp-cuda13"],
    )
    assert "ghcr.io/acme has no image ghcr.io/acme/llamaspec:llama.cpp-cpu" in missing
    assert "The tags there: llama.cpp-cpu-0c1e570-2a65556682b3, llama.cpp-cuda13." in missing
    many = refuse(said("skopeo-inspect-missing-tag"), [f"t{i:02}" for i in range(20)])
    assert "t11 and 8 more" in many
    assert "has no tags there at all" in refuse(said("skopeo-inspect-missing-tag"), [])
    assert "skopeo list-tags docker://ghcr.io/acme/llamaspec" in refuse(
        said("skopeo-inspect-missing-tag")
    )


def test_a_missing_tag_lists_the_tags_there_within_the_deadline(tmp_path: Path) -> None:
    skopeo = fake_skopeo(tmp_path)
    output, ref = said("skopeo-inspect-missing-tag"), "ghcr.io/acme/llamaspec:nope"
    err = registry.refusal(output, ref, "ghcr.io/acme", "llama.cpp", "cpu", lambda _: str(skopeo))
    assert "The tags there: llama.cpp-cpu." in str(err)
    assert calls(skopeo)[0][2:] == ["list-tags", "docker://ghcr.io/acme/llamaspec"]


def test_a_push_refusal_says_what_happened(tmp_path: Path) -> None:
    """`docker push` (buildah and docker alike) classifies the registry's answer too."""
    buildah = tmp_path / "buildah"
    buildah.write_text(f"#!/bin/sh\necho '{said('buildah-push-no-credentials')}' >&2\nexit 125\n")
    buildah.chmod(0o755)
    with pytest.raises(LlamaspecError) as err:
        registry.push(tools.Buildah(str(buildah)), ["127.0.0.1:5000/ci/llamaspec:t"])
    text = " ".join(str(err.value).split())
    assert "Cannot push 127.0.0.1:5000/ci/llamaspec:t" in text
    assert "buildah login --tls-verify=false 127.0.0.1:5000" in text  # loopback: plain HTTP
    assert "write:packages" in text
    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\necho 'received unexpected HTTP status: 502 Bad Gateway' >&2\nexit 1\n"
    )
    docker.chmod(0o755)
    with pytest.raises(LlamaspecError, match="answered with a server error"):
        registry.push(tools.Docker(str(docker)), ["ghcr.io/acme/llamaspec:t"])


# --- registry addresses --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("https://ghcr.io/acme", "starts with a scheme (https://)"),
        ("ghcr.io/acme ", "has spaces"),
        ("ghcr.io/ac me", "has spaces"),
        ("ghcr.io/Acme", "lower case"),
        ("ghcr.io/acme/", "ends with '/'"),
        ("ghcr.io/../acme", "'..'"),
        ("ghcr.io//acme", "'//'"),
        ("127.0.0.1:99999/ci", "port 99999 is not between 1 and 65535"),
        ("ghcr.io/acme/llamaspec:t", "names an image"),
        ("ghcr.io/acme?x=1", "characters an image name cannot have"),
    ],
)
def test_a_malformed_registry_is_refused_with_the_form_expected(value: str, why: str) -> None:
    with pytest.raises(LlamaspecError) as err:
        registry.configured_registry(value)
    text = str(err.value)
    assert f"--registry {value!r} is not a registry address" in text and why in text
    assert remote.FORM in text


def test_registry_addresses_that_image_names_allow() -> None:
    for value in (
        "ghcr.io/acme",
        "127.0.0.1:5000/ci",
        "localhost",
        "[::1]:5000/x",
        "r.example/a/b-c",
    ):
        assert registry.configured_registry(value) == (value, "--registry")
    with pytest.raises(LlamaspecError, match="Did you mean 'ghcr.io/acme'"):
        registry.configured_registry("https://GHCR.io/acme/")


def test_an_empty_registry_is_refused_not_read_as_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMASPEC_CONFIG", str(tmp_path / "config.yaml"))
    (tmp_path / "config.yaml").write_text("jobs: 2\n")
    monkeypatch.setenv("LLAMASPEC_REGISTRY", "")
    empty = r"LLAMASPEC_REGISTRY is empty .*unset LLAMASPEC_REGISTRY"
    with pytest.raises(LlamaspecError, match=empty):
        registry.configured_registry(None)
    with pytest.raises(LlamaspecError, match=r"--registry is empty \(''\)"):
        registry.configured_registry("")
    monkeypatch.delenv("LLAMASPEC_REGISTRY")
    (tmp_path / "config.yaml").write_text("registry: a..b/x\n")  # the file's own pattern allows it
    with pytest.raises(LlamaspecError, match=r"`registry` in .*config.yaml 'a..b/x' is not a reg"):
        registry.configured_registry(None)
    spec = images.ImageSpec(registry="")  # docker build --registry ""
    with pytest.raises(LlamaspecError, match="--registry is empty"):
        images.validate(spec, load_engines(ROOT))


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--registry", ""], {}, "--registry is empty"),
        (["--registry", "https://ghcr.io/acme"], {}, "is not a registry address"),
        ([], {"LLAMASPEC_REGISTRY": ""}, "LLAMASPEC_REGISTRY is empty"),
    ],
)
def test_the_cli_refuses_a_bad_registry_before_any_container_tool(
    args: list[str], env: dict, said: str, tmp_path: Path
) -> None:
    proc = cli(
        "docker", "pull", "--backend", "cpu", *args, env_cache=tmp_path,
        path=str(tmp_path / "no-tools"), env={**env, "LLAMASPEC_CONFIG_DIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "has no image" not in proc.stderr
    assert said in " ".join(proc.stderr.split())


# --- small ones ----------------------------------------------------------------------------


def _entrypoint(tmp_path: Path, needs: str, labels: str) -> str:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "bin" / "llama-server").write_text("#!/bin/sh\n")
    (root / "bin" / "llama-server").chmod(0o755)
    (root / "cpu-needs.txt").write_text(needs)
    (root / "labels.txt").write_text(labels)
    proc = subprocess.run(
        ["sh", str(ROOT / "docker" / "entrypoint.sh")],
        env={"PATH": "/usr/bin:/bin", "LLAMASPEC_ROOT": str(root),
             "LLAMASPEC_PORT_FILE": str(tmp_path / "port")},
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return " ".join(proc.stderr.split())


def test_the_entrypoints_cpu_refusal_names_a_fix_for_the_image_it_is(tmp_path: Path) -> None:
    native = _entrypoint(
        tmp_path,
        "sse2 no_such_flag\nGGML_NATIVE=ON: built for the image builder's CPU\n",
        "engine=llama.cpp\nbackend=cpu\n",
    )
    assert "this CPU lacks no_such_flag" in native
    assert "Pull the upstream (llama.cpp) image" not in native  # the image it is
    assert "built for that machine's CPU only" in native
    assert "llamaspec docker build --engine llama.cpp --backend cpu" in native
    ik = _entrypoint(
        tmp_path,
        "no_such_flag\nik_llama.cpp compiled for a fixed instruction-set baseline\n",
        "engine=ik_llama.cpp\nbackend=cpu\n",
    )
    assert "Pull the upstream (llama.cpp) image" in ik and "--from-artifact ID --allow-native" in ik
    raised = _entrypoint(tmp_path, "avx512f no_such_flag\nbaseline\n", "engine=llama.cpp\n")
    assert "Pull the upstream" not in raised and "without the defines" in raised


def test_a_from_artifact_build_leaves_no_container_or_image_behind(tmp_path: Path) -> None:
    """buildah keeps a working container for a stage that is only `FROM <stage>`, and an
    untagged image per stage (seen with buildah 1.28; `--layers=false` instead fails at the
    end with "identifier is not an image"): --force-rm leaves no container, and the untagged
    images a build made are removed after it, failed or not, and only those."""
    dockerfile, context = ROOT / "docker" / "Dockerfile.cpu", ROOT
    for settings in (tools.BuildSettings(pull_never=True, keep_layers=k) for k in (True, False)):
        argv = tools.Buildah().build_argv(dockerfile, context, "runtime", {}, settings)
        assert "--force-rm" in argv and "--layers" in argv and "--layers=false" not in argv
    state, log = tmp_path / "untagged", tmp_path / "calls"
    state.write_text("sha256:old\n")
    fake = tmp_path / "buildah"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nif [ "$1" = images ]; then cat {state}; fi\n')
    fake.chmod(0o755)
    tool = tools.Buildah(str(fake))
    with pytest.raises(RuntimeError), tool.new_images_removed():
        state.write_text("sha256:old\nsha256:new1\nsha256:new2\n")  # the build made two
        raise RuntimeError("the build failed")
    calls = log.read_text().splitlines()
    assert calls[-1] == "rmi sha256:new1 sha256:new2"  # the user's own untagged one stays
    log.write_text("")
    with tool.new_images_removed():
        pass  # a build that made none: nothing removed
    assert not any(c.startswith("rmi") for c in log.read_text().splitlines())


def test_the_image_source_comes_from_the_project_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLAMASPEC_SOURCE_URL", raising=False)
    assert build.source_url(ROOT) == "https://github.com/llamaspec/llamaspec"
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[project.urls]\nHomepage = "https://example.org"\n'
        'Repository = "https://github.com/acme/fork"\n\n[tool.x]\nSource = "https://no"\n'
    )
    assert build.source_url(tmp_path) == "https://github.com/acme/fork"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    remote_add = ["git", "-C", str(tmp_path), "remote", "add", "origin"]
    subprocess.run([*remote_add, "git@github.com:acme/llamaspec.git"], check=True)
    assert build.source_url(tmp_path) == "https://github.com/acme/llamaspec"
    subprocess.run(
        ["git", "-C", str(tmp_path), "remote", "set-url", "origin", "/srv/git/x"], check=True
    )
    assert build.source_url(tmp_path) == ""
    monkeypatch.setenv("LLAMASPEC_SOURCE_URL", "https://github.com/ci/run")
    assert build.source_url(tmp_path) == "https://github.com/ci/run"


def test_pull_help_says_the_backend_is_this_hosts(capsys: pytest.CaptureFixture) -> None:
    from llamaspec.cli.main import make_parser

    with pytest.raises(SystemExit):
        make_parser().parse_args(["docker", "pull", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--backend BACKEND cpu, cuda or vulkan (default: this host's)" in text
    assert "cpu (default)" not in text


def test_a_required_signature_refuses_without_cosign_and_an_empty_payload_refuses(
    tmp_path: Path,
) -> None:
    """Verification a user can require (issue 54): with it, no cosign is a refusal rather
    than a line; and a verified signature whose output names no digest cannot tie the pull
    to what was verified, so the pull stops instead of falling back to the tag."""
    console = Console(record=True, width=300)
    ref = f"ghcr.io/acme/llamaspec@{DIGEST}"
    assert registry.verify_signature(ref, console, lambda _: None) is None
    assert "NOT verified" in console.export_text()
    with pytest.raises(LlamaspecError, match="a verified signature is required"):
        registry.verify_signature(ref, console, lambda _: None, required=True)
    empty = registry.Verified(ref, "identity", frozenset())
    with pytest.raises(LlamaspecError, match="named no image digest"):
        registry.pinned_digest("ghcr.io/acme/llamaspec:llama.cpp-cpu", None, empty)
    with pytest.raises(LlamaspecError, match="named no image digest"):
        registry.pinned_digest("ghcr.io/acme/llamaspec:llama.cpp-cpu", DIGEST, empty)


def test_the_user_config_can_require_signatures(tmp_path: Path, monkeypatch) -> None:
    cfg = tmp_path / "config.yaml"
    monkeypatch.setenv("LLAMASPEC_CONFIG", str(cfg))
    cfg.write_text("require_signature: true\n")
    assert registry.signature_required() is True
    cfg.write_text("registry: ghcr.io/acme\n")
    assert registry.signature_required() is False
    cfg.write_text("require_signature: yes-please\n")
    with pytest.raises(LlamaspecError, match="require_signature"):
        registry.signature_required()
