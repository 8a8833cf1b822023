"""One table of `LLAMASPEC_*` environment variables (llamaspec/env.py): the code reads exactly
the variables it lists, and the docs name no other."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

import llamaspec
from llamaspec import env

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(llamaspec.__file__).parent
NAME = re.compile(r"\bLLAMASPEC_[A-Z0-9_]*[A-Z0-9]\b")  # `LLAMASPEC_*` is not a name


def named(text: str) -> set[str]:
    """Every LLAMASPEC_ name a text spells out (code, strings, comments alike)."""
    return set(NAME.findall(text))


def referenced(tree: ast.AST) -> set[str]:
    """The table's variables a module names through its constants (`env.CACHE.name`,
    `from llamaspec.env import CACHE`) rather than by spelling them."""
    modules, names = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "llamaspec":
            modules |= {a.asname or a.name for a in node.names if a.name == "env"}
        elif isinstance(node, ast.ImportFrom) and node.module == "llamaspec.env":
            names |= {a.asname or a.name: a.name for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "llamaspec.env" and a.asname}
    found = set()
    for node in ast.walk(tree):
        attr = None
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in modules:
                attr = node.attr
            elif (
                isinstance(base, ast.Attribute)
                and base.attr == "env"
                and isinstance(base.value, ast.Name)
                and base.value.id == "llamaspec"
            ):
                attr = node.attr  # llamaspec.env.CACHE
        elif isinstance(node, ast.Name) and node.id in names:
            attr = names[node.id]
        if attr and isinstance(var := getattr(env, attr, None), env.EnvVar):
            found.add(var.name)
    return found


def read_by_code(package: Path, docker: Path | None = None) -> dict[str, set[str]]:
    """Variable → the files that read or name it: the package's modules (the table's own
    module aside) and the image's scripts and Dockerfiles."""
    out: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path == package / "env.py":
            continue
        text = path.read_text(encoding="utf-8")
        for name in named(text) | referenced(ast.parse(text)):
            out.setdefault(name, set()).add(path.relative_to(package.parent).as_posix())
    for path in sorted(docker.iterdir()) if docker else []:
        if path.is_file():
            for name in named(path.read_text(encoding="utf-8", errors="replace")):
                out.setdefault(name, set()).add(f"docker/{path.name}")
    return out


def differences(read: dict[str, set[str]], table: dict[str, env.EnvVar]) -> list[str]:
    wrong = [
        f"{name} is read by {', '.join(sorted(where))} but not declared in llamaspec/env.py"
        for name, where in sorted(read.items())
        if name not in table
    ]
    wrong += [f"{name} is in llamaspec/env.py but nothing reads it" for name in table.keys() - read]
    return sorted(wrong)


def test_the_code_reads_exactly_the_variables_of_the_table() -> None:
    read = read_by_code(PACKAGE, ROOT / "docker")
    assert not differences(read, env.BY_NAME), "\n".join(differences(read, env.BY_NAME))
    # the ones an image reads are read there, not by llamaspec alone
    for var in env.VARIABLES:
        if var.read_by == env.IMAGE:
            assert any(w.startswith("docker/") for w in read[var.name]), var.name


def test_the_check_finds_a_variable_missing_from_the_table_and_one_nothing_reads(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "llamaspec"
    (pkg / "sub").mkdir(parents=True)
    unknown = "LLAMASPEC_" + "NOT_DECLARED"  # spelt in two pieces: this file is not scanned
    (pkg / "sub" / "reader.py").write_text(
        f'import os\nfrom llamaspec import env\nX = os.environ.get("{unknown}")\n'
        "Y = os.environ.get(env.CACHE.name)\n"
    )
    (pkg / "other.py").write_text("from llamaspec.env import DATA as D\nZ = D.name\n")
    read = read_by_code(pkg)
    assert read == {
        unknown: {"llamaspec/sub/reader.py"},
        env.CACHE.name: {"llamaspec/sub/reader.py"},
        env.DATA.name: {"llamaspec/other.py"},
    }
    wrong = differences(read, env.BY_NAME)
    declared = "but not declared in llamaspec/env.py"
    assert f"{unknown} is read by llamaspec/sub/reader.py {declared}" in wrong
    assert f"{env.ROOT.name} is in llamaspec/env.py but nothing reads it" in wrong
    assert not any(env.CACHE.name in w or env.DATA.name in w for w in wrong)


def test_the_docs_tests_and_workflows_name_no_variable_the_table_lacks() -> None:
    wrong = []
    files = [ROOT / "README.md", ROOT / "noxfile.py", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / ".github").rglob("*.yml"))
    for path in files:
        if path.resolve() == Path(__file__).resolve():
            continue
        for name in sorted(named(path.read_text(encoding="utf-8")) - env.BY_NAME.keys()):
            wrong.append(f"{path.relative_to(ROOT)} names {name}, which llamaspec/env.py lacks")
    assert not wrong, "\n".join(wrong)


