"""The fast exact lm-eval scorer (lm-eval model ``flexigpt-fast``, :class:`lm.FastHFLM`).

``lm`` is the lm-eval model: requests are deduplicated and packed (``packing``: shared
context prefixes, rows by token budget), scored with a chunked LM head into reused buffers
(``scoring``), optionally laid out as prefix trees with per-bucket attention
(``tree_attention``), on a glibc heap that keeps its pages (:func:`flexigpt.core.memory.keep_heap_for_reuse`). Outputs equal
stock ``HFLM``'s (a self-check on the first call).
"""
