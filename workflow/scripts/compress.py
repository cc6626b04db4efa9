"""Compress (or extend) {model} with {method}; precomputed Block Influence is passed in, and
a like-for-like baseline gets the achieved ratio of the model it is matched to."""

import json
from typing import Any

from flexigpt.api.compression import compress
from flexigpt.storage.artifacts import read_manifest
from flexigpt.storage.registry import get_method
from flexigpt.workflow.support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

log = script_logging(snakemake.log[0], snakemake.threads)
run = snakemake.params.run
options = dict(run["options"])
method = get_method(run["method"])
if "bi" in snakemake.input.keys() and method.accepts("bi_scores"):
    with open(snakemake.input.bi) as fh:
        options["bi_scores"] = json.load(fh)["block_influence"]
if "match" in snakemake.input.keys():
    options["match_ratio"] = read_manifest(snakemake.input.match).parameters.achieved_ratio
    log.info("matching the achieved ratio %.6f of %s", options["match_ratio"],
             snakemake.input.match)
compress(run["method"], snakemake.params.model, snakemake.output.model, options=options,
         calibration=snakemake.input.get("text"), n_calibration=run["n_calibration"],
         calibration_seq_len=run["seq_len"], seed=run["seed"], dtype=run["dtype"],
         device=run["device"], basis=run.get("basis", "total"))
