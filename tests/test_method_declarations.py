"""A method declares itself in its folder: the registry is what the folders' ``facts.py``
declare (discovered, never listed), so a new method is one new folder."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flexigpt.core.code_deps import closure
from flexigpt.storage.registry import FACTS_MODULES, METHODS, discover_methods

ROOT = Path(__file__).resolve().parent.parent


def plant(root: Path, package: str, folder: str, body: str) -> None:
    """``<root>/<package>/<folder>/facts.py`` with ``body`` (packages made as needed)."""
    (root / package).mkdir(exist_ok=True)
    (root / package / "__init__.py").write_text("")
    (root / package / folder).mkdir()
    (root / package / folder / "__init__.py").write_text("")
    (root / package / folder / "facts.py").write_text(textwrap.dedent(body))


def test_the_registry_is_every_folder_declaration_in_table_order():
    """Every method folder's facts.py, and nothing else, makes the registry (in order)."""
    import importlib

    declared: dict[str, object] = {}
    for pattern in FACTS_MODULES:
        package, _, module = pattern.partition(".*.")
        for path in sorted(ROOT.joinpath(*package.split(".")).glob(f"*/{module}.py")):
            name = f"{package}.{path.parent.name}.{module}"
            declared.update(importlib.import_module(name).METHODS)
    assert set(declared) == set(METHODS)
    assert {"dense", "flexigpt", "shortgpt_lora", "slicegpt", "replaceme"} <= set(METHODS)
    orders = [facts.order for facts in METHODS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert list(METHODS)[:1] == ["dense"]  # the reference row first


def test_a_planted_folder_is_discovered_and_a_duplicate_key_refused(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    plant(tmp_path, "plugmethods", "newmethod", """\
        from flexigpt.storage.method_facts import MethodFacts
        METHODS = {"newmethod": MethodFacts("plugmethods.newmethod.method:METHOD", "New",
                                            order=5)}
        """)
    (tmp_path / "plugmethods" / "helpers").mkdir()  # a folder without facts.py: not a method
    (tmp_path / "plugmethods" / "helpers" / "__init__.py").write_text("")
    found = discover_methods((*FACTS_MODULES, "plugmethods.*.facts"))
    assert list(found)[:2] == ["dense", "newmethod"]  # placed by its order
    assert set(found) - {"newmethod"} == set(METHODS)
    plant(tmp_path, "plugmethods", "again", """\
        from flexigpt.storage.method_facts import MethodFacts
        METHODS = {"newmethod": MethodFacts("plugmethods.again.method:METHOD", "Again")}
        """)
    with pytest.raises(ValueError, match="'newmethod' is declared twice"):
        discover_methods(("plugmethods.*.facts",))


def test_rule_code_covers_every_declaration():
    """A rule's code version (code_deps) reaches every folder's facts.py and, through its
    target string, the method's implementation."""
    files = {str(p.relative_to(ROOT)) for p in closure(ROOT / "workflow/scripts/compress.py")}
    assert {"baselines/streamline/facts.py", "baselines/streamline/method.py",
            "flexigpt/methods/dense/facts.py", "flexigpt/methods/flexigpt/facts.py"} <= files


def test_declarations_import_nothing_heavy():
    code = ("import sys\nfrom flexigpt.storage.registry import METHODS\n"
            "assert len(METHODS) > 1\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_roles_come_from_the_declarations_one_method_each():
    """The protocol's roles (reference, subject, comparator, skip, extension) are what the
    method folders declare (``MethodFacts.roles``); a role declared twice, by none, or a role
    nobody knows is refused naming it."""
    from dataclasses import replace

    from flexigpt.storage.registry import METHODS, ROLES, Roles, declared_roles

    assert declared_roles(METHODS) == ROLES
    for role, key in vars(ROLES).items():
        assert role in METHODS[key].roles
    twice = {**METHODS, "other": replace(METHODS[ROLES.subject], label="Other")}
    with pytest.raises(ValueError, match=r"exactly one method.*'subject': \['flexigpt', 'other'\]"):
        declared_roles(twice)
    none = {k: replace(f, roles=()) if k == ROLES.skip else f for k, f in METHODS.items()}
    with pytest.raises(ValueError, match=r"'skip': \[\]"):
        declared_roles(none)
    unknown = {**METHODS, "x": replace(METHODS[ROLES.reference], roles=("judge",))}
    with pytest.raises(ValueError, match="unknown role 'judge'"):
        declared_roles(unknown)
    assert [f for f in Roles.__dataclass_fields__] == ["reference", "subject", "comparator",
                                                        "skip", "extension"]
