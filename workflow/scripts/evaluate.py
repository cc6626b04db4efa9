"""Perplexity (+ zero-shot tasks at stage final) of one model into one result JSON."""

from typing import Any

from flexigpt.runtime.evaluation import evaluate_model
from flexigpt.workflow.support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

script_logging(snakemake.log[0], snakemake.threads)
ev = dict(snakemake.params.evaluation)
evaluate_model(snakemake.input.model, snakemake.output[0], tasks=ev.pop("tasks"),
               tasks_dir=snakemake.input.get("tasks"),
               ppl_text=snakemake.input.ppl_text, **ev)
