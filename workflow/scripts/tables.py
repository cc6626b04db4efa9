"""Every table and plot from the result files of this run."""

from flexigpt.tables import build_all
from flexigpt.workflow import script_logging

log = script_logging(snakemake.log[0])
written = build_all("results", snakemake.output[0], results=list(snakemake.input.evals),
                    timings=list(snakemake.input.inference), **snakemake.params.figures)
log.info("wrote %d files", len(written))
