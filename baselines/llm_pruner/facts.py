"""LLM-Pruner's declaration (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import ALL_FAMILIES, TINY_RATIO, MethodFacts

METHODS = {
    "llm_pruner": MethodFacts("baselines.llm_pruner.method:METHOD", "LLM-Pruner",
                              tiny_options=TINY_RATIO,
                              variant_labels=(("lora", "LLM-Pruner + LoRA"),),
                              paper_variants=("default", "lora"), families=ALL_FAMILIES,
                              calibration_flop=6, order=20, replay="baselines.llm_pruner.replay"),
}
