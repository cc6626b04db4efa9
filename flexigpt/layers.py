"""The declared layers of the harness, and the static import graph that checks them.

The layers, bottom to top, are declared once in ``pyproject.toml`` (``[tool.flexigpt.layers]``,
a list of ``[name, [module prefixes]]``): a module may import from its own layer and the
layers below, never from one above, and the import graph of the packages ``flexigpt`` and
``baselines`` has no cycle at all — inside a layer included. Every ``import`` and ``from ...
import`` statement counts, wherever it stands (function bodies, ``if TYPE_CHECKING:``), so an
import moved into a function to dodge a cycle is still a cycle here. Names loaded from a
string (the registry's ``"baselines.slicegpt.method:METHOD"``) are a plugin mechanism, not an
import, and do not count. ``flexigpt/__init__.py`` (the public re-export) is exempt.

``python -m flexigpt.layers`` prints the report (layers with their modules, cycles, upward
imports) and exits 1 when the contract is broken; ``tests/test_layers.py`` runs it in the
default test command.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from flexigpt.code_deps import PACKAGES, ROOT, absolute_import_base

#: modules left out of the contract: the package's public re-export sits above everything
EXEMPT = frozenset({"flexigpt"})


def modules(root: Path = ROOT) -> dict[str, Path]:
    """``{dotted module name: source file}`` for every module and package of
    :data:`flexigpt.code_deps.PACKAGES` under ``root``."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The most specific known module that ``name`` (a module or ``module.attribute``) is."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(path: Path, package: str) -> list[str]:
    """Dotted names every import statement in ``path`` refers to (``from a import b`` gives
    ``a.b``, resolved to ``a`` later when ``b`` is an attribute)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute_import_base(node, package)
            if base:
                names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over the harness packages. An import of a package's
    own parent (implicit in Python) is not an edge; an import of a child is."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _imported_names(path, package):
            if imported.split(".")[0] not in PACKAGES:
                continue
            target = _owner(imported, known)
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (each
    sorted; Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


@dataclass(frozen=True)
class Layers:
    """The declared layers, bottom first: ``names[i]`` owns the module prefixes
    ``prefixes[i]``."""

    names: tuple[str, ...]
    prefixes: tuple[tuple[str, ...], ...]

    @classmethod
    def declared(cls, root: Path = ROOT) -> Layers:
        """The layers of ``[tool.flexigpt.layers]`` in ``root/pyproject.toml``."""
        table = tomllib.loads((root / "pyproject.toml").read_text())
        entries = table["tool"]["flexigpt"]["layers"]
        return cls(tuple(name for name, _ in entries),
                   tuple(tuple(prefixes) for _, prefixes in entries))

    def level(self, module: str) -> int | None:
        """The index of the layer that owns ``module`` (longest matching prefix wins);
        None when no layer names it."""
        best, level = -1, None
        for i, prefixes in enumerate(self.prefixes):
            for prefix in prefixes:
                if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                    best, level = len(prefix), i
        return level


def unassigned(graph: dict[str, set[str]], layers: Layers) -> list[str]:
    """Modules of the graph that no layer owns (the contract must cover every module)."""
    return sorted(m for m in graph if m not in EXEMPT and layers.level(m) is None)


def upward_imports(graph: dict[str, set[str]], layers: Layers) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where the imported module sits in a higher layer."""
    bad = []
    for module, targets in sorted(graph.items()):
        own = layers.level(module)
        if module in EXEMPT or own is None:
            continue
        for target in sorted(targets):
            other = layers.level(target)
            if other is not None and other > own:
                bad.append((module, target))
    return bad


@cache
def report(root: Path = ROOT) -> tuple[str, bool]:
    """The contract's report (text) and whether it holds."""
    graph = import_graph(root)
    layers = Layers.declared(root)
    found_cycles = cycles(graph)
    upward = upward_imports(graph, layers)
    missing = unassigned(graph, layers)
    lines = ["layers, bottom first:"]
    for i, name in enumerate(layers.names):
        members = sorted(m for m in graph if layers.level(m) == i)
        lines.append(f"  {i + 1} {name}: {len(members)} modules ({', '.join(layers.prefixes[i])})")
    lines.append(f"import edges: {sum(map(len, graph.values()))} between {len(graph)} modules")
    lines.append(f"cycles: {len(found_cycles)}")
    lines += [f"  {' <-> '.join(c)}" for c in found_cycles]
    lines.append(f"upward imports: {len(upward)}")
    for a, b in upward:
        level_a, level_b = layers.level(a), layers.level(b)
        assert level_a is not None and level_b is not None  # upward_imports: both in a layer
        lines.append(f"  {a} ({layers.names[level_a]}) -> {b} ({layers.names[level_b]})")
    lines.append(f"modules in no layer: {len(missing)}")
    lines += [f"  {m}" for m in missing]
    return "\n".join(lines), not (found_cycles or upward or missing)


def main() -> int:
    text, holds = report()
    print(text)
    print("layer contract: " + ("holds" if holds else "BROKEN"))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
