"""``docs/own-model.md`` run as written: its shell blocks, in order, in a temporary
directory that holds the checkout's Snakefile and workflow, the session's tiny resources,
and the tiny Llama as the user's local model ``models/my-model``.

A block marked ``<!-- walkthrough: run -->`` runs whole (``bash -eu``); one marked
``<!-- walkthrough: dry-run -->`` (GPU, SLURM) runs its ``export``, ``printf`` and ``-n``
lines only (the others need a GPU, a cluster or the network, and ``test_doc_commands``
checks them against the parsers). Without the SLURM executor plugin (``pip install -e
".[slurm]"``), the SLURM profile is dry-run with its ``executor:`` line removed: every other
key of it, and the DAG, are still checked. Every shell block of the page must be marked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "own-model.md"
BLOCK = re.compile(r"(?:<!-- walkthrough: (run|dry-run) -->\n)?```bash\n(.*?)```", re.S)


def blocks(text: str) -> list[tuple[str | None, str]]:
    """``(mark, body)`` of every ``bash`` block of ``text``, in order (mark None: unmarked)."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def script(mark: str, body: str) -> str:
    """What runs of a block: all of a ``run`` block; the ``export``, ``printf`` (a config
    overlay written) and ``-n`` lines of a ``dry-run`` block."""
    if mark == "run":
        return body
    keep = [line for line in body.splitlines()
            if line.startswith(("export ", "printf ")) or re.search(r"\s-n(\s|$)", line)]
    assert any(" -n" in line for line in keep), f"a dry-run block without a -n line:\n{body}"
    return "\n".join(keep) + "\n"


def workdir(tmp_path: Path, resources: Path) -> Path:
    """The user's checkout, in miniature: Snakefile and workflow (the SLURM profile without
    its executor when the plugin is missing), the resources, ``models/my-model``, and a
    ``flexigpt`` on PATH that imports this tree's package."""
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
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "flexigpt"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m flexigpt "$@"\n')
    exe.chmod(0o755)
    return tmp_path


def test_every_shell_block_of_the_page_is_marked():
    found = blocks(PAGE.read_text())
    assert len(found) >= 5
    assert [body.splitlines()[0] for mark, body in found if mark is None] == []


def test_a_dry_run_block_runs_only_its_checks():
    assert script("dry-run", "export A=1\npip install x\nflexigpt run -n --cores 1\n"
                  "flexigpt run --cores 1\n") == "export A=1\nflexigpt run -n --cores 1\n"
    with pytest.raises(AssertionError):
        script("dry-run", "flexigpt run --cores 1\n")


def test_the_own_model_walkthrough_runs_as_written(tmp_path, tiny_resources):
    work = workdir(tmp_path, tiny_resources)
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for mark, body in blocks(PAGE.read_text()):
        assert mark is not None
        run = subprocess.run(["bash", "-eu", "-c", script(mark, body)], cwd=work, env=env,
                             capture_output=True, text=True, timeout=1500)
        if run.returncode != 0:
            logs = "\n".join(f"== {p}\n{p.read_text(errors='replace')[-1500:]}"
                             for p in sorted((work / "logs").rglob("*.log"))
                             if "Error" in p.read_text(errors="replace"))
            pytest.fail(f"{mark} block failed:\n{body}\n{run.stdout[-3000:]}\n"
                        f"{run.stderr[-3000:]}\n{logs}")
    tables = work / "results" / "my-model" / "tables"
    assert list(tables.glob("table1_*.md")) and (tables / "verdicts.md").is_file()
    assert (work / "archive").is_dir() and any((work / "archive").rglob("eval_final.json"))
    # the run wrote its run-time record; the dry runs (-n) wrote none
    records = sorted((work / "results" / "my-model" / "run_records").glob("*.json"))
    assert len(records) == 1, records
    record = json.loads(records[0].read_text())
    assert record["config"] == ["my-model.yaml"] and record["whole_grid"]
    assert record["jobs"] > 0 and record["minutes"] > 0
