"""ShortGPT's declarations, one-shot and with LoRA recovery (read by
:mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import ALL_FAMILIES, TINY_RATIO, MethodFacts

METHODS = {
    "shortgpt": MethodFacts("baselines.shortgpt.method:METHOD", "ShortGPT", tiny_options=TINY_RATIO,
                            block_influence=True, timed=True, block_count="remove",
                            variant_labels=(("last3", "ShortGPT + FT last 3 blocks & head"),),
                            replacement="nothing (skip)", paper_variants=("default",),
                            families=ALL_FAMILIES, roles=("skip",), order=30),
    "shortgpt_lora": MethodFacts("baselines.shortgpt.method:METHOD_LORA", "ShortGPT + LoRA",
                                 tiny_options=TINY_RATIO,
                                 block_influence=True, block_count="remove",
                                 replacement="nothing (skip)", paper_variants=("default",),
                                 families=ALL_FAMILIES, roles=("comparator",), order=31),
}
