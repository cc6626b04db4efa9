"""Which contiguous span ReplaceMe removes: the official angular-distance rule.

For a span length n, the official ``distance.py`` compares, at the *last token* of every
calibration sequence, the output of block l with the output of block l + n:
``d(l) = arccos(cos(h_l, h_{l+n})) / π``, averaged over sequences, for l = 0 … L − n − 1, and
removes blocks l* + 1 … l* + n of the lowest ``d`` (ties: the lowest l; the first block is
never removed: the map is folded into the block before the span). It reads transformers'
``output_hidden_states``, whose last entry is the *final-normed* output of the last block;
:func:`last_token_outputs` applies the final norm to the last block the same way, so a span
ending at the last block is scored as the official code scores it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from flexigpt.methods.hooked_forward import forward_batches, hook_output, registered
from flexigpt.storage.models.adapters import get_adapter


@torch.no_grad()
def last_token_outputs(model: nn.Module, windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Every block's output at the last position of every window, float32 ``[L, N, D]``
    (the last block's after the final norm, as transformers reports hidden states)."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    found: list[list[torch.Tensor]] = [[] for _ in blocks]

    def hook(idx: int):
        def capture(module: nn.Module, args: tuple, output: Any) -> None:
            found[idx].append(hook_output(output)[:, -1, :].detach().float().cpu())
        return capture

    with registered(b.register_forward_hook(hook(i)) for i, b in enumerate(blocks)):
        for _ in forward_batches(model, windows, batch_size):
            pass
    outputs = torch.stack([torch.cat(parts) for parts in found])  # [L, N, D]
    norm = adapter.final_norm(model)
    param = next(norm.parameters())
    outputs[-1] = norm(outputs[-1].to(device=param.device, dtype=param.dtype)).float().cpu()
    return outputs


def angular_distances(outputs: torch.Tensor, span: int) -> torch.Tensor:
    """``[L − span]`` mean angular distance (in [0, 1]) between block outputs l and l + span.

    Args:
        outputs: ``[L, N, D]`` (:func:`last_token_outputs`).
    """
    n_blocks = outputs.shape[0]
    if not 0 < span < n_blocks:
        raise ValueError(f"a span of {span} blocks needs 0 < span < {n_blocks}")
    a, b = outputs[:-span].double(), outputs[span:].double()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).clamp(-1.0, 1.0)  # [L-span, N]
    return (torch.arccos(cos) / math.pi).mean(-1)


def choose_span(distances: torch.Tensor, span: int) -> tuple[int, int]:
    """``(start, end)``: remove blocks ``start … end − 1``, where ``start = l* + 1`` for the
    lowest distance (ties: the lowest l) and ``end = start + span``."""
    best = int(torch.argmin(distances))  # the first minimum: the lowest l among ties
    return best + 1, best + 1 + span
