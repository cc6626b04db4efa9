"""The declared layers of the harness, and the static import graph that checks what
import-linter does not.

The layers are declared once in ``pyproject.toml``, as import-linter's layers contract
(``[tool.importlinter]``, contract ``id = "layers"``, top first; `` : `` joins the modules of
one layer; names in ``[tool.flexigpt] layer_names``). ``lint-imports`` (``make test``) checks
that no module imports from a layer above its own. This module checks the rest of the
contract on the import graph of ``flexigpt`` and ``baselines``: **no cycle at all**, inside a
layer included (import-linter lets the modules of one layer import each other freely), and
**no module outside every layer** (import-linter ignores a module no layer names). Every
``import`` and ``from ... import`` statement counts, wherever it stands (function bodies,
``if TYPE_CHECKING:``), so an import moved into a function to dodge a cycle is still a cycle
here. Names loaded from a string (the registry's ``"baselines.slicegpt.method:METHOD"``) are a
plugin mechanism, not an import, and do not count. ``flexigpt/__init__.py`` (the public
re-export, lazy) is exempt.

``python -m flexigpt.core.import_contract`` prints the report (layers with their modules, cycles, strays)
and exits 1 when the contract is broken; ``tests/test_import_contract.py`` runs it in the default test
command.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from flexigpt.core.code_deps import ROOT, absolute_import_base

#: modules left out of the contract: the package's public re-export sits above everything
EXEMPT = frozenset({"flexigpt"})


def packages(root: Path = ROOT) -> tuple[str, ...]:
    """The packages under contract: import-linter's ``root_packages`` in
    ``root/pyproject.toml`` (the harness, its baselines and its benchmark scripts)."""
    table = tomllib.loads((root / "pyproject.toml").read_text())
    return tuple(table["tool"]["importlinter"]["root_packages"])


def modules(root: Path = ROOT) -> dict[str, Path]:
    """``{dotted module name: source file}`` for every module and package of
    :func:`packages` under ``root``."""
    found = {}
    for package in packages(root):
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
    roots = packages(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _imported_names(path, package):
            if imported.split(".")[0] not in roots:
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
        """The layers of import-linter's ``layers`` contract in ``root/pyproject.toml``,
        bottom first, named by ``[tool.flexigpt] layer_names`` (ValueError when the two
        disagree in length or the contract is missing)."""
        table = tomllib.loads((root / "pyproject.toml").read_text())
        contracts = table["tool"]["importlinter"]["contracts"]
        found = [c for c in contracts if c.get("id") == "layers" and c.get("type") == "layers"]
        if len(found) != 1:
            raise ValueError("pyproject.toml: expected one import-linter contract with "
                             "id = 'layers' and type = 'layers'")
        top_first = [tuple(m.strip() for m in re.split(r"[:|]", entry))
                     for entry in found[0]["layers"]]
        names = table["tool"]["flexigpt"]["layer_names"]
        if len(names) != len(top_first):
            raise ValueError(f"pyproject.toml: {len(names)} layer_names for "
                             f"{len(top_first)} layers")
        return cls(tuple(reversed(names)), tuple(reversed(top_first)))

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


@cache
def report(root: Path = ROOT) -> tuple[str, bool]:
    """The contract's report (text) and whether it holds (upward imports: ``lint-imports``)."""
    graph = import_graph(root)
    layers = Layers.declared(root)
    found_cycles = cycles(graph)
    missing = unassigned(graph, layers)
    lines = ["layers, bottom first:"]
    for i, name in enumerate(layers.names):
        members = sorted(m for m in graph if layers.level(m) == i)
        lines.append(f"  {i + 1} {name}: {len(members)} modules ({', '.join(layers.prefixes[i])})")
    lines.append(f"import edges: {sum(map(len, graph.values()))} between {len(graph)} modules")
    lines.append(f"cycles: {len(found_cycles)}")
    lines += [f"  {' <-> '.join(c)}" for c in found_cycles]
    lines.append(f"modules in no layer: {len(missing)}")
    lines += [f"  {m}" for m in missing]
    lines.append("upward imports: checked by lint-imports (import-linter, the same declaration)")
    return "\n".join(lines), not (found_cycles or missing)


def main() -> int:
    text, holds = report()
    print(text)
    print("layer contract: " + ("holds" if holds else "BROKEN"))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
