"""Perplexity over fixed token windows: one protocol for every method.

Protocol: the held-out text is cut into consecutive, non-overlapping windows of ``seq_len``
tokens by :func:`flexigpt.calibration.token_windows` (BOS first, stride = seq_len, no context
carried between windows); every predicted token of every window counts equally.
PPL = exp(total NLL / number of predicted tokens).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from tqdm.auto import tqdm


@torch.no_grad()
def window_nll(model: nn.Module, windows: torch.Tensor, batch_size: int = 8,
               progress: bool = False) -> tuple[float, int]:
    """Summed next-token NLL (fp32) and number of predicted tokens over ``windows [N, T]``."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for start in tqdm(range(0, windows.shape[0], batch_size), desc="perplexity",
                          disable=not progress):
            ids = windows[start:start + batch_size].to(device)
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            nll = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                              ids[:, 1:].reshape(-1), reduction="sum")
            total += float(nll)
            count += ids[:, 1:].numel()
    finally:
        model.train(was_training)
    return total, count


def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 8,
               progress: bool = False) -> float:
    """exp(mean NLL) over all predicted tokens of ``windows [N, T]``.

    Raises:
        FloatingPointError: the NLL is not finite (a broken model must not yield a number).
    """
    total, count = window_nll(model, windows, batch_size, progress)
    if not math.isfinite(total):
        raise FloatingPointError("perplexity: the model produced a non-finite loss")
    return math.exp(total / count)
