"""Layer 5, runtime: what runs a model.

The one recovery trainer (``training``), lm-eval and perplexity evaluation (``evaluation``),
decoding (``generation``) and the offline resource builders (``resources``).
"""
