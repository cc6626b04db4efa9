"""Which run of n consecutive blocks LinearPatch removes, and the patch's channel scales
(official ``layer_select.py``: ``get_pruned_layer_with_cosine``, ``get_scale_params``).

With ``x_i`` the hidden states entering block i (``[B, T, D]``):

* span criterion: for every start i = 1 … L − n − 1 (the official loop never removes block 0
  nor the last block), the mean over calibration windows of
  ``cosine_similarity(x_i, x_{i+n})`` taken **along the sequence axis** (the official call
  uses ``torch.cosine_similarity``'s default ``dim=1`` on ``[B, T, D]``: one cosine per
  channel over the window's tokens), averaged over channels; the span of the highest mean
  (ties: the lowest i) is blocks ``i … i + n − 1``;
* scales: per window, ``s = mean_T |x_end·H| / mean_T |x_start·H|`` per channel (``H`` the
  orthonormal Hadamard matrix for ``rotate``, the identity otherwise), averaged over windows;
  the patch is ``P = H·diag(s)·Hᵀ``.

Statistics are per window (the official code's batch of one), so the batch size of the
forward passes does not change them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from baselines.linearpatch.hadamard import hadamard
from flexigpt.methods.hooked_forward import forward_batches, hook_input, registered
from flexigpt.storage.models.adapters import get_adapter


def candidate_starts(n_blocks: int, span: int) -> range:
    """The official candidates ``1 … L − span − 1``.

    Raises:
        ValueError: no candidate (``span > L − 2``).
    """
    if not 0 < span <= n_blocks - 2:
        raise ValueError(f"LinearPatch removes a span of 1 … L − 2 = {n_blocks - 2} blocks "
                         f"(never block 0 nor the last one), got {span}")
    return range(1, n_blocks - span)


def block_inputs(model: nn.Module, watched: list[int], windows: torch.Tensor,
                  batch_size: int):
    """Yield ``{block: x [B, T, D]}`` (the inputs of the ``watched`` blocks) per batch."""
    blocks = get_adapter(model).layers(model)
    states: dict[int, torch.Tensor] = {}

    def keep(index: int):
        def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
            states[index] = hook_input(args, kwargs)
        return hook

    with registered([blocks[i].register_forward_pre_hook(keep(i), with_kwargs=True)
                     for i in watched]):
        for _ in forward_batches(model, windows, batch_size):
            yield dict(states)
            states.clear()


@torch.no_grad()
def span_similarities(model: nn.Module, windows: torch.Tensor, span: int,
                      batch_size: int) -> dict[int, float]:
    """``{start: mean similarity}`` over :func:`candidate_starts` (module docstring)."""
    n_blocks = len(get_adapter(model).layers(model))
    starts = candidate_starts(n_blocks, span)
    sums = dict.fromkeys(starts, 0.0)
    watched = sorted({*starts, *(i + span for i in starts)})
    for states in block_inputs(model, watched, windows, batch_size):
        for i in starts:
            cos = torch.nn.functional.cosine_similarity(
                states[i].double(), states[i + span].double(), dim=1)  # [B, D]: over tokens
            sums[i] += float(cos.mean(dim=1).sum())  # per window: mean over channels
    return {i: total / windows.shape[0] for i, total in sums.items()}


def choose_span(similarities: dict[int, float], span: int) -> tuple[int, int]:
    """``(start, end)``: blocks ``start … end − 1``, the most similar span (ties: lowest)."""
    best = max(similarities, key=lambda i: (similarities[i], -i))
    return best, best + span


@torch.no_grad()
def channel_scales(model: nn.Module, windows: torch.Tensor, start: int, end: int,
                   rotate: bool, batch_size: int) -> torch.Tensor:
    """``s`` ``[D]`` float64 (module docstring): the end's magnitude over the start's per
    (rotated) channel, a ratio per window averaged over windows."""
    config: Any = model.config  # an HF config: its fields vary by family
    hidden = int(config.hidden_size)
    h = hadamard(hidden) if rotate else None
    total = torch.zeros(hidden, dtype=torch.float64)
    for states in block_inputs(model, [start, end], windows, batch_size):
        x_start, x_end = states[start].double(), states[end].double()
        if h is not None:
            x_start, x_end = x_start @ h.to(x_start.device), x_end @ h.to(x_end.device)
        ratio = x_end.abs().mean(dim=1) / x_start.abs().mean(dim=1)  # [B, D] per window
        total += ratio.sum(dim=0).cpu()
    return total / windows.shape[0]


def patch_matrix(scales: torch.Tensor, rotate: bool) -> torch.Tensor:
    """``P = H·diag(s)·Hᵀ`` ``[D, D]`` float64 (``rotate``), else ``diag(s)``."""
    if not rotate:
        return torch.diag(scales)
    h = hadamard(scales.shape[0])
    return h @ torch.diag(scales) @ h.T
