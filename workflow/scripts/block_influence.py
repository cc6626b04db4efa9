"""Block Influence of every block of {model}, computed once and reused by FlexiGPT/ShortGPT."""

import json
import time
from typing import Any

from flexigpt.core.devices import model_device
from flexigpt.core.fileio import atomic_write_text
from flexigpt.core.provenance import setup_run
from flexigpt.methods.block_influence import block_influence
from flexigpt.methods.calibration import token_windows
from flexigpt.storage.models import load_model
from flexigpt.workflow.support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

log = script_logging(snakemake.log[0], snakemake.threads)
cal = snakemake.params.calibration
setup_run(cal["seed"])
model, tokenizer = load_model(snakemake.params.model, dtype=cal["dtype"],
                              device=cal.get("device", "cpu"))
windows = token_windows(snakemake.input.text, tokenizer, cal["seq_len"], cal["n_calibration"],
                        seed=cal["seed"])
start = time.perf_counter()
scores = block_influence(model, windows)
log.info("block influence: %s (compute %.1f s)", [round(s, 4) for s in scores],
         time.perf_counter() - start)
atomic_write_text(snakemake.output[0], json.dumps(
    {"block_influence": scores, "calibration": {**cal, "text": snakemake.input.text},
     "device": str(model_device(model))},
    indent=2))
