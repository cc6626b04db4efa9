"""Honest parameter accounting: shared storage is counted once."""

from __future__ import annotations

from torch import SymInt, nn


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of unique parameters, de-duplicated by storage.

    Weight-shared linears (FlexiGPT replacement blocks) and tied embeddings point at the
    same storage and are counted once. Includes embeddings, LM head, norms and adapters.
    """
    seen: set[tuple[int, int | SymInt]] = set()
    total = 0
    for p in model.parameters(recurse=True):
        if trainable_only and not p.requires_grad:
            continue
        key = (p.untyped_storage().data_ptr(), p.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += p.numel()
    return total


def compression_ratio(params: int, dense_params: int) -> float:
    """``1 − params/dense`` (the harness's one definition of the compression rate)."""
    return 1.0 - params / dense_params
