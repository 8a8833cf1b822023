"""The publishing workflow cannot run here: it is checked against GitHub's workflow schema,
its `llamaspec` commands must parse with the real CLI, and its steps must come in the order
that makes publishing safe (smoke before push, sign the pushed digest)."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llamaspec.cli import docker as cli_docker
from llamaspec.images import specs as images
from llamaspec.images.build import BuiltImage

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "docker.yml"


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps(workflow: dict) -> list[dict]:
    return workflow["jobs"]["image"]["steps"]


def test_matches_githubs_workflow_schema() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            str(WORKFLOW),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llamaspec", exit_on_error=False)
    cli_docker.add_parsers(parser.add_subparsers(dest="command", required=True))
    return parser


def _commands(run: str) -> list[list[str]]:
    """Every `llamaspec …` command in a run script, with expressions made concrete."""
    text = re.sub(r"\$\{\{\s*matrix\.engine\s*\}\}", "llama.cpp", run)
    text = re.sub(r"\$\{\{\s*matrix\.backend\s*\}\}", "cpu", text)
    text = re.sub(r'"\$\(jq[^)]*\)"', "IMAGE", text)
    out = [shlex.split(m)[1:] for m in re.findall(r"\$\((llamaspec [^)]*)\)", text)]
    for line in text.splitlines():
        words = shlex.split(line.split(">>")[0])
        if words and words[0] == "llamaspec":
            out.append(words[1:])
    return out


def test_every_llamaspec_command_parses(workflow: dict) -> None:
    jobs = [workflow["jobs"]["matrix"]["steps"], steps(workflow)]
    runs = [
        " ".join(s["run"].split("\n")) if ">-" in s else s["run"]
        for j in jobs
        for s in j
        if "run" in s
    ]
    found = [cmd for run in runs for cmd in _commands(run)]
    assert [c[:2] for c in found] == [
        ["docker", "matrix"],
        ["docker", "build"],
        ["docker", "smoke"],
        ["docker", "push"],
    ]
    parser = _parser()
    for cmd in found:
        args = parser.parse_args(cmd)
        assert args.command == "docker"
        if args.docker_command == "build":
            assert (args.tool, args.engine, args.backend) == ("docker", "llama.cpp", "cpu")
            assert args.out == Path("build.json") and args.registry == "$REGISTRY"


def test_publishing_order_and_permissions(workflow: dict) -> None:
    job = workflow["jobs"]["image"]
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
    assert job["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.matrix) }}"
    names = [s.get("name", s.get("uses", "")) for s in steps(workflow)]

    def index(word: str) -> int:
        return next(i for i, n in enumerate(names) if word in n)

    assert index("Build") < index("Smoke") < index("Push") < index("SBOM") < index("Sign")
    smoke = steps(workflow)[index("Smoke")]
    assert smoke["if"] == "matrix.smoke == 'true'"
    sign = steps(workflow)[index("Sign")]
    assert sign["env"]["REF"] == "${{ steps.push.outputs.ref }}"
    assert 'cosign sign --yes "$REF"' in sign["run"]
    assert steps(workflow)[index("SBOM")]["with"]["image"] == "${{ steps.push.outputs.ref }}"
    assert "type=gha" in job["env"]["LLAMASPEC_BUILDX_CACHE"]


def test_build_record_has_what_the_workflow_reads() -> None:
    """`jq -r '.tags[0]' build.json` and `docker push --record` read the record's tags."""
    manifest = {"artifact_id": "llamacpp-cpu-0123456789ab", "commit": "a" * 40}
    spec = images.ImageSpec(registry="ghcr.io/owner")
    record = BuiltImage(spec, tuple(images.tags(spec, manifest)), {}, manifest, "docker")
    data = record.to_json()
    assert data["tags"][0] == "ghcr.io/owner/llamaspec:llama.cpp-cpu-aaaaaaa-0123456789ab"
    assert data["artifact_id"] == manifest["artifact_id"]


CHECKS = ROOT / ".github" / "workflows" / "checks.yml"


def _triggers(flow: dict) -> dict:
    return flow[True]  # YAML 1.1 reads the key `on` as True


def test_checks_run_lint_docs_and_unit_tests_on_every_pull_request_and_push() -> None:
    schema = ("--builtin-schema", "vendor.github-workflows")
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", *schema, str(CHECKS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flow = yaml.safe_load(CHECKS.read_text())
    triggers = _triggers(flow)
    assert {"pull_request", "push", "workflow_call"} <= set(triggers)
    # no branch filter: every pull request and every push
    assert not (triggers["pull_request"] or triggers["push"])
    assert flow["permissions"] == {"contents": "read"}
    runs = [s["run"] for job in flow["jobs"].values() for s in job["steps"] if "run" in s]
    for command in ("nox -s lint", "nox -s docs", "nox -s unit"):
        assert command in runs, command
    assert all("permissions" not in job for job in flow["jobs"].values())


def test_images_are_published_only_from_main_after_the_checks(workflow: dict) -> None:
    triggers = _triggers(workflow)
    assert set(triggers) == {"push", "workflow_dispatch"}, "never on a pull request"
    assert triggers["push"] == {"branches": ["main"]}
    jobs = workflow["jobs"]
    assert jobs["checks"]["uses"] == "./.github/workflows/checks.yml"
    assert jobs["checks"]["permissions"] == {"contents": "read"}
    assert jobs["matrix"]["needs"] == "checks"
    assert jobs["matrix"]["if"] == "github.ref == 'refs/heads/main'"
    assert "checks" in jobs["image"]["needs"] and "matrix" in jobs["image"]["needs"]
    # the jobs that can write packages or sign are the image job alone
    writers = [name for name, job in jobs.items() if "write" in str(job.get("permissions", {}))]
    assert writers == ["image"]


def test_lint_runs_actionlint_over_every_workflow() -> None:
    noxfile = (ROOT / "noxfile.py").read_text()
    lint = noxfile[noxfile.index("def lint(") :].split("\n\n\n")[0]
    assert "actionlint" in lint and '".github/workflows"' in lint
    assert '"actionlint", *workflows' in lint
