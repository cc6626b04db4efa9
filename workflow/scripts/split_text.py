"""Split the held-out text by document into the tuning and the perplexity-test split."""

from flexigpt.calibration import split_heldout
from flexigpt.dag import script_logging

log = script_logging(snakemake.log[0])
counts = split_heldout(snakemake.input.text, snakemake.output.tune, snakemake.output.test)
log.info("split %s: %s", snakemake.input.text, counts)
