"""One tuning trial of a recovered run: train at the trial's learning rates, record the
tuning-split perplexity in ``trial.json`` (resumes from its checkpoint after a kill)."""

import json
from pathlib import Path

from flexigpt.training import TrainConfig, TrainingDivergedError, train_model
from flexigpt.training.tuning import (TRIAL_FILE, budget_of, chosen_rates, diverged_record,
                                      trial_record)
from flexigpt.workflow import script_logging

log = script_logging(snakemake.log[0], snakemake.threads)
options = dict(snakemake.params.train)
info = snakemake.params.trial
if "budget" in snakemake.input.keys():
    options["lora_budget"] = budget_of(snakemake.input.budget)
    log.info("trainable budget %d from %s", options["lora_budget"], snakemake.input.budget)
if "lr_from" in snakemake.input.keys():
    rates = chosen_rates(snakemake.input.lr_from)
    options.update({k: v for k, v in rates.items() if v is not None})
    log.info("learning rates %s chosen by %s", rates, snakemake.input.lr_from)
cfg = TrainConfig(**options)
out = Path(snakemake.output.model)
try:
    manifest = train_model(snakemake.input.model, out, cfg, text=snakemake.input.text,
                           validation=snakemake.input.tune,
                           teacher=snakemake.params.teacher)
    record = trial_record(manifest, info["point"])
except TrainingDivergedError as err:  # a diverging trial is a result of the sweep, not a failure
    log.warning("trial %s diverged: %s", info["trial"], err)
    out.mkdir(parents=True, exist_ok=True)
    record = diverged_record(info["point"], cfg.lr, cfg.gamma_lr, str(err))
(out / TRIAL_FILE).write_text(json.dumps({**record, "run": info["run"],
                                          "trial": info["trial"]}, indent=2) + "\n")
