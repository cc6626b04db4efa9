"""ReplaceMe's declaration (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import TINY_RATIO, MethodFacts

#: why ReplaceMe refuses Gemma 3 (docs/families.md)
MAP_PAST_POST_NORM = (
    "the linear map cannot be folded into down_proj past the MLP's post-norm, and the harness "
    "has no non-stock ReplaceMe checkpoint to hold it")

METHODS = {
    "replaceme": MethodFacts("baselines.replaceme.method:METHOD", "ReplaceMe",
                             tiny_options=TINY_RATIO, block_count="remove", timed=True,
                             variant_labels=(("lora", "ReplaceMe + LoRA"),),
                             replacement="linear map (folded)",
                             family_refusals=(("gemma3", MAP_PAST_POST_NORM),), order=40,
                             official_check="baselines.replaceme.official:check",
                             official_code="mts-ai/ReplaceMe"),
}
