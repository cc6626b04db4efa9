"""Baseline compression methods re-implemented behind the harness's method registry.

Each baseline is a package ``baselines/<name>/`` with ``facts.py`` (its declaration, which
``flexigpt.storage.registry`` discovers), ``config.py`` (options dataclass) and ``method.py``
(``METHOD``, loaded lazily from the declaration's target):
``shortgpt`` / ``shortgpt_lora`` (block removal by Block Influence), ``llm_pruner``
(block-wise structured pruning with first-order Taylor importance), ``slicegpt``.
"""
