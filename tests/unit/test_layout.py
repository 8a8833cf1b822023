"""The package layout shows the pipeline: every import runs down it, never up."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

import llamaspec

pytestmark = pytest.mark.unit

PACKAGE = Path(llamaspec.__file__).parent
# Lowest first. A module may import its own layer and any layer before it.
LAYERS = ("base", "engine", "models", "runtime", "proof", "perf", "images", "maint", "cli")
# Base modules; `config` may be a module or a package: all of llamaspec.config.* is base.
BASE = {"errors", "paths", "pathcheck", "env", "config", "lock", "procs", "progress", "netaddr"}


def _layer(module: str) -> str:
    """`llamaspec.engine.build` → engine; `llamaspec.errors`, `llamaspec.config.x` → base."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in BASE or parts[1] == "__init__":
        return "base"
    return parts[1]


def _module(path: Path, package: Path) -> str:
    """`<package>/engine/build.py` → `llamaspec.engine.build`; a package's `__init__.py` → the
    package's name."""
    rel = path.relative_to(package.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _is_module(name: str, package: Path) -> bool:
    """Whether a dotted name is a module or a package of the tree under `package`."""
    where = package.parent / name.replace(".", "/")
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _imports(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """Every module of the package a file imports, at top level or inside functions."""
    top = package.name
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; write {top}.… in full")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == top:
            for alias in node.names:
                # `from llamaspec.engine import build` names the module llamaspec.engine.build
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if _is_module(sub, package) else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == top]
    return found


def upward_imports(package: Path) -> list[str]:
    """`file:line imports X (up the pipeline)` for every import that runs up the floors."""
    wrong = []
    for path in sorted(package.rglob("*.py")):
        mine = LAYERS.index(_layer(_module(path, package)))
        for line, target in _imports(path, package):
            if target == package.name:
                continue
            theirs = LAYERS.index(_layer(target))
            if theirs > mine:
                wrong.append(
                    f"{path.relative_to(package)}:{line} imports {target} (up the pipeline)"
                )
    return wrong


Graph = dict[str, dict[str, str]]  # module → imported module → where (`cli/main.py:12`)


def import_graph(package: Path) -> Graph:
    """Which module of the package imports which, lazy imports included (a module importing
    itself, or its own package's `__init__`, is left out: that is no cycle between two)."""
    graph: Graph = {}
    for path in sorted(package.rglob("*.py")):
        mine = _module(path, package)
        edges = graph.setdefault(mine, {})
        for line, target in _imports(path, package):
            if target != mine:
                edges.setdefault(target, f"{path.relative_to(package).as_posix()}:{line}")
    return graph


def _components(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _shortest_cycle(graph: Graph, group: list[str]) -> list[str]:
    """A shortest cycle through the group's first module, by breadth-first search."""
    start, inside = group[0], set(group)
    came: dict[str, str] = {}
    queue = [start]
    for node in queue:
        for nxt in sorted(graph.get(node, {})):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, start]
            if nxt in inside and nxt not in came:
                came[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start} in {group}")


def import_cycles(package: Path, graph: Graph | None = None) -> list[str]:
    """One line per strongly connected component: its modules and a cycle through them,
    with where each import is (`a (a.py:3) → b (b.py:9) → a`)."""
    graph = import_graph(package) if graph is None else graph
    out = []
    for group in _components(graph):
        cycle = _shortest_cycle(graph, group)
        steps = [f"{a} ({graph[a][b]})" for a, b in itertools.pairwise(cycle)]
        out.append(f"{', '.join(group)}: " + " → ".join([*steps, cycle[-1]]))
    return out


def test_every_module_lives_in_a_stage_subpackage() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert set(top) <= BASE, f"modules outside the stage subpackages: {set(top) - BASE}"
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages <= set(LAYERS) | BASE, f"unknown subpackages: {packages - set(LAYERS) - BASE}"
    for pkg in LAYERS[1:]:
        doc = ast.get_docstring(ast.parse((PACKAGE / pkg / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"{pkg}/__init__.py must say what it may import"


def test_imports_run_down_the_pipeline() -> None:
    wrong = upward_imports(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    """No two modules import each other, directly or through others (lazy imports count:
    a cycle is a layering knot even where Python happens to resolve it)."""
    cycles = import_cycles(PACKAGE)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _plant(root: Path, files: dict[str, str]) -> Path:
    """A throwaway package named like ours, with these files (and empty `__init__.py`s)."""
    package = root / PACKAGE.name
    for rel, text in files.items():
        path = package / rel
        for folder in reversed(path.relative_to(package).parents):  # ., then down to path's
            (package / folder).mkdir(parents=True, exist_ok=True)
            init = package / folder / "__init__.py"
            if not init.exists():
                init.write_text('"""May import: the base modules."""\n')
        path.write_text(text)
    return package


def test_the_checks_flag_a_planted_cycle_and_a_planted_upward_import(tmp_path: Path) -> None:
    package = _plant(
        tmp_path,
        {
            "errors.py": "class E(Exception): ...\n",
            "config/recipes.py": "from llamaspec.errors import E\n",
            # a → b at top level, b → c inside a function, c → a: one cycle of three
            "engine/a.py": "from llamaspec.engine import b\nfrom llamaspec.config import recipes\n",
            "engine/b.py": "def f():\n    import llamaspec.engine.c\n",
            "engine/c.py": "from llamaspec.engine.a import thing\n",
            # down the floors, no cycle: not flagged
            "proof/d.py": "from llamaspec.engine import c\nfrom llamaspec import errors\n",
            # up the floors: engine may not import cli (nor is cli importing it back)
            "engine/up.py": "\n\ndef late():\n    from llamaspec.cli.main import run\n",
            "cli/main.py": "def run(): ...\n",
        },
    )
    assert upward_imports(package) == [
        "engine/up.py:4 imports llamaspec.cli.main (up the pipeline)"
    ]
    assert import_cycles(package) == [
        "llamaspec.engine.a, llamaspec.engine.b, llamaspec.engine.c: "
        "llamaspec.engine.a (engine/a.py:1) → llamaspec.engine.b (engine/b.py:2) → "
        "llamaspec.engine.c (engine/c.py:1) → llamaspec.engine.a"
    ]
    # two modules that import each other, beside the first knot: each is reported
    (package / "proof" / "e.py").write_text("from llamaspec.proof import d\n")
    (package / "proof" / "d.py").write_text("import llamaspec.proof.e\n")
    cycles = import_cycles(package)
    assert len(cycles) == 2 and cycles[1] == (
        "llamaspec.proof.d, llamaspec.proof.e: llamaspec.proof.d (proof/d.py:1) → "
        "llamaspec.proof.e (proof/e.py:1) → llamaspec.proof.d"
    )
    # and a tree without them passes both checks
    (package / "engine" / "c.py").write_text("from llamaspec.errors import E\n")
    (package / "proof" / "d.py").write_text("from llamaspec.engine import c\n")
    (package / "engine" / "up.py").write_text("from llamaspec.config import recipes\n")
    assert upward_imports(package) == [] and import_cycles(package) == []
    (package / "engine" / "rel.py").write_text("from . import a\n")
    with pytest.raises(AssertionError, match="rel.py:1: relative import"):
        import_graph(package)


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


# ---------------------------------------------------------------- module size, thin CLI

MAX_LINES = 600
# Modules allowed over MAX_LINES, each with the reason it cannot be split by job. Empty: a
# module that grows past the limit is split by what it does (runner / report / plans), not
# listed here.
LONG_MODULES: dict[str, str] = {}


def long_modules(package: Path) -> dict[str, int]:
    """`engine/build.py` → lines, for every module over MAX_LINES."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out[path.relative_to(package).as_posix()] = lines
    return out


def test_no_module_is_over_600_lines() -> None:
    """A module over MAX_LINES holds several jobs; split it by job (or list it, with why)."""
    long = long_modules(PACKAGE)
    unexplained = {p: n for p, n in long.items() if p not in LONG_MODULES}
    assert not unexplained, f"modules over {MAX_LINES} lines: {unexplained}"
    stale = set(LONG_MODULES) - set(long)
    assert not stale, f"LONG_MODULES lists modules no longer over {MAX_LINES} lines: {stale}"


# The floors a CLI handler calls into (the base modules and cli/ itself are free to import).
STAGES = frozenset(LAYERS) - {"base", "cli"}
# Stage modules one function of cli/ may import: the one whose function runs the command,
# and one that turns an option into a value (the artifact an id names, workload names).
CLI_STAGE_IMPORTS = 2


def _stage_imports(
    node: ast.AST, package: Path, where: str, out: list[tuple[int, str, str]]
) -> None:
    """(line, stage module, where) for each import of a stage module under `node`: `where`
    is the top-level function it sits in, `<module>`, or `<type-checking>` (an
    `if TYPE_CHECKING:` block: for annotations, never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and where == "<module>":
            _stage_imports(child, package, child.name, out)
        elif isinstance(child, ast.If) and ast.unparse(child.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            _stage_imports(child, package, "<type-checking>", out)
        elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("llamaspec."):
            for alias in child.names:
                sub = f"{child.module}.{alias.name}"
                target = sub if _is_module(sub, package) else child.module or ""
                if _layer(target) in STAGES:
                    out.append((child.lineno, target, where))
        elif isinstance(child, ast.Import):
            for alias in child.names:
                if alias.name.startswith("llamaspec.") and _layer(alias.name) in STAGES:
                    out.append((child.lineno, alias.name, where))
        else:
            _stage_imports(child, package, where, out)


def thick_cli(package: Path) -> list[str]:
    """Where cli/ does more than parse and hand over: a stage module imported at module level
    (every `llamaspec --help` would load it), or a function importing more than
    CLI_STAGE_IMPORTS stage modules (it orchestrates stages: that belongs in a stage)."""
    wrong = []
    for path in sorted((package / "cli").glob("*.py")):
        found: list[tuple[int, str, str]] = []
        _stage_imports(ast.parse(path.read_text(encoding="utf-8")), package, "<module>", found)
        rel = path.relative_to(package).as_posix()
        wrong += [f"{rel}:{n} imports {m} at module level" for n, m, w in found if w == "<module>"]
        by_function: dict[str, set[str]] = {}
        for _n, module, where in found:
            if not where.startswith("<"):
                by_function.setdefault(where, set()).add(module)
        wrong += [
            f"{rel}: {name}() imports {len(mods)} stage modules ({', '.join(sorted(mods))})"
            for name, mods in by_function.items()
            if len(mods) > CLI_STAGE_IMPORTS
        ]
    return wrong


def test_the_cli_only_parses_and_hands_over() -> None:
    """Each handler imports its stage lazily and calls one function of it (with at most one
    more stage module to turn an option into a value); orchestration lives in the stages."""
    wrong = thick_cli(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_the_thin_cli_check_flags_a_dispatch_chain(tmp_path: Path) -> None:
    """The check catches what cli/ used to hold: a module-level stage import and one
    `dispatch` function that imports the image modules and branches over the commands."""
    package = _plant(
        tmp_path,
        {
            "images/build.py": "",
            "images/specs.py": "",
            "images/tools.py": "",
            "images/smoke.py": "",
            "engine/artifact.py": "",
            "cli/docker.py": (
                "from typing import TYPE_CHECKING\n"
                "from llamaspec.images import specs\n"
                "if TYPE_CHECKING:\n"
                "    from llamaspec.engine.artifact import Artifact\n"
                "def dispatch(args):\n"
                "    from llamaspec.images import build, specs, tools\n"
                "    if args.command == 'smoke':\n"
                "        from llamaspec.images.smoke import smoke_image\n"
                "def cmd_docker_smoke(args):\n"
                "    from llamaspec.images import tools\n"
                "    from llamaspec.images.smoke import smoke_image\n"
            ),
        },
    )
    assert thick_cli(package) == [
        "cli/docker.py:2 imports llamaspec.images.specs at module level",
        "cli/docker.py: dispatch() imports 4 stage modules (llamaspec.images.build, "
        "llamaspec.images.smoke, llamaspec.images.specs, llamaspec.images.tools)",
    ]
    (package / "cli" / "docker.py").write_text(
        "def cmd_docker_smoke(args):\n"
        "    from llamaspec.images import tools\n"
        "    from llamaspec.images.smoke import smoke_image\n"
    )
    assert thick_cli(package) == []
    assert long_modules(package) == {}
    (package / "images" / "build.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(package) == {"images/build.py": MAX_LINES + 1}


def test_no_floor_compares_backend_names_outside_the_backend_interface() -> None:
    """Issue 55: what a backend is lives in `engine/backends.py` (`Backend`); the rest of
    the package asks its fields instead of comparing `"cuda"`, `"vulkan"` or `"cpu"`."""
    import re

    compare = re.compile(
        r"""[!=]=\s*["'](?:cpu|cuda|vulkan)["']|["'](?:cpu|cuda|vulkan)["']\s*[!=]="""
    )
    found = [
        f"{p.relative_to(PACKAGE)}: {m[0]}"
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.relative_to(PACKAGE).as_posix() != "engine/backends.py"
        for m in compare.finditer(p.read_text())
    ]
    assert not found, found
