"""The patch layer, and LinearPatch's fragment of the standalone remote-code loader.

:class:`LinearPatchLayer` is the one definition: the method builds it and the remote-code file
(this module assembled after :mod:`flexigpt.storage.standalone` by
:mod:`flexigpt.export.standalone`, stripped of its harness imports) replays it, so it
imports only torch and transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from flexigpt.storage.standalone import MLP, _get, register_replay


class LinearPatchLayer(nn.Module):
    """Stands in a decoder block's place: ``forward(hidden_states [B, T, D], **ignored)``
    returns ``hidden_states @ P`` (the residual stream itself is patched, as the official
    forward hook on the block before the span does). ``rotate``: ``P`` is the weight of
    ``patch`` (a bias-free ``nn.Linear(D, D)``: ``y = x Wᵀ`` with ``W = P`` symmetric); else
    ``P = diag(scale)``. Masks, positions and caches are accepted and ignored: the patch
    mixes no tokens."""

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
        """``D²`` (a dense patch) or ``D`` (channel scales)."""
        return hidden * hidden if rotate else hidden


def replay_linearpatch(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """The patch at the span's start (the config already has ``L − n + 1`` layers)."""
    layers = model.model.layers
    start = int(s["span"][0])
    dtype = _get(layers[start], f"{MLP}.down_proj").weight.dtype
    layers[start] = LinearPatchLayer(model.config.hidden_size, bool(s["rotate"]), dtype)


register_replay("linearpatch", replay_linearpatch, "LinearPatch")
