"""Method-specific decisions live with the method: its folder (``flexigpt/methods/``,
``baselines/<name>/``) and its registry entry (``flexigpt/storage/registry.py``: facts and hooks).
No other module compares an expression against a method key: the tables and the DAG's
table sections, which encode the paper's protocol (which pairs a claim compares, which
method the ablations vary), compare against the protocol's roles (``flexigpt.storage.registry.ROLES``)
instead.

``PENDING`` listed the modules that still compared, each with its count; it is now empty
and may not grow. The test fails when any module outside the owners starts comparing.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from flexigpt.storage.registry import METHODS, ROLES

ROOT = Path(__file__).resolve().parent.parent
#: modules allowed to name methods: the methods' own folders (FlexiGPT's, the dense reference,
#: each baseline's; not the tools in flexigpt/methods/ every method shares) and the registry;
#: the standalone remote-code file replays each method's structure without importing the harness
OWNERS = ("flexigpt/methods/flexigpt/", "flexigpt/methods/dense/", "baselines/",
          "flexigpt/storage/registry.py")
#: module → comparisons it still makes; empty now, and it may not grow
PENDING: dict[str, int] = {}


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def method_comparisons(source: str) -> list[str]:
    """Comparisons of an expression with method keys: ``x == "key"``, ``x in ("key", ...)``
    and pandas' ``x.eq("key")`` / ``.ne`` / ``.isin([...])``. Training recipes share the name
    ``flexigpt`` with the method; comparisons of a ``recipe`` are not counted."""
    keys = set(METHODS)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("eq", "ne", "isin") and node.args):
            operands = [node.func.value, node.args[0]]
        else:
            continue
        named = [ast.unparse(o) for o in operands if not _strings(o)]
        if (set().union(*map(_strings, operands)) & keys and named
                and not any("recipe" in text for text in named)):
            found.append(ast.unparse(node))
    return found


def scanned() -> dict[str, list[str]]:
    out = {}
    for path in sorted([*ROOT.glob("flexigpt/**/*.py"), *ROOT.glob("workflow/scripts/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(OWNERS):
            continue
        hits = method_comparisons(path.read_text(encoding="utf-8"))
        if hits:
            out[rel] = hits
    return out


def test_the_detector_finds_comparisons():
    assert method_comparisons('if run.method == "flexigpt": pass') == ["run.method == 'flexigpt'"]
    assert method_comparisons('ok = method in ("slicegpt", "dense")')
    assert method_comparisons('rows = agg[agg["method"].isin(["dense", "flexigpt"])]')
    assert not method_comparisons('ok = recipe == "flexigpt"')  # a recipe, not a method
    assert not method_comparisons('ok = method == other')


def test_every_role_names_a_registered_method():
    roles = dataclasses.asdict(ROLES)
    assert roles
    unknown = {role: key for role, key in roles.items() if key not in METHODS}
    assert not unknown, f"roles naming no key of METHODS: {unknown}"


def test_no_method_dispatch_outside_the_methods_and_the_registry():
    found = scanned()
    new = {m: hits for m, hits in found.items() if m not in PENDING}
    assert not new, f"method-key comparisons outside the method folders: {new}"
    counts = {m: len(hits) for m, hits in found.items()}
    assert counts == PENDING, ("PENDING is out of date (it is empty and may not grow; "
                               f"compare against ROLES instead): {found}")


# ---- selections: a method key written anywhere in code outside its folder ------------------
#: where the string "flexigpt" names the package, not the method
PACKAGE_NAME = ("flexigpt/cli/__init__.py", "flexigpt/export/standalone.py", "flexigpt/core/code_deps.py", "flexigpt/core/import_contract.py",
                "flexigpt/core/provenance.py", "benchmarks/validate_dense.py",
                "benchmarks/bench_scaling.py")
#: module → literals equal to a method key that name no method: the table section "dense"
#: (the uncompressed model's table; runs.py, collect.py, trend.py, sections.py) and the result
#: field ``parameters.dense`` (the uncompressed parameter count; manifest.py, results.py,
#: collect.py). This table may only shrink.
NOT_METHOD_NAMES = {
    "flexigpt/workflow/dag/runs.py": 1, "flexigpt/workflow/dag/sections.py": 2,
    "flexigpt/runtime/evaluation/results.py": 2, "flexigpt/storage/manifest.py": 1,
    "flexigpt/tables/collect.py": 3, "flexigpt/tables/trend.py": 1,
}
#: no module selects a method by its key (selections: tuples of keys, dict keys,
#: ``METHODS["key"]``, recipe names that equal a method key): the benchmark scripts ask the
#: protocol's roles, the methods' facts (``official_check``, ``calibration_flop``), or import
#: the one method they measure from its folder
ALLOWED = dict(NOT_METHOD_NAMES)


def method_literals(source: str) -> list[str]:
    """Every string constant equal to a method key, docstrings aside: a comparison, but also
    a selection (``PAIR = ("flexigpt", "shortgpt_lora")``, ``METHODS["dense"]``, a dict key)."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and n.value in METHODS and id(n) not in docs]


def selections() -> dict[str, int]:
    """Method-key literals per module of the whole tree (library, rule scripts, benchmarks)
    outside the methods' folders and the registry."""
    out = {}
    files = [*ROOT.glob("flexigpt/**/*.py"), *ROOT.glob("workflow/scripts/*.py"),
             *ROOT.glob("benchmarks/*.py")]
    for path in sorted(files):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(OWNERS):
            continue
        found = method_literals(path.read_text(encoding="utf-8"))
        if rel in PACKAGE_NAME:
            found = [k for k in found if k != "flexigpt"]
        if found:
            out[rel] = len(found)
    return out


def test_the_selection_detector_finds_a_planted_selection():
    assert method_literals('PAIR = ("flexigpt", "shortgpt_lora")') == ["flexigpt", "shortgpt_lora"]
    assert method_literals('x = METHODS["dense"]') == ["dense"]
    assert method_literals('def f():\n    """Uses "dense" in prose."""\n    return 1\n') == []


def test_method_selections_outside_the_methods_only_shrink():
    found = selections()
    grown = {m: (n, ALLOWED.get(m, 0)) for m, n in found.items() if n > ALLOWED.get(m, 0)}
    assert not grown, ("method keys selected outside their folders (ask ROLES or the "
                       f"methods' facts instead): (now, allowed): {grown}")
    shrunk = {m: (found.get(m, 0), n) for m, n in ALLOWED.items() if found.get(m, 0) < n}
    assert not shrunk, ("NOT_METHOD_NAMES is out of date, lower it: "
                        f"(now, listed) {shrunk}")
