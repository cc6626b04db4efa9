"""Which harness source files a DAG step can execute: a static import closure.

:func:`closure` starts from one file (a ``workflow/scripts/*.py``) and follows, through every
module it reaches, each ``import`` / ``from ... import`` statement (wherever it stands,
function bodies included) and each string constant that names a harness module
(``"baselines.slicegpt.method:METHOD"``, as the registry and the CLI load methods and
commands) or a module of every subpackage (``"baselines.*.facts"``, the registry's discovery
of the method folders' declarations), restricted to the packages ``flexigpt`` and ``baselines``; every parent package's
``__init__.py`` comes along, since importing a submodule runs it. The closure
over-approximates what a step runs (a module reached only in a branch the step never takes
still counts), never under-approximates it for these import forms.

:func:`rule_code_version` hashes the closure, so the DAG reruns a step when code it can run
changes, and only then: editing a plot reruns the tables, not the training.
"""

from __future__ import annotations

import ast
import hashlib
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flexigpt", "baselines")
_MODULE_STRING = re.compile(r"^((?:flexigpt|baselines)(?:\.\w+)*)(?::\w+)?$")
#: ``"<package>.*.<module>"``: that module of every subpackage (the registry's discovery of
#: the method folders' ``facts``), expanded to the modules that exist
_MODULE_PATTERN = re.compile(r"^((?:flexigpt|baselines)(?:\.\w+)*)\.\*\.(\w+)$")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """The source file of dotted module ``name`` (a module or a package ``__init__``)."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


@cache
def _references(path: Path, root: Path) -> tuple[str, ...]:
    """Dotted harness modules that the file at ``path`` imports or names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path, root)
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute_import_base(node, package)
            if base:
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _MODULE_STRING.match(node.value)
            pattern = _MODULE_PATTERN.match(node.value)
            if match:
                names = [match.group(1)]
            elif pattern:
                names = _expand(pattern.group(1), pattern.group(2), root)
        for name in names:
            if name.split(".")[0] in PACKAGES:
                found.update(_with_parents(name))
    return tuple(sorted(found))


def _expand(package: str, module: str, root: Path) -> list[str]:
    """``package.<sub>.module`` for every subpackage ``<sub>`` of ``package`` under ``root``
    that has that module."""
    base = root.joinpath(*package.split("."))
    return [f"{package}.{sub.name}.{module}" for sub in sorted(base.iterdir())
            if (sub / "__init__.py").is_file() and (sub / f"{module}.py").is_file()]


def _package_of(path: Path, root: Path) -> str | None:
    try:
        rel = path.relative_to(root).with_suffix("")
    except ValueError:
        return None  # a script outside the packages: only absolute imports
    return ".".join(rel.parts[:-1])  # a module's package, and a package's own name


def absolute_import_base(node: ast.ImportFrom, package: str | None) -> str | None:
    """The absolute module a ``from ... import`` statement in ``package`` reads from (None
    for a relative import outside any package)."""
    if node.level == 0:
        return node.module
    if package is None:
        return None
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def closure(entry: str | Path, root: Path = ROOT) -> list[Path]:
    """Every harness source file reachable from ``entry`` (included), sorted."""
    entry = Path(entry).resolve()
    seen: set[Path] = set()
    todo = [entry]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _references(path, root):
            target = module_file(name, root)
            if target is not None and target not in seen:
                todo.append(target)
    return sorted(seen)


def data_files(root: Path = ROOT) -> list[Path]:
    """The packages' non-Python files (e.g. the published numbers), counted for every step."""
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc")
                  and "__pycache__" not in p.parts)


def rule_code_version(script: str | Path, root: Path = ROOT) -> str:
    """sha256 (16 hex) over the paths and bytes of :func:`closure` of ``script`` and of the
    packages' :func:`data_files`."""
    digest = hashlib.sha256()
    for path in [*closure(script, root), *data_files(root)]:
        try:
            name = str(path.relative_to(root))
        except ValueError:
            name = path.name
        digest.update(name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
