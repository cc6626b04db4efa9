"""SliceGPT's declaration (read by :mod:`flexigpt.storage.registry`)."""

from flexigpt.storage.method_facts import TINY_RATIO, MethodFacts

#: why SliceGPT refuses Gemma 3 (docs/families.md)
SANDWICH_NORMS_BREAK_INVARIANCE = (
    "its post-norms on every sub-layer's output break the computational invariance SliceGPT's "
    "rotation needs (the official code does not support it either)")

METHODS = {
    "slicegpt": MethodFacts("baselines.slicegpt.method:METHOD", "SliceGPT",
                            tiny_options=(*TINY_RATIO, ("round_to", 2), ("tolerance", 0.05)),
                            variant_labels=(("rft", "SliceGPT + RFT"),),
                            paper_variants=("default", "rft"),
                            structure_defaults=(("head_bias", False),),
                            family_refusals=(("gemma3", SANDWICH_NORMS_BREAK_INVARIANCE),),
                            embedding_surgery=True, calibration_flop=2, order=10, replay="baselines.slicegpt.replay"),
}
