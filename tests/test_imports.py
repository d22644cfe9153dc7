"""The import graph of `autopar` (with `passes`, installed as `autopar.passes`): no cycle,
counting the imports inside functions, and every package importing only the layers below
it (docs/DESIGN.md's table)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"autopar": ROOT / "autopar", "autopar.passes": ROOT / "passes"}

# What each layer may import, besides itself and `autopar.errors`; bottom first. A passes
# group is a layer of its own: only the lowering reaches the runtime it emits calls to.
ALLOWED = {
    "values": set(),
    "rules": {"values"},
    "costs": {"values", "rules"},
    "solver": set(),
    "runtime": {"values", "rules", "costs"},
    "passes.capturing": {"values", "rules", "costs"},
    "passes.strategies": {"values", "rules", "costs", "passes.capturing"},
    "passes.problem": {"values", "rules", "costs", "solver", "passes.capturing",
                       "passes.strategies"},
    "passes.layout": {"values", "rules", "costs", "passes.capturing", "passes.strategies",
                      "passes.problem"},
    "passes.lowering": {"values", "rules", "costs", "runtime", "passes.capturing",
                        "passes.strategies", "passes.problem"},
    "planning": {"values", "rules", "costs", "solver", "passes.capturing",
                 "passes.strategies", "passes.problem", "passes.layout"},
    "compiler": {"values", "rules", "costs", "runtime", "planning", "passes.capturing",
                 "passes.strategies", "passes.problem", "passes.layout", "passes.lowering"},
    "present": {"values", "costs"},
    "tools": {"values", "rules", "costs", "solver", "runtime", "planning", "compiler",
              "passes.capturing", "passes.strategies", "passes.problem", "passes.layout"},
    "cli": {"values", "rules", "costs", "solver", "runtime", "planning", "compiler",
            "present", "tools"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package == "autopar" and parts[:1] == ("passes",):
                continue
            found[".".join((package, *parts))] = path
    return found


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The autopar modules `module` imports anywhere in its file (a `from package import
    name` counts the submodule when `name` is one, else the package)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                targets.add(child if child in modules else base)
    return {t for t in targets if t in modules and t != module}


def import_graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        graph.add_edges_from((module, target) for target in _imported(module, path, modules))
    return graph


def layer_of(module: str) -> str:
    """`autopar.planning.pipeline.plan` -> "planning"; `autopar.passes.lowering.lower` ->
    "passes.lowering"; the package's own `__init__` and `errors` -> "autopar"."""
    parts = module.split(".")[1:]
    if not parts or parts[0] == "errors":
        return "autopar"
    if parts[0] == "passes":
        return ".".join(parts[:2])
    return parts[0]


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 100, "the walk found too few modules"
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_every_package_imports_only_the_layers_below_it() -> None:
    wrong = []
    for module, target in import_graph().edges:
        source, reached = layer_of(module), layer_of(target)
        if source == "autopar" or reached in (source, "autopar"):
            continue  # the package's lazy entry point, a layer itself, the errors
        if reached not in ALLOWED.get(source, ()):
            wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_layers_have_no_cycle() -> None:
    layers = nx.DiGraph([(source, reached) for source, allowed in ALLOWED.items()
                         for reached in allowed])
    assert nx.is_directed_acyclic_graph(layers)
    assert set(layers) <= set(ALLOWED) | {"values"}


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def test_every_public_name_and_package_resolves_on_first_use() -> None:
    done = _fresh("import autopar\n"
                  "for name in autopar.__all__: getattr(autopar, name)\n"
                  "for name in ('runtime', 'planning', 'present', 'tools', 'values', 'costs',"
                  " 'solver', 'rules', 'passes', 'cli'):\n"
                  "    assert getattr(autopar, name).__name__ == f'autopar.{name}', name\n"
                  "print(callable(autopar.check), autopar.checkpoint.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "autopar.tools.checkpoint"]


def test_the_solver_starts_without_torch() -> None:
    done = _fresh("import sys, autopar\nautopar.solver.solve\n"
                  "print('torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
