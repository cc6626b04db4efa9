"""LinearPatch's fragment of the standalone remote-code loader: the patch layer at the removed
span's start (mirrors :mod:`baselines.linearpatch.modules`). Assembled after
:mod:`flexigpt.storage.standalone` by :mod:`flexigpt.export.standalone`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from flexigpt.storage.standalone import MLP, _get, register_replay


class LinearPatchLayer(nn.Module):
    """``hidden_states @ P`` in a decoder block's place (``rotate``: ``patch``, a bias-free
    ``nn.Linear`` holding the symmetric ``P``; else ``P = diag(scale)``)."""

    def __init__(self, hidden: int, rotate: bool, dtype: torch.dtype) -> None:
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


def replay_linearpatch(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """The patch at the span's start (the config already has ``L − n + 1`` layers)."""
    layers = model.model.layers
    start = int(s["span"][0])
    dtype = _get(layers[start], f"{MLP}.down_proj").weight.dtype
    layers[start] = LinearPatchLayer(model.config.hidden_size, bool(s["rotate"]), dtype)


register_replay("linearpatch", replay_linearpatch)
