"""Recovery of one run: every trial of its tuning grid by successive halving on the tuning
split, the best kept as the run's trained model (``selection.json`` lists every trial;
resumes from the trials' checkpoints after a kill)."""

from flexigpt.training import TrainConfig
from flexigpt.training.tuning import budget_of, chosen_rates, run_sweep
from flexigpt.dag import script_logging

log = script_logging(snakemake.log[0], snakemake.threads)
shared = {}
if "budget" in snakemake.input.keys():
    shared["lora_budget"] = budget_of(snakemake.input.budget)
    log.info("trainable budget %d from %s", shared["lora_budget"], snakemake.input.budget)
if "lr_from" in snakemake.input.keys():
    rates = chosen_rates(snakemake.input.lr_from)
    shared.update({k: v for k, v in rates.items() if v is not None})
    log.info("learning rates %s chosen by %s", rates, snakemake.input.lr_from)
trials = snakemake.params.trials
configs = [TrainConfig(**{**t["config"], **shared}) for t in trials]
run_sweep(snakemake.input.model, snakemake.output.model, configs,
          [t["point"] for t in trials], text=snakemake.input.text, tune=snakemake.input.tune,
          meta=dict(snakemake.params.meta), rung=snakemake.params.rung,
          teacher=snakemake.params.teacher)
