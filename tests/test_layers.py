"""The layer contract (flexigpt/layers.py, declared in pyproject.toml) holds on the tree, and
its checker finds what it must: a cycle hidden in a function body, an upward import, a module
in no layer."""

from __future__ import annotations

import textwrap
from pathlib import Path

from flexigpt.layers import Layers, cycles, import_graph, report, unassigned, upward_imports


def test_the_tree_keeps_the_layer_contract():
    text, holds = report()
    assert holds, text
    assert "cycles: 0" in text and "upward imports: 0" in text


def write(root: Path, name: str, body: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))


def toy_tree(root: Path) -> None:
    write(root, "pyproject.toml", """
        [tool.flexigpt]
        layers = [["low", ["flexigpt.low"]], ["high", ["flexigpt.high", "baselines"]]]
        """)
    write(root, "flexigpt/__init__.py", "")
    write(root, "baselines/__init__.py", "")
    write(root, "flexigpt/low.py", """
        def late():
            from flexigpt.high import thing  # an import inside a function still counts
            return thing
        """)
    write(root, "flexigpt/high.py", "from flexigpt import low\nthing = low\n")
    write(root, "flexigpt/stray.py", "from . import low\n")
    write(root, "baselines/plug.py", 'NAME = "flexigpt.high:thing"  # a string is no import\n')


def test_checker_finds_a_function_level_cycle_an_upward_import_and_a_stray(tmp_path):
    toy_tree(tmp_path)
    graph = import_graph(tmp_path)
    layers = Layers.declared(tmp_path)
    assert graph["flexigpt.low"] == {"flexigpt.high"}
    assert graph["flexigpt.stray"] == {"flexigpt.low"}
    assert graph["baselines.plug"] == set()
    assert cycles(graph) == [["flexigpt.high", "flexigpt.low"]]
    assert upward_imports(graph, layers) == [("flexigpt.low", "flexigpt.high")]
    assert unassigned(graph, layers) == ["flexigpt.stray"]
    text, holds = report(tmp_path)
    assert not holds and "cycles: 1" in text and "upward imports: 1" in text


def test_longest_prefix_owns_a_module():
    layers = Layers(("a", "b"), (("x",), ("x.y",)))
    assert layers.level("x.z") == 0 and layers.level("x.y.w") == 1 and layers.level("q") is None
