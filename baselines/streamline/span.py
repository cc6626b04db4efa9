"""Which run of n consecutive blocks LLM-Streamline removes (official ``get_cosine.py``).

With transformers' hidden states ``h_0`` (the input of block 0) … ``h_L`` (the output of the
last block, *after the final norm*, as transformers reports it), the similarity of span j is
the mean over calibration tokens of ``0.5 + 0.5·cos(h_j, h_{j+n})``, averaged over sequences,
for j = 0 … L − n; the span of the highest similarity (ties: the lowest j) is blocks
``j … j + n − 1``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flexigpt.methods.hooked_forward import forward_batches, hook_input, hook_output, registered
from flexigpt.storage.models.adapters import get_adapter


@torch.no_grad()
def span_similarities(model: nn.Module, windows: torch.Tensor, span: int,
                      batch_size: int) -> torch.Tensor:
    """``[L − span + 1]`` float64 similarities of every span start (see the module docstring)."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    n_blocks = len(blocks)
    if not 0 < span < n_blocks:
        raise ValueError(f"a span of {span} blocks needs 0 < span < {n_blocks}")
    states: list[torch.Tensor] = []

    def first(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        states.append(hook_input(args, kwargs))

    def after(module: nn.Module, args: tuple, output: Any) -> None:
        states.append(hook_output(output))

    norm = adapter.final_norm(model)
    sums = torch.zeros(n_blocks - span + 1, dtype=torch.float64)
    with registered([blocks[0].register_forward_pre_hook(first, with_kwargs=True),
                     *(b.register_forward_hook(after) for b in blocks)]):
        for _ in forward_batches(model, windows, batch_size):
            hidden = [*states[:-1], norm(states[-1])]  # h_0 … h_L, the last one normed
            states.clear()
            for j in range(n_blocks - span + 1):
                cos = torch.nn.functional.cosine_similarity(
                    hidden[j].double(), hidden[j + span].double(), dim=-1)  # [B, T]
                sums[j] += (0.5 + 0.5 * cos).mean(-1).sum().cpu()
    return sums / windows.shape[0]


def choose_span(similarities: torch.Tensor, span: int) -> tuple[int, int]:
    """``(start, end)``: blocks ``start … end − 1``, the most similar span (ties: lowest)."""
    best = int(torch.argmax(similarities))  # the first maximum
    return best, best + span
