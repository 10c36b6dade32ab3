"""The package layout: imports run one way along the flow, with no cycles and no hidden local imports.

core -> client -> integrations -> promtext -> collect -> store -> query -> templating -> rules ->
notify -> web -> demo -> app -> cli. A module may import its own package and any package earlier in
the flow; the walk sees every import, including those inside functions and under `if TYPE_CHECKING`.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpuwatch"

# The flow, earliest first: one package each (`gpuwatch` is the top-level `__init__.py`, the version).
FLOW: list[str] = [
    "gpuwatch",
    # The kernel: plain data and the pieces every layer uses.
    "core",
    # The training SDK (ships into training jobs, needs only `requests`): it may import the core, and the
    # core never imports it.
    "client",
    # Training-library adapters (HF Trainer, Lightning): right after the SDK, so they can import it and
    # the core and nothing else of gpuwatch; a leaf that nothing imports (checked below).
    "integrations",
    "promtext",
    "collect",
    "store",
    # Prometheus remote write: the wire format and the receiver's checks (a source, like push); the
    # sender will read the store.
    "remote",
    "query",
    "templating",
    "rules",
    "notify",
    "web",
    "demo",
    # The assembly: settings, the object graph, scheduled jobs; then the command.
    "app",
    "cli",
]
RANK = {name: rank for rank, name in enumerate(FLOW)}
# Imports inside functions are allowed only where they keep a command's start-up short.
LAZY_ALLOWED = ("cli/",)
# ... and these, each an import along the flow (so no cycle hides behind it): the simulated NVML (and
# the demo's history of it) reads pynvml's names when imported, and a real start must not depend on it.
LAZY_ALLOWED_IMPORTS = {("app/build.py", "gpuwatch.demo.nvml"), ("app/build.py", "gpuwatch.demo.history")}


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    """Return the flow entry of a module: `gpuwatch.query.engine` -> `query`, `gpuwatch` -> `gpuwatch`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(path: Path, root: Path, modules: set[str]) -> list[tuple[int, str, bool]]:
    """Return (line, imported gpuwatch module, inside a function) for each import in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    local_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            local_lines.update(
                n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))
            )
    found: list[tuple[int, str, bool]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from pkg import submodule` depends on the submodule; `from mod import name` on the module
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        else:
            continue
        for name in names:
            if name in modules and name != module:
                found.append((node.lineno, name, node.lineno in local_lines))
    return found


@functools.lru_cache(maxsize=8)  # parsed once for all the checks of one tree
def _graph(root: Path) -> tuple[dict[str, Path], dict[str, list[tuple[int, str, bool]]]]:
    paths = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(paths)
    return paths, {m: _imports(p, root, modules) for m, p in paths.items()}


def layer_violations(root: Path = PACKAGE) -> list[str]:
    """Return one line per import that runs against the flow, or names a module outside it."""
    paths, graph = _graph(root)
    problems = []
    for module, imports in graph.items():
        unit = _unit(module)
        if unit not in RANK:
            problems.append(f"{module}: not in a package of the flow (add it to one)")
            continue
        for line, target, _ in imports:
            other = _unit(target)
            if other == unit or other not in RANK:
                continue
            if RANK[other] > RANK[unit]:
                problems.append(f"{paths[module].relative_to(root.parent)}:{line}: {module} imports {target}")
    return problems


def import_cycles(root: Path = PACKAGE) -> list[list[str]]:
    """Return each group of modules that import each other, directly or around a loop."""
    _, graph = _graph(root)
    edges = {m: sorted({t for _, t, _ in imports}) for m, imports in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return cycles


def hidden_local_imports(root: Path = PACKAGE) -> list[str]:
    """Return gpuwatch imports made inside functions outside the CLI, where they hide a cycle."""
    paths, graph = _graph(root)
    found = []
    for module, imports in graph.items():
        rel = paths[module].relative_to(root).as_posix()
        if rel.startswith(LAZY_ALLOWED):
            continue
        found += [
            f"{rel}:{line}: {target}"
            for line, target, local in imports
            if local and (rel, target) not in LAZY_ALLOWED_IMPORTS
        ]
    return sorted(set(found))


def test_imports_follow_the_flow() -> None:
    assert layer_violations() == []


def test_no_import_cycles() -> None:
    assert import_cycles() == []


def test_no_imports_inside_functions_outside_the_cli() -> None:
    assert hidden_local_imports() == []


def test_nothing_imports_the_integrations() -> None:
    """They import transformers or lightning, which gpuwatch does not depend on."""
    _, graph = _graph(PACKAGE)
    users = sorted(
        m
        for m, imports in graph.items()
        if _unit(m) != "integrations" and any(_unit(t) == "integrations" for _, t, _ in imports)
    )
    assert users == []


def test_only_the_store_opens_duckdb() -> None:
    """The schema is the store's secret: no other package imports duckdb."""
    users = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "duckdb" or n.startswith("duckdb.") for n in names):
                users.add(path.relative_to(PACKAGE).parts[0])
    assert users == {"store"}


def test_top_level_holds_only_packages() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == []


@pytest.mark.parametrize(
    ("module", "source", "problem"),
    [
        ("store/x.py", "from gpuwatch.web import create_app\n", "gpuwatch.store.x imports gpuwatch.web"),
        (
            "store/x.py",
            "def f():\n    from gpuwatch.app.config import load\n",
            "gpuwatch.store.x imports gpuwatch.app.config",
        ),
        ("core/x.py", "from gpuwatch.client import init\n", "gpuwatch.core.x imports gpuwatch.client"),
        ("app/x.py", "from gpuwatch.cli import main\n", "gpuwatch.app.x imports gpuwatch.cli"),
        ("x.py", "", "gpuwatch.x: not in a package of the flow"),
    ],
)
def test_the_checks_catch_an_import_against_the_flow(
    tmp_path: Path, module: str, source: str, problem: str
) -> None:
    root = tmp_path / "gpuwatch"
    for pkg in ("core", "client", "store", "web", "app", "cli"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("def init():\n    pass\n")
    (root / "__init__.py").write_text("")
    (root / "app" / "config.py").write_text("def load():\n    pass\n")
    (root / "cli" / "main.py").write_text("def main():\n    pass\n")
    (root / "web" / "__init__.py").write_text("def create_app():\n    pass\n")
    (root / module).write_text(source)
    assert any(problem in line for line in layer_violations(root))


def test_the_checks_catch_a_cycle_and_a_hidden_import(tmp_path: Path) -> None:
    root = tmp_path / "gpuwatch"
    (root / "store").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "store" / "__init__.py").write_text("")
    (root / "store" / "a.py").write_text("from gpuwatch.store import b\n")
    (root / "store" / "b.py").write_text("def f():\n    from gpuwatch.store import a\n")
    assert import_cycles(root) == [["gpuwatch.store.a", "gpuwatch.store.b"]]
    assert hidden_local_imports(root) == ["store/b.py:2: gpuwatch.store.a"]
