"""Relative inference time and throughput of the models of Tables 6/7, in one process."""

from flexigpt.evaluation.inference import run_inference_cost
from flexigpt.workflow import script_logging

script_logging(snakemake.log[0], snakemake.threads)
run_inference_cost(dict(snakemake.input.items()), snakemake.output[0], **snakemake.params.inference)
