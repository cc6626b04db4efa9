"""``docs/add-a-method.md`` done as written (:mod:`walkthrough`): in a copy of the tree, the
page's files are written where it says (the method's folder, its test, a config overlay) and
its commands run in order (the method's test, the whole smoke DAG as a dry run, the method's
rows and the tables); the table then holds the method's rows at the achieved compression of
the rows they are matched to. A wrong line of the page's code fails here: in its own test,
at the DAG build, in a job, or in the checks below.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from walkthrough import do, flexigpt_on_path, steps

from flexigpt.storage.registry import METHODS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "add-a-method.md"
#: what the page's commands read of the checkout: copied where the page writes into it (the
#: packages; the tests' fixtures and settings, beside the test it adds), linked where not
COPIED = ("flexigpt", "baselines", "tests/conftest.py", "pyproject.toml")
LINKED = ("Snakefile", "workflow", "config")
#: the key of the method the page adds, and the files it writes
KEY = "deepest"
FILES = {"baselines/deepest/__init__.py", "baselines/deepest/facts.py",
         "baselines/deepest/config.py", "baselines/deepest/method.py", "tests/test_deepest.py",
         "deepest.yaml"}


def tree(tmp_path: Path, resources: Path) -> Path:
    """A copy of the checkout holding what the page's commands read, and the resources."""
    work = tmp_path / "tree"
    for part in COPIED:
        source, target = ROOT / part, work / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    for part in LINKED:
        (work / part).symlink_to(ROOT / part)
    (work / "resources").symlink_to(resources, target_is_directory=True)
    return work


def test_every_block_of_the_page_is_marked_and_adds_one_new_folder():
    found = steps(PAGE.read_text())
    assert [s.body.splitlines()[0] for s in found if s.mark is None] == []
    assert {s.path for s in found if s.mark == "file"} == FILES
    assert KEY not in METHODS and not (ROOT / "baselines" / KEY).exists()


def manifest(results: Path, run: str) -> dict[str, Any]:
    return json.loads((results / run / "compressed" / "manifest.json").read_text())


def test_the_page_adds_a_method_that_reaches_the_tables(tmp_path, tiny_resources):
    work = tree(tmp_path, tiny_resources)
    env = flexigpt_on_path(work, package=work)
    for step in steps(PAGE.read_text()):
        do(step, work, env)

    with open(work / "deepest-tables" / "table1_tiny-llama.csv") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)
                if r["source"] == "ours" and r["method"] == KEY}
    assert set(rows) == {"default", "lora"}
    results = work / "results" / "tiny-llama"
    ours = manifest(results, f"{KEY}/default/r0.3")
    flexigpt = manifest(results, "flexigpt/default/r0.3")
    shortgpt = manifest(results, "shortgpt/default/r0.3")
    achieved, k = ours["parameters"]["achieved_ratio"], ours["info"]["k"]
    n = ours["structure"]["dense_blocks"]
    assert ours["structure"]["removed_blocks"] == list(range(n - 1 - k, n - 1))
    # the table shows what the saved model achieved, at ShortGPT's block count and ratio and
    # within half a block step of FlexiGPT's, one-shot and recovered
    for row in rows.values():
        assert float(row["achieved_ratio"]) == pytest.approx(achieved, abs=1e-5)
        assert int(float(row["blocks_pruned"])) == k
    assert k == shortgpt["info"]["k"]
    assert achieved == pytest.approx(shortgpt["parameters"]["achieved_ratio"], abs=1e-12)
    step = achieved / k
    assert abs(achieved - flexigpt["parameters"]["achieved_ratio"]) <= step / 2
    # the recovered row: trained, its LoRA sized to FlexiGPT's trainable count, its learning
    # rate chosen by the config's search
    lora = rows["lora"]
    assert lora["trained"] == "True" and lora["recipe"] == "lora"
    assert float(lora["budget_target"]) == flexigpt["info"]["recovery"]["trainable_params"]
    assert lora["lr_source"].startswith("tuning sweep of ")
