"""LLM-Pruner (Ma, Fang, Wang, NeurIPS 2023), block-wise: Taylor-scored heads and FFN channels."""

from baselines.llm_pruner.config import LLMPrunerConfig

__all__ = ["LLMPrunerConfig"]
