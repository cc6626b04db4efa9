"""Helpers of the Snakemake workflow's own code: the Snakefile (``workflow/rules/common.smk``)
and every ``workflow/scripts/*.py`` script.

- :func:`checkout_on_pythonpath`: the jobs a DAG build starts import this checkout.
- :func:`script_logging`: a script's logging and stderr go to its rule's log file.
- :data:`PROMPT_TEXT`: the input name the inference rule and its script share.

Nothing here knows the run grid (:mod:`flexigpt.workflow.dag`), so a script's code closure
(:mod:`flexigpt.core.code_deps`) holds only the harness code it runs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

#: name of the inference_cost rule's prompt-text input (every other input is a timed model)
PROMPT_TEXT = "prompt_text"
#: name of the logger :func:`script_logging` returns (kept from the scripts' first home,
#: ``flexigpt.workflow.dag``, so log lines read as before)
SCRIPT_LOGGER = "flexigpt.workflow.dag"


def checkout_on_pythonpath(root: str | Path) -> None:
    """Put the checkout ``root`` first on ``PYTHONPATH`` for the jobs this process starts.

    Under ``snakemake --use-conda`` a job's environment (``workflow/envs/flexigpt.yaml``)
    holds only the dependencies: a ``-e .`` there would install ``.snakemake/conda/``, the
    folder conda runs pip in. In the venv route the editable install names the same code.
    """
    root = str(Path(root).resolve())
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    os.environ["PYTHONPATH"] = os.pathsep.join([root, *rest])


def script_logging(log_path: str | Path, threads: int | None = None) -> logging.Logger:
    """Route logging and stderr of a Snakemake script to its log file; set torch threads."""
    handler = logging.FileHandler(log_path, mode="w")
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.stderr = open(log_path, "a", buffering=1)  # noqa: SIM115 (tqdm and warnings)
    if threads:
        import torch  # heavy: only scripts that set threads pay for it here

        torch.set_num_threads(int(threads))
    return logging.getLogger(SCRIPT_LOGGER)
