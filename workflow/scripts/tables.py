"""Every table and plot from the result files of this run.

Params read from the rule (only ``figures`` is required):
  figures      dict: ``manifests``, ``train_logs`` (and optionally ``selections``) → lists of
               paths (files inside directory outputs, so passed as params)
  selections   list of ``results/<model>/<method>/<variant>/<setting>/selection.json`` (the
               recovery LR sweeps); default: none, never discovered under results/
  model_names  dict model key → display name for titles; default: the key

The model's facts (embedding parameters, compression basis: flexigpt.tables.facts) are
counted on a meta-device skeleton of the config's local checkpoint.

When the results hold a budget ladder (results of table ``budget``: the config's ``budget:``
section), :func:`~flexigpt.tables.build_all` also writes the budget tables and figures
(``budget_*.md/.csv``, ``fig_budget_*.png``; :mod:`flexigpt.tables.budget`).
"""

from typing import Any

from flexigpt.tables import build_all
from flexigpt.workflow.dag.table_inputs import model_facts
from flexigpt.workflow.support import script_logging

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
                    model_names=dict(params.get("model_names") or {}),
                    model_facts=model_facts(snakemake.config), **figures)
log.info("wrote %d files", len(written))
