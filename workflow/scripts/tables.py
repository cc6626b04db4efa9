"""Every table and plot from the result files of this run.

Params read from the rule (only ``figures`` is required):
  figures      dict: ``manifests``, ``train_logs`` (and optionally ``selections``) → lists of
               paths (files inside directory outputs, so passed as params)
  selections   list of ``results/<model>/<method>/<variant>/<setting>/selection.json`` (the
               recovery LR sweeps); default: none, never discovered under results/
  model_names  dict model key → display name for titles; default: the key

When the results hold a budget ladder (results of table ``budget``: the config's ``budget:``
section), also the budget tables and figures (:func:`flexigpt.tables.budget.build_budget`:
``budget_*.md/.csv``, ``fig_budget_*.png``), listed in ``index.txt`` after the others.
"""

from pathlib import Path
from typing import Any

from flexigpt.fileio import atomic_write_text
from flexigpt.tables import build_all
from flexigpt.tables.budget import build_budget
from flexigpt.workflow_support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

log = script_logging(snakemake.log[0])
params = snakemake.params
figures = dict(params.get("figures") or {})
selections = params.get("selections")
if selections is not None:
    figures["selections"] = list(selections)
figures.setdefault("selections", [])  # an explicit list: no discovery under results/
written = build_all("results", snakemake.output[0], results=list(snakemake.input.evals),
                    timings=list(snakemake.input.inference),
                    model_names=dict(params.get("model_names") or {}), **figures)
out = Path(snakemake.output[0])
ladder = build_budget(list(snakemake.input.evals), out,
                      train_logs=figures.get("train_logs") or [],
                      model_names=dict(params.get("model_names") or {}))
if ladder:
    index = out / "index.txt"
    listed = index.read_text() if index.is_file() else ""
    atomic_write_text(index, listed + "".join(f"{p.relative_to(out)}\n" for p in ladder))
log.info("wrote %d files", len(written) + len(ladder))
