"""Baseline compression methods re-implemented behind the harness's method registry.

Each baseline is a package ``baselines/<name>/`` with ``config.py`` (options dataclass) and
``method.py`` (``METHOD``), resolved lazily through ``flexigpt.storage.registry.METHODS``:
``shortgpt`` / ``shortgpt_lora`` (block removal by Block Influence), ``llm_pruner``
(block-wise structured pruning with first-order Taylor importance), ``slicegpt``.
"""
