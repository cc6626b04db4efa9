"""The standalone remote-code file of a published checkpoint, assembled from its pieces.

``modeling_flexigpt_compressed.py`` (what ``config.json``'s ``auto_map`` names) is one
self-contained file: the base :mod:`flexigpt.storage.standalone` (families, model classes,
the replay registry), then the replay fragment of every method that declares one
(``MethodFacts.replay``, a module in the method's own folder), each fragment stripped of its
docstring, ``from __future__`` line and imports of the harness (the names it imports from the
base are the base's own in the assembled file). The harness checks a checkpoint against the
same assembled text it writes (:func:`standalone_module`).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from functools import cache
from pathlib import Path

from flexigpt.storage.models.checkpoint_format import MODELING_FILE
from flexigpt.storage.registry import METHODS

BASE = "flexigpt.storage.standalone"
#: top-level packages whose imports a fragment drops when assembled
HARNESS = ("flexigpt", "baselines")


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"standalone fragment {module!r} not found")
    return Path(spec.origin).read_text()


def fragment_body(source: str) -> str:
    """``source`` (a fragment module) without its docstring, ``from __future__`` imports and
    imports from the harness packages."""
    tree = ast.parse(source)
    drop: set[int] = set()
    for i, node in enumerate(tree.body):
        docstring = (i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                     and isinstance(node.value.value, str))
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        harness = (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None
                   and node.module.split(".")[0] in HARNESS)
        if docstring or future or harness:
            drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = source.splitlines()
    return "\n".join(line for n, line in enumerate(lines, start=1) if n not in drop).strip()


def fragments() -> list[str]:
    """The declared fragment modules, in table order, each once."""
    return list(dict.fromkeys(f.replay for f in METHODS.values() if f.replay))


@cache
def assemble() -> str:
    """The whole standalone file: the base, then every method's fragment."""
    parts = [_source(BASE).rstrip()]
    for module in fragments():
        parts.append(f"# ---- {module} {'-' * max(0, 86 - len(module))}\n"
                     + fragment_body(_source(module)))
    return "\n\n\n".join(parts) + "\n"


@cache
def standalone_module() -> types.ModuleType:
    """The assembled file executed as the module ``modeling_flexigpt_compressed`` (what a
    checkpoint's remote code is), for checking a checkpoint before it is written."""
    name = MODELING_FILE[:-3]
    module = types.ModuleType(name)
    module.__file__ = f"<assembled {MODELING_FILE}>"
    sys.modules[name] = module  # as an import would: classes look their module up by name
    exec(compile(assemble(), module.__file__, "exec"), module.__dict__)  # noqa: S102
    return module


def write_standalone(model_dir: str | Path) -> Path:
    """Write the assembled file into ``model_dir`` (returns its path)."""
    path = Path(model_dir) / MODELING_FILE
    path.write_text(assemble())
    return path
