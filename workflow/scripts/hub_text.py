"""A text file from a hub dataset (paper setting: MiniPile, SlimPajama)."""

from typing import Any

from flexigpt.runtime.resources.hub_text import build_hub_text
from flexigpt.workflow.support import script_logging

snakemake: Any  # injected by Snakemake's script: directive

script_logging(snakemake.log[0])
source = snakemake.params.source
build_hub_text(source["dataset"], source["split"], snakemake.output[0],
               max_documents=source.get("max_documents"))
