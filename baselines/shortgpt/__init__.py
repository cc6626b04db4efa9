"""ShortGPT (Men et al., 2024): remove the decoder blocks with the lowest Block Influence."""

from baselines.shortgpt.config import ShortGPTConfig, ShortGPTLoRAConfig

__all__ = ["ShortGPTConfig", "ShortGPTLoRAConfig"]
