"""Split the held-out text by document into the tuning and the perplexity-test split."""

from typing import Any

from flexigpt.methods.calibration import split_heldout
from flexigpt.workflow.support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

log = script_logging(snakemake.log[0])
counts = split_heldout(snakemake.input.text, snakemake.output.tune, snakemake.output.test)
log.info("split %s: %s", snakemake.input.text, counts)
