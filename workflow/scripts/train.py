"""Recovery training of one compressed model (resumes from its checkpoint after a kill)."""

from flexigpt.training import TrainConfig, train_model
from flexigpt.workflow import script_logging

script_logging(snakemake.log[0], snakemake.threads)
cfg = TrainConfig(**snakemake.params.train)
train_model(snakemake.input.model, snakemake.output.model, cfg, text=snakemake.input.text,
            validation=snakemake.input.validation)
