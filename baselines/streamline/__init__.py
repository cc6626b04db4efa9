"""LLM-Streamline (Chen et al., ICLR 2025; arXiv 2403.19135): remove the most redundant run
of consecutive blocks and train a lightweight module to reproduce its output.

Modules: ``config`` (options), ``span`` (cosine similarity of a span's input and output),
``modules`` (the FFN replacement), ``train`` (the MSE fit on calibration hidden states),
``method`` (``METHOD`` for the registry: compress / rebuild).
"""
