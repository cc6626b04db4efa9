"""Layer 3, methods: the compression methods and the tools they share.

Shared by every method: block surgery (``surgery``), weight sharing (``sharing``), LoRA
adapters (``lora``), the one block-rounding rule (``block_count``), Block Influence
(``block_influence``), total vs non-embedding ratios (``compression_basis``), calibration
windows (``calibration``), perplexity (``perplexity``), the watched calibration forward
(``hooked_forward``) and truncated SVDs (``truncated_svd``). FlexiGPT itself is one method
among the others: ``flexigpt/`` here, the baselines in the top-level ``baselines/`` package
(the same layer), the dense reference in ``dense``.
"""
