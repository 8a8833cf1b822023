"""The package layout shows the pipeline: every import runs down it, never up."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llamaspec

pytestmark = pytest.mark.unit

PACKAGE = Path(llamaspec.__file__).parent
# Lowest first. A module may import its own layer and any layer before it.
LAYERS = ("base", "engine", "models", "runtime", "proof", "perf", "images", "maint", "cli")
BASE = {"errors", "paths", "config", "lock", "procs", "progress", "netaddr"}


def _layer(module: str) -> str:
    """`llamaspec.engine.build` → engine; `llamaspec.errors` → base."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in BASE or parts[1] == "__init__":
        return "base"
    return parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every llamaspec module a file imports, at top level or inside functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llamaspec"):
            assert node.level == 0, f"{path}: relative import; write llamaspec.… in full"
            for alias in node.names:
                # `from llamaspec.engine import build` names the module llamaspec.engine.build
                sub = f"{node.module}.{alias.name}"
                as_module = (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").is_file()
                found.append((node.lineno, sub if as_module else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("llamaspec")]
    return found


def test_every_module_lives_in_a_stage_subpackage() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert set(top) <= BASE, f"modules outside the stage subpackages: {set(top) - BASE}"
    for pkg in LAYERS[1:]:
        doc = ast.get_docstring(ast.parse((PACKAGE / pkg / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"{pkg}/__init__.py must say what it may import"


def test_imports_run_down_the_pipeline() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        mine = LAYERS.index(_layer(module))
        for line, target in _imports(path):
            if target == "llamaspec":
                continue
            theirs = LAYERS.index(_layer(target))
            if theirs > mine:
                wrong.append(
                    f"{path.relative_to(PACKAGE)}:{line} imports {target} (up the pipeline)"
                )
    assert not wrong, "\n".join(wrong)


def test_no_module_reaches_into_another_modules_private_names() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        ours = set()  # local names bound to llamaspec modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("llamaspec"):
                ours |= {a.asname or a.name for a in node.names}
                wrong += [
                    f"{path.name}: imports {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"
                ]
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in ours
            ):
                wrong.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default import mode needs one basename per test module across tests/."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        other = seen.setdefault(path.name, path)
        assert other == path, f"{path} and {other} share a basename; rename one"


def test_an_installed_llamaspec_writes_its_lock_under_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llamaspec import lock, paths

    monkeypatch.setenv("LLAMASPEC_DATA", str(tmp_path / "data"))
    packaged = paths.packaged_data()
    assert paths.is_packaged(packaged) and not paths.is_packaged(tmp_path)
    assert paths.writable_root(packaged) == tmp_path / "data"
    assert paths.writable_root(tmp_path) == tmp_path
    record = {"models": {"m": {"repo": "org/m", "revision": "a" * 40}}}
    assert lock.save(packaged, record) == tmp_path / "data" / "llamaspec.lock"
    assert lock.load(packaged)["models"] == record["models"]
    assert not (packaged / "llamaspec.lock").exists()


def test_the_config_package_is_base() -> None:
    """config/ is a package of base modules (one per schema), below every stage."""
    assert (PACKAGE / "config" / "__init__.py").is_file()
    assert {_layer(f"llamaspec.config.{p.stem}") for p in (PACKAGE / "config").glob("*.py")} == {
        "base"
    }
