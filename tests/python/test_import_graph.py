"""torch_pjrt's modules import one another without a cycle.

Every module of the package is parsed (never imported) and each import of a
``torch_pjrt`` module is an edge: module-level, inside functions and under
``if TYPE_CHECKING``, absolute or relative. An import of ``a.b.c`` also depends
on the packages ``a.b`` and ``a`` (Python runs their ``__init__`` first), except
the importer's own enclosing packages: those are always initialized before it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "torch_pjrt"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

Graph = dict[str, set[str]]


def _module_names() -> dict[str, Path]:
    """Module name -> file, for every .py file of the package and its extension modules."""
    names: dict[str, Path] = {}
    for path in ROOT.rglob("*"):
        if path.suffix not in (".py", ".so") or "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        parts[-1] = parts[-1].split(".")[0]  # _C.cpython-311-x86_64-linux-gnu -> _C
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imported(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> set[str]:
    """The torch_pjrt modules `module` names in its import statements, wherever they are."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                # `from pkg import sub` imports the submodule; `from mod import name`, the module.
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source)
    targets: set[str] = set()
    for name in found:
        if name != PACKAGE and not name.startswith(PACKAGE + "."):
            continue
        while name not in known and "." in name:  # an attribute path: its module
            name = name.rsplit(".", 1)[0]
        targets.update(n for n in (*_ancestors(name), name) if n in known)
    own = {*_ancestors(module), module}
    return targets - own


def import_graph() -> Graph:
    names = _module_names()
    known = set(names)
    graph: Graph = {}
    for name, path in names.items():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = _imported(name, path.name == "__init__.py", tree, known)
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: Graph, component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph.get(v, ()) & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected component always has one


def test_graph_sees_the_package():
    graph = import_graph()
    assert f"{PACKAGE}.compiler" in graph and f"{PACKAGE}.doctor.observe" in graph
    assert f"{PACKAGE}._C" in graph[f"{PACKAGE}.compiler"]  # `from . import _C`: the extension module


def test_find_cycles_reports_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in torch_pjrt:\n" + "\n".join(" -> ".join(c) for c in cycles)
