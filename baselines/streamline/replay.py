"""LLM-Streamline's fragment of the standalone remote-code loader: a two-layer ReLU FFN in
place of a span of blocks (mirrors :mod:`baselines.streamline.modules`; the block variant is
a stock checkpoint). Assembled after :mod:`flexigpt.storage.standalone` by
:mod:`flexigpt.export.standalone`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from flexigpt.storage.standalone import MLP, _get, register_replay


class StreamlineFFN(nn.Module):
    """LLM-Streamline's FFN replacement of a span of blocks: ``fc2(relu(fc1(h)))``, no
    residual; it stands in a decoder block's place and mixes no tokens."""

    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden, dtype=dtype)
        self.fc2 = nn.Linear(4 * hidden, hidden, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(hidden_states)))


def replay_streamline(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """The FFN module at the span's start (the block variant is a stock checkpoint)."""
    if s.get("module") != "ffn":
        return
    layers = model.model.layers
    start = int(s["span"][0])
    dtype = _get(layers[start], f"{MLP}.down_proj").weight.dtype
    layers[start] = StreamlineFFN(model.config.hidden_size, dtype)


register_replay("streamline", replay_streamline, "LLMStreamline")
