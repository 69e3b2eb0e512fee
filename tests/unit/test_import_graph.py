"""The product's modules import one another without a cycle.

Every ``import`` of every module of the product's packages (those ``pyproject.toml``
ships) is read with ``ast``, those inside functions included: an import moved into a
function still makes a cycle, only a hidden one (it works or fails by import order).
An import names the module it loads (``from a.b import c`` is ``a.b.c`` when that is a
module, else ``a.b``); the parent packages Python initializes on the way are not edges
(a package's ``__init__`` may import its own submodules).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def product_packages() -> list[str]:
    """The top-level packages ``pyproject.toml`` ships."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.rstrip("*").rstrip(".") for p in include})


def module_files() -> dict[str, Path]:
    """Every module of the product's packages: dotted name -> file."""
    found: dict[str, Path] = {}
    for package in product_packages():
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The dotted names an import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = name.split(".") if is_package else name.split(".")[:-1]
        here = here[: len(here) - (node.level - 1)]
        base = ".".join([*here, base] if base else here)
    return [base, *(f"{base}.{a.name}" for a in node.names if a.name != "*")]


def module_imports(source: str, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The ``modules`` that the source of module ``name`` imports, anywhere in its body."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = _imported(node, name, is_package)
        if isinstance(node, ast.ImportFrom):
            # ``from a import b``: the module ``a.b`` if there is one, else ``a``.
            subs = [n for n in names[1:] if n in modules]
            edges.update(subs)
            if len(subs) < len(names) - 1 and names[0] in modules:
                edges.add(names[0])
        else:
            edges.update(n for n in names if n in modules)
    edges.discard(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    """Module -> the product's modules it imports (anywhere in its body)."""
    files = module_files()
    return {
        name: module_imports(path.read_text(), name, path.name == "__init__.py", set(files))
        for name, path in files.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as a path
    that starts and ends at the same module; empty when the graph has none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module (breadth first, inside the group)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle in the group {sorted(group)}")


def test_the_graph_is_read() -> None:
    """The walk finds the packages and sees every kind of import, those inside functions
    too; a cycle is found and told as a path."""
    graph = import_graph()
    assert {"activities", "workflows", "kube", "retirement", "worker"} <= set(graph)
    assert any(m.startswith("activities.") for m in graph["activities"])
    source = """
import p.a
from p import b
from . import c
from .d import X


def f():
    from p.e import Y
"""
    modules = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.z"}
    assert module_imports(source, "p.z", False, modules) == {"p.a", "p.b", "p.c", "p.d", "p.e"}
    assert cycles({"m": {"a"}, "a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)
