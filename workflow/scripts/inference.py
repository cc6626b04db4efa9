"""Relative inference time and throughput of the models of Tables 6/7, in one process."""

from typing import Any

from flexigpt.runtime.evaluation.inference import run_inference_cost
from flexigpt.workflow.support import PROMPT_TEXT, script_logging

snakemake: Any  # injected by Snakemake's script: directive

script_logging(snakemake.log[0], snakemake.threads)
inputs = dict(snakemake.input.items())
prompt_text = inputs.pop(PROMPT_TEXT)
run_inference_cost(inputs, snakemake.output[0], prompt_text=prompt_text,
                   **snakemake.params.inference)
