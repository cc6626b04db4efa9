"""The FFN replacement of LLM-Streamline (official example ``MLP``: d → 4d → d with ReLU,
biases, no residual connection: it maps the span's input hidden state to its output)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class StreamlineFFN(nn.Module):
    """Stands in a decoder block's place: ``forward(hidden_states [B, T, D], **ignored)``
    returns ``fc2(relu(fc1(hidden_states)))`` ``[B, T, D]`` (attention masks, positions and
    caches are accepted and ignored: the module mixes no tokens)."""

    def __init__(self, hidden: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden, dtype=dtype)
        self.fc2 = nn.Linear(4 * hidden, hidden, dtype=dtype)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(hidden_states)))

    @staticmethod
    def parameter_count(hidden: int) -> int:
        """``8·d² + 5·d`` (two biased linears)."""
        return 8 * hidden * hidden + 5 * hidden
