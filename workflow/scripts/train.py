"""Recovery of one run: every trial of its tuning grid by successive halving on the tuning
split, the best kept as the run's trained model (``selection.json`` lists every trial;
resumes from the trials' checkpoints after a kill). On several processes (``accelerate
launch``) when ``jobs.train_processes`` says so or the job holds several visible GPUs
(:mod:`flexigpt.runtime.training.launch`)."""

from typing import Any

from flexigpt.runtime.training.choices import budget_of, chosen_rates
from flexigpt.runtime.training.launch import processes_for, run_launched, run_spec
from flexigpt.workflow.support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

log = script_logging(snakemake.log[0], snakemake.threads)
shared: dict[str, int | float] = {}
if "budget" in snakemake.input.keys():
    shared["lora_budget"] = budget_of(snakemake.input.budget)
    log.info("trainable budget %d from %s", shared["lora_budget"], snakemake.input.budget)
if "lr_from" in snakemake.input.keys():
    next_best = bool(snakemake.params.get("lr_next", False))
    rates = chosen_rates(snakemake.input.lr_from, next_best=next_best)
    shared.update({k: v for k, v in rates.items() if v is not None})
    log.info("learning rates %s %s by %s", rates,
             "next-best" if next_best else "chosen", snakemake.input.lr_from)
trials = snakemake.params.trials
configs = [{**t["config"], **shared} for t in trials]
spec = {"model": snakemake.input.model, "out": snakemake.output.model, "configs": configs,
        "points": [t["point"] for t in trials], "text": snakemake.input.text,
        "tune": snakemake.input.tune, "meta": dict(snakemake.params.meta),
        "rung": snakemake.params.rung, "teacher": snakemake.params.teacher,
        "search": snakemake.params.get("search"),
        "finish_all": bool(snakemake.params.get("rung_check", False))}
processes = processes_for(snakemake.params.get("processes"),
                          getattr(snakemake.resources, "gpu", 0))
if processes > 1:  # data-parallel on the job's GPUs (gloo on CPU), same global batch
    log.info("sweep on %d processes (accelerate launch)", processes)
    run_launched(spec, processes, snakemake.threads)
else:
    run_spec(spec)
