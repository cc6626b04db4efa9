# Config validation, the run grid and input functions. Everything below is a pure function of
# the (validated) config; heavy logic lives in the flexigpt package.
from pathlib import Path

from snakemake.utils import validate

from flexigpt.provenance import code_version
from flexigpt.workflow import RunGrid

validate(config, schema="../schemas/config.schema.yaml")
GRID = RunGrid.from_config(config)
CODE_VERSION = code_version()
JOB_THREADS = config.get("jobs", {}).get("threads", 2)  # torch threads of each heavy job
JOB_GPU = config.get("jobs", {}).get("gpu", 1)  # `gpu` resource units each heavy job holds


wildcard_constraints:
    model="|".join(GRID.model_keys),
    method="[a-z_]+",
    variant="[a-z0-9_]+",
    setting=r"r0\.[0-9]+|full|L[0-9]+",
    stage="start|final",


def model_input(wildcards):
    """The base model as a file input when it is local (hub ids are passed as params)."""
    return GRID.local_model_inputs(wildcards.model)


def run_of(wildcards):
    return GRID.run(wildcards.model, wildcards.method, wildcards.variant, wildcards.setting)


def compress_inputs(wildcards):
    run = run_of(wildcards)
    inputs = dict(GRID.local_model_inputs(wildcards.model))
    if run.needs_calibration:
        inputs["text"] = GRID.calibration_text
    if run.uses_block_influence:
        inputs["bi"] = f"results/{wildcards.model}/block_influence.json"
    return inputs


def compress_params(wildcards):
    return run_of(wildcards).compress_params()


def final_model_dir(wildcards):
    run = run_of(wildcards)
    kind = "trained" if run.recovery else "compressed"
    return f"results/{wildcards.model}/{wildcards.method}/{wildcards.variant}/{wildcards.setting}/{kind}"


def eval_model_dir(wildcards):
    if wildcards.stage == "start":
        return f"results/{wildcards.model}/{wildcards.method}/{wildcards.variant}/{wildcards.setting}/compressed"
    return final_model_dir(wildcards)


def eval_inputs(wildcards):
    inputs = {"model": eval_model_dir(wildcards), "ppl_text": GRID.validation_text}
    if wildcards.stage == "final" and GRID.task_source == "local":
        inputs["benchmarks"] = GRID.benchmarks
    return inputs


def eval_params(wildcards):
    return GRID.eval_params(run_of(wildcards), wildcards.stage)


def train_params(wildcards):
    return GRID.train_params(run_of(wildcards))


def inference_inputs(wildcards):
    return {name: final_model_dir(run.wildcards_ns())
            for name, run in GRID.inference_runs(wildcards.model).items()}
