"""A documentation page done as written (``docs/own-model.md``, ``docs/add-a-method.md``): its
marked fenced blocks, in order, in a working directory.

The comment line right before a block's fence says what it is:

- ``<!-- walkthrough: run -->`` (a ``bash`` block): it runs whole (``bash -eu``);
- ``<!-- walkthrough: dry-run -->`` (a ``bash`` block: GPU, SLURM, a long run): its
  ``export``, ``printf`` and ``-n`` lines run, the others need a GPU, a cluster, the network or
  hours (``test_doc_commands`` checks them against the parsers);
- ``<!-- walkthrough: file PATH -->`` (any block): the block is the whole text of ``PATH``,
  written there (relative to the working directory).

Every ``bash`` block of such a page is marked (:func:`unmarked`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(?:<!-- walkthrough: (run|dry-run|file \S+) -->\n)?```(\w*)\n(.*?)```", re.S)


@dataclass(frozen=True)
class Step:
    """One fenced block: its mark (``run``, ``dry-run``, ``file``; None: unmarked), the path
    a ``file`` block is written to, the fence's language and the text."""

    mark: str | None
    path: str | None
    lang: str
    body: str


def steps(text: str) -> list[Step]:
    """Every fenced block of ``text``, in order."""
    out = []
    for m in BLOCK.finditer(text):
        mark, _, path = (m.group(1) or "").partition(" ")
        out.append(Step(mark or None, path or None, m.group(2), m.group(3)))
    return out


def unmarked(found: list[Step]) -> list[str]:
    """The first line of every unmarked ``bash`` block."""
    return [s.body.splitlines()[0] for s in found if s.mark is None and s.lang == "bash"]


def script(mark: str, body: str) -> str:
    """What runs of a block: all of a ``run`` block; the ``export``, ``printf`` (a config
    overlay written) and ``-n`` lines of a ``dry-run`` block."""
    if mark == "run":
        return body
    keep = [line for line in body.splitlines()
            if line.startswith(("export ", "printf ")) or re.search(r"\s-n(\s|$)", line)]
    assert any(" -n" in line for line in keep), f"a dry-run block without a -n line:\n{body}"
    return "\n".join(keep) + "\n"


def flexigpt_on_path(work: Path, package: Path = ROOT) -> dict[str, str]:
    """The environment of a page's commands in ``work``: ``flexigpt`` and ``python`` on PATH
    (``work/bin``: this interpreter, as in the activated environment the pages assume), the
    package (and ``baselines``) imported from the tree ``package`` (PYTHONPATH)."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, args in (("flexigpt", ' -m flexigpt "$@"'), ("python", ' "$@"')):
        exe = bin_dir / name
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args}\n')
        exe.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])}


def do(step: Step, work: Path, env: dict[str, str]) -> None:
    """Write a ``file`` block, or run a ``run`` / ``dry-run`` block in ``work`` (a failure
    fails the test with the block, its output and the failed jobs' logs)."""
    assert step.mark is not None, f"an unmarked block:\n{step.body}"
    if step.mark == "file":
        assert step.path is not None
        target = work / step.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(step.body)
        return
    run = subprocess.run(["bash", "-eu", "-c", script(step.mark, step.body)], cwd=work,
                         env=env, capture_output=True, text=True, timeout=1500)
    if run.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text(errors='replace')[-1500:]}"
                         for p in sorted((work / "logs").rglob("*.log"))
                         if "Error" in p.read_text(errors="replace"))
        pytest.fail(f"{step.mark} block failed:\n{step.body}\n{run.stdout[-3000:]}\n"
                    f"{run.stderr[-3000:]}\n{logs}")
