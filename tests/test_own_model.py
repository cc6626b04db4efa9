"""``docs/own-model.md`` run as written (:mod:`walkthrough`): its shell blocks, in order, in
a temporary directory that holds the checkout's Snakefile and workflow, the session's tiny
resources, and the tiny Llama as the user's local model ``models/my-model``.

A ``run`` block runs whole; a ``dry-run`` block (GPU, SLURM) its ``export``, ``printf`` and
``-n`` lines only (the others need a GPU, a cluster or the network, and ``test_doc_commands``
checks them against the parsers). Without the SLURM executor plugin (``pip install -e
".[slurm]"``), the SLURM profile is dry-run with its ``executor:`` line removed: every other
key of it, and the DAG, are still checked. Every shell block of the page must be marked.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
from walkthrough import do, flexigpt_on_path, script, steps, unmarked

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "own-model.md"


def workdir(tmp_path: Path, resources: Path) -> Path:
    """The user's checkout, in miniature: Snakefile and workflow (the SLURM profile without
    its executor when the plugin is missing), the resources and ``models/my-model``."""
    (tmp_path / "Snakefile").symlink_to(ROOT / "Snakefile")
    (tmp_path / "workflow").mkdir()
    for child in (ROOT / "workflow").iterdir():
        if child.name != "profiles":
            (tmp_path / "workflow" / child.name).symlink_to(child)
    shutil.copytree(ROOT / "workflow" / "profiles", tmp_path / "workflow" / "profiles")
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        profile = tmp_path / "workflow" / "profiles" / "slurm" / "config.yaml"
        profile.write_text(re.sub(r"(?m)^executor: slurm.*\n", "", profile.read_text()))
    (tmp_path / "resources").symlink_to(resources, target_is_directory=True)
    shutil.copytree(resources / "models" / "tiny-llama", tmp_path / "models" / "my-model")
    return tmp_path


def test_every_shell_block_of_the_page_is_marked():
    found = [s for s in steps(PAGE.read_text()) if s.lang == "bash"]
    assert len(found) >= 5
    assert unmarked(found) == []


def test_a_dry_run_block_runs_only_its_checks():
    assert script("dry-run", "export A=1\npip install x\nflexigpt run -n --cores 1\n"
                  "flexigpt run --cores 1\n") == "export A=1\nflexigpt run -n --cores 1\n"
    with pytest.raises(AssertionError):
        script("dry-run", "flexigpt run --cores 1\n")


def test_the_own_model_walkthrough_runs_as_written(tmp_path, tiny_resources):
    work = workdir(tmp_path, tiny_resources)
    env = flexigpt_on_path(work)
    for step in steps(PAGE.read_text()):
        do(step, work, env)
    tables = work / "results" / "my-model" / "tables"
    assert list(tables.glob("table1_*.md")) and (tables / "verdicts.md").is_file()
    assert (work / "archive").is_dir() and any((work / "archive").rglob("eval_final.json"))
    # the run wrote its run-time record; the dry runs (-n) wrote none
    records = sorted((work / "results" / "my-model" / "run_records").glob("*.json"))
    assert len(records) == 1, records
    record = json.loads(records[0].read_text())
    assert record["config"] == ["my-model.yaml"] and record["whole_grid"]
    assert record["jobs"] > 0 and record["minutes"] > 0
