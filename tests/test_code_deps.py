"""Per-rule code hashes: a rule reruns when code its script can run changes, and only then."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flexigpt.core.code_deps import ROOT, closure, rule_code_version

SCRIPTS = ROOT / "workflow" / "scripts"
RULES = ("compress", "train", "evaluate", "inference", "block_influence", "tables")


def _rel(paths) -> set[str]:
    return {str(p.relative_to(ROOT)) for p in paths}


def test_closure_follows_imports_registry_strings_and_parents():
    tables = _rel(closure(SCRIPTS / "tables.py"))
    assert {"flexigpt/tables/plots.py", "flexigpt/tables/__init__.py", "flexigpt/__init__.py",
            "workflow/scripts/tables.py"} <= tables
    compress = _rel(closure(SCRIPTS / "compress.py"))
    # methods are loaded by name ("baselines.slicegpt.method:METHOD" in the registry)
    assert {"baselines/slicegpt/method.py", "baselines/llm_pruner/method.py",
            "flexigpt/methods/flexigpt/prune.py", "flexigpt/storage/standalone.py",
            "baselines/slicegpt/replay.py", "flexigpt/methods/flexigpt/replay.py"} \
        <= compress
    for rule in ("compress", "train", "evaluate", "block_influence"):
        assert "flexigpt/tables/plots.py" not in _rel(closure(SCRIPTS / f"{rule}.py")), rule


def _tree_copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for part in ("flexigpt", "baselines", "workflow/scripts"):
        shutil.copytree(ROOT / part, root / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _versions(root: Path) -> dict[str, str]:
    return {r: rule_code_version(root / "workflow/scripts" / f"{r}.py", root) for r in RULES}


def test_editing_a_plot_reruns_only_the_tables(tmp_path):
    root = _tree_copy(tmp_path)
    before = _versions(root)
    assert before == {r: rule_code_version(SCRIPTS / f"{r}.py") for r in RULES}
    with open(root / "flexigpt/tables/plots.py", "a") as fh:
        fh.write("\n# an edit\n")
    after = _versions(root)
    assert [r for r in RULES if after[r] != before[r]] == ["tables"]
    with open(root / "flexigpt/runtime/evaluation/fast/lm.py", "a") as fh:  # the fast scorer
        fh.write("\n# an edit\n")
    again = _versions(root)
    assert {r for r in RULES if again[r] != after[r]} == {"evaluate", "inference", "tables"}
    with open(root / "flexigpt/data/published_results.csv", "a") as fh:  # data: every rule
        fh.write("\n")
    assert all(v != again[r] for r, v in _versions(root).items())


PROBE = r"""
import json, sys, torch
sys.path.insert(0, {tests!r})
from conftest import make_model, make_tokenizer, make_text
from flexigpt.api.compression import compress
from flexigpt.storage.registry import METHODS
text = {text!r}
tok = make_tokenizer(open(text).read())
ckpt = {ckpt!r}
make_model().save_pretrained(ckpt); tok.save_pretrained(ckpt)
for name in sorted(METHODS):
    if name in ("dense", "flexigpt_extend"):
        continue
    extra = {{"round_to": 2, "tolerance": 0.05}} if name == "slicegpt" else {{}}
    compress(name, ckpt, f"{{ckpt}}-{{name}}", options={{"ratio": 0.25, **extra}}, calibration=text,
             n_calibration=2, calibration_seq_len=16)
mods = sorted(m for m in sys.modules if m.split(".")[0] in ("flexigpt", "baselines"))
print(json.dumps([getattr(sys.modules[m], "__file__", None) for m in mods]))
"""


@pytest.mark.usefixtures("single_thread")
def test_every_module_a_real_compress_imports_is_in_the_closure(tmp_path, text_file):
    """Run every method's compression in a fresh process: each harness module it loaded
    (dynamic imports included) is in the compress rule's closure."""
    code = PROBE.format(tests=str(ROOT / "tests"), text=str(text_file),
                        ckpt=str(tmp_path / "ckpt"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = {str(Path(f).resolve().relative_to(ROOT)) for f in
              json.loads(out.stdout.strip().splitlines()[-1]) if f}
    loaded -= {"flexigpt/storage/models/tiny.py"}  # the probe's own model builder (conftest)
    assert loaded and loaded <= _rel(closure(SCRIPTS / "compress.py")), \
        loaded - _rel(closure(SCRIPTS / "compress.py"))
