"""A text file from a hub dataset (paper setting: MiniPile, SlimPajama)."""

from flexigpt.resources.hub_text import build_hub_text
from flexigpt.dag import script_logging

script_logging(snakemake.log[0])
source = snakemake.params.source
build_hub_text(source["dataset"], source["split"], snakemake.output[0],
               max_documents=source.get("max_documents"))
