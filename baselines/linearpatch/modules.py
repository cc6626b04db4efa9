"""The patch that stands where the removed span was."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class LinearPatchLayer(nn.Module):
    """Stands in a decoder block's place: ``forward(hidden_states [B, T, D], **ignored)``
    returns ``hidden_states @ P`` (``P`` symmetric for ``rotate``, diagonal otherwise; the
    residual stream itself is patched, as the official forward hook on the block before the
    span does). ``rotate``: ``P`` is the weight of ``patch`` (``nn.Linear(D, D)``, no bias:
    ``y = x Wᵀ`` with ``W = P`` symmetric); else ``P = diag(scale)``. Masks, positions and
    caches are accepted and ignored: the patch mixes no tokens."""

    def __init__(self, hidden: int, rotate: bool, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.rotate = bool(rotate)
        if self.rotate:
            self.patch = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        else:
            self.scale = nn.Parameter(torch.ones(hidden, dtype=dtype))

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.rotate:
            return self.patch(hidden_states)
        return hidden_states * self.scale

    @staticmethod
    def parameter_count(hidden: int, rotate: bool) -> int:
        """``d²`` (a dense patch) or ``d`` (channel scales)."""
        return hidden * hidden if rotate else hidden
