"""LLM-Pruner (Ma, Fang, Wang, NeurIPS 2023), block-wise: Taylor-scored heads and FFN channels."""
