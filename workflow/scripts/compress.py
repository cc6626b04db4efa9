"""Compress (or extend) {model} with {method}; precomputed Block Influence is passed in."""

import json

from flexigpt.api import compress
from flexigpt.registry import get_method
from flexigpt.workflow import script_logging

script_logging(snakemake.log[0], snakemake.threads)
run = snakemake.params.run
options = dict(run["options"])
if "bi" in snakemake.input.keys() and get_method(run["method"]).accepts("bi_scores"):
    with open(snakemake.input.bi) as fh:
        options["bi_scores"] = json.load(fh)["block_influence"]
compress(run["method"], snakemake.params.model, snakemake.output.model, options=options,
         calibration=snakemake.input.get("text"), n_calibration=run["n_calibration"],
         calibration_seq_len=run["seq_len"], seed=run["seed"], dtype=run["dtype"])
