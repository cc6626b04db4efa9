"""LLM-Streamline's declaration (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import ALL_FAMILIES, TINY_RATIO, MethodFacts

METHODS = {
    "streamline": MethodFacts("baselines.streamline.method:METHOD", "LLM-Streamline",
                              tiny_options=(*TINY_RATIO, ("epochs", 1)),
                              timed=True, variant_labels=(("lora", "LLM-Streamline + LoRA"),),
                              replacement="one trained module", families=ALL_FAMILIES,
                              order=50, replay="baselines.streamline.replay",
                              official_check="baselines.streamline.official:check",
                              official_code="RUCKBReasoning/LLM-Streamline"),
}
