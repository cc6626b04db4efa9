"""ShortGPT (Men et al., 2024): remove the decoder blocks with the lowest Block Influence."""
