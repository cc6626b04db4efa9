"""LinearPatch's declaration (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import ALL_FAMILIES, TINY_RATIO, MethodFacts

METHODS = {
    "linearpatch": MethodFacts("baselines.linearpatch.method:METHOD", "LinearPatch",
                               tiny_options=TINY_RATIO,
                               variant_labels=(("lora", "LinearPatch + LoRA"),),
                               replacement="Hadamard-rotated channel scaling",
                               families=ALL_FAMILIES, replay="baselines.linearpatch.replay",
                               order=55,
                               official_check="baselines.linearpatch.official:check",
                               official_code="chenxinrui-tsinghua/LinearPatch"),
}
