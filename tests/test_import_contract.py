"""The layer contract (declared in pyproject.toml as import-linter's layers contract) holds on
the tree: ``lint-imports`` finds an upward import, flexigpt/core/import_contract.py a cycle hidden in a
function body and a module in no layer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from flexigpt.core.import_contract import Layers, cycles, import_graph, report, unassigned

LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")


def test_the_tree_keeps_the_layer_contract():
    text, holds = report()
    assert holds, text
    assert "cycles: 0" in text and "modules in no layer: 0" in text
    out = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=Path(__file__).parent.parent,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "1 kept, 0 broken" in out.stdout, out.stdout + out.stderr


def write(root: Path, name: str, body: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))


def toy_tree(root: Path) -> None:
    write(root, "pyproject.toml", """
        [tool.importlinter]
        root_packages = ["flexigpt", "baselines"]

        [[tool.importlinter.contracts]]
        id = "layers"
        name = "toy layers"
        type = "layers"
        layers = ["flexigpt.high : baselines", "flexigpt.low"]

        [tool.flexigpt]
        layer_names = ["high", "low"]
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
    assert layers.names == ("low", "high")
    assert layers.prefixes == (("flexigpt.low",), ("flexigpt.high", "baselines"))
    assert cycles(graph) == [["flexigpt.high", "flexigpt.low"]]
    assert unassigned(graph, layers) == ["flexigpt.stray"]
    text, holds = report(tmp_path)
    assert not holds and "cycles: 1" in text and "modules in no layer: 1" in text
    out = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 1 and "0 kept, 1 broken" in out.stdout, out.stdout + out.stderr
    assert "flexigpt.low -> flexigpt.high" in out.stdout  # the upward import, named


def test_longest_prefix_owns_a_module():
    layers = Layers(("a", "b"), (("x",), ("x.y",)))
    assert layers.level("x.z") == 0 and layers.level("x.y.w") == 1 and layers.level("q") is None
