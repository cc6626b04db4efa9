"""Keep the trial with the lowest tuning-split perplexity as the run's trained model."""

from flexigpt.training.tuning import select_trial
from flexigpt.workflow import script_logging

script_logging(snakemake.log[0])
select_trial(list(snakemake.input.trials), snakemake.output.model, dict(snakemake.params.meta))