def test_the_table_is_one_frozen_record_per_variable_and_renders_every_one() -> None:
    names = [v.name for v in env.VARIABLES]
    assert len(names) == len(set(names)) == len(env.BY_NAME)
    declared = [v for v in vars(env).values() if isinstance(v, env.EnvVar)]
    assert sorted(v.name for v in declared) == sorted(names), "a constant left out of VARIABLES"
    for var in env.VARIABLES:
        assert NAME.fullmatch(var.name) and var.meaning and var.default, var
        assert var.read_by in (env.LLAMASPEC, env.IMAGE), var
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.CACHE.default = "x"  # type: ignore[misc]
    page = env.markdown()
    for var in env.VARIABLES:
        row = next(ln for ln in page.splitlines() if ln.startswith(f"| `{var.name}` |"))
        assert row.count(" | ") == 3, row  # four cells, the last what it takes: no stray pipe
    llamaspec_part, image_part = page.split("## Inside an image")
    assert f"`{env.PORT.name}`" in image_part and f"`{env.PORT.name}`" not in llamaspec_part


def test_the_defaults_the_table_states_are_the_code_s() -> None:
    from llamaspec.engine.vulkan import headers as vulkan_headers
    from llamaspec.images import specs
    from llamaspec.maint import bump
    from llamaspec.proof import smoke

    assert f"`{vulkan_headers.MIRROR}`" == env.DEBIAN_MIRROR.default
    assert f"`{bump.PYPI_URL}`" == env.PYPI_URL.default
    assert f"`{specs.DEFAULT_REGISTRY}`" in env.REGISTRY.default
    ready = dict((n, v) for n, v, _ in smoke.VULKAN_SMOKE_ENV)[env.SERVER_READY_TIMEOUT.name]
    assert ready in env.SERVER_READY_TIMEOUT.default
    docker = ROOT / "docker"
    assert "LLAMASPEC_HOST=0.0.0.0 LLAMASPEC_PORT=8080" in (docker / "Dockerfile.cpu").read_text()
    assert env.PORT_FILE.default.strip("`") in (docker / "entrypoint.sh").read_text()


@pytest.mark.parametrize("value", ["abc", "nan", "-1", "0", "inf", "1e999", " 5", "1_0", "5\n"])
def test_a_bad_number_of_seconds_is_one_paragraph_naming_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamaspec.errors import LlamaspecError

    monkeypatch.setenv(env.SERVER_READY_TIMEOUT.name, value)
    with pytest.raises(LlamaspecError) as err:
        env.check()
    said = str(err.value)
    assert env.SERVER_READY_TIMEOUT.name in said and repr(value) in said
    assert "=1800" in said and "\n" not in said.replace(repr(value), "")
    with pytest.raises(LlamaspecError):
        env.seconds(env.SERVER_READY_TIMEOUT, 900.0)


@pytest.mark.parametrize(("value", "seconds"), [("1800", 1800.0), ("2.5", 2.5), ("", 900.0)])
def test_a_good_number_of_seconds_is_read(
    value: str, seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env.SERVER_READY_TIMEOUT.name, value)
    env.check()
    assert env.seconds(env.SERVER_READY_TIMEOUT, 900.0) == seconds


def test_the_server_start_reads_its_limit_through_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`running` refuses a bad limit before it starts anything (no server blamed for it)."""
    from llamaspec.errors import LlamaspecError
    from llamaspec.runtime import client

    monkeypatch.setenv(env.SERVER_READY_TIMEOUT.name, "nan")
    with (
        pytest.raises(LlamaspecError, match="not a number of seconds"),
        client.running(tmp_path / "no-server", [], tmp_path / "log" / "server.log"),
    ):
        pass
    assert not (tmp_path / "log").exists()


def test_the_code_reads_a_variable_through_the_table_never_by_its_name() -> None:
    """`os.environ.get("LLAMASPEC_X")` and the like stay out of the package: reads go
    through `env.get(env.X)` (or `env.raw`), so a variable's name is written once."""
    spelled = re.compile(r"""(?:environ(?:\.get\(|\[)|getenv\()\s*(?:f?["'])LLAMASPEC_""", re.S)
    bad = [
        f"{p.relative_to(PACKAGE)}: {m[0]}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "env.py"
        for m in spelled.finditer(p.read_text())
    ]
    assert not bad, bad
    probe = tmp = "LLAMASPEC_" + "PROBE"  # spelt in two pieces: the scan must see the form
    assert spelled.search(f'os.environ.get("{tmp}")') and spelled.search(f"os.getenv('{probe}')")
