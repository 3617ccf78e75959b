"""The package's import graph has no circle: every arrow points down a floor (docs: the house's plan).

Every ``import`` and ``from ... import`` in ``swkv_teach/`` counts, wherever it stands: at the top of a module,
inside a function (a late import only hides a circle until the function runs) or under ``if TYPE_CHECKING:`` (a
type-only import still says the module leans on the one above it). ``from pkg import name`` is an arrow to the
submodule ``pkg.name`` when there is one, else to ``pkg`` itself; a module does not import its parent package by
being inside it (Python runs the parent's ``__init__`` first, but that is no arrow the module drew).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "swkv_teach"


def module_names(root: Path) -> dict[str, Path]:
    """``{"swkv_teach.caches.base": path, "swkv_teach.caches": .../caches/__init__.py, ...}``."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import swkv_teach.caches.base.x`: the longest module named
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle ``[a, b, ..., a]`` if the graph has any (depth-first search, colours white/grey/black)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "grey"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "grey":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "black"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_package_has_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle) + " (move what both need a floor below both)"


def test_the_graph_sees_the_imports_a_circle_hides_in(tmp_path):
    """A planted circle is found, whether its arrows stand at the top, in a function or under TYPE_CHECKING."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.low import thing\n")
    (pkg / "top.py").write_text("from pkg.sub import low\n")
    (pkg / "sub" / "low.py").write_text("thing = 1\n\ndef late():\n    from ..top import x\n")
    graph = import_graph(pkg)
    assert graph["pkg.top"] == {"pkg.sub.low"} and graph["pkg.sub.low"] == {"pkg.top"}
    assert find_cycle(graph) in (["pkg.sub.low", "pkg.top", "pkg.sub.low"], ["pkg.top", "pkg.sub.low", "pkg.top"])

    (pkg / "sub" / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.top\n")
    assert find_cycle(import_graph(pkg)) is not None

    (pkg / "sub" / "low.py").write_text("thing = 1\n")
    assert find_cycle(import_graph(pkg)) is None


@pytest.mark.parametrize("before, after", [("swkv_teach.compiled_ring", "swkv_teach.model"),
                                           ("swkv_teach.hf_cache", "swkv_teach.hf"),
                                           ("swkv_teach.caches._state", "swkv_teach.caches.base")])
def test_the_three_old_circles_stay_broken(before, after):
    """compiled_ring, hf_cache and caches/_state sit below the modules that import them and never import them back."""
    graph = import_graph()
    assert after not in graph[before], f"{before} imports {after}, which imports it"
