"""Perplexity over fixed token windows: one protocol for every method.

Protocol: the held-out text is cut into consecutive, non-overlapping windows of ``seq_len``
tokens by :func:`flexigpt.methods.calibration.token_windows` (BOS first, stride = seq_len, no context
carried between windows); every predicted token of every window counts equally.
PPL = exp(total NLL / number of predicted tokens).

:func:`window_nlls` also keeps each window's summed NLL and token count (the per-window
records that a paired bootstrap of log-PPL resamples); its ``total``/``count`` are computed
exactly as :func:`window_nll` computes them, so ``exp(total / count)`` equals
:func:`perplexity` bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from flexigpt.core.devices import model_device


def window_nll(model: nn.Module, windows: torch.Tensor, batch_size: int = 8,
               progress: bool = False) -> tuple[float, int]:
    """Summed next-token NLL (fp32) and number of predicted tokens over ``windows [N, T]``
    (the totals of :func:`window_nlls`)."""
    nlls = window_nlls(model, windows, batch_size, progress)
    return nlls.total, nlls.count


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


@dataclass
class WindowNLL:
    """Per-window NLL of one perplexity run.

    Attributes:
        nll: summed next-token NLL of each window (fp32 token losses summed in fp64).
        tokens: predicted tokens of each window (``T - 1``).
        total, count: the totals :func:`window_nll` returns (same arithmetic).
    """

    nll: list[float]
    tokens: list[int]
    total: float
    count: int

    def perplexity(self) -> float:
        """``exp(total / count)`` (= :func:`perplexity`); raises on a non-finite NLL."""
        if not math.isfinite(self.total):
            raise FloatingPointError("perplexity: the model produced a non-finite loss")
        return math.exp(self.total / self.count)


@torch.no_grad()
def window_nlls(model: nn.Module, windows: torch.Tensor, batch_size: int = 8,
                progress: bool = False) -> WindowNLL:
    """:func:`window_nll` plus the summed NLL and token count of every window."""
    device = model_device(model)
    total, count = 0.0, 0
    per_nll: list[float] = []
    per_tok: list[int] = []
    was_training = model.training
    model.eval()
    try:
        for start in tqdm(range(0, windows.shape[0], batch_size), desc="perplexity",
                          disable=not progress):
            ids = windows[start:start + batch_size].to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            tok = _token_nlls(logits, ids)
            total += float(tok.sum())
            count += ids[:, 1:].numel()
            per_nll.extend(tok.view(ids.shape[0], -1).double().sum(dim=1).tolist())
            per_tok.extend([ids.shape[1] - 1] * ids.shape[0])
    finally:
        model.train(was_training)
    return WindowNLL(per_nll, per_tok, total, count)


def _token_nlls(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Next-token NLL (fp32) of every predicted position, ``[B·(T−1)]`` in row order, from
    ``logits [B, T, V]`` of any float dtype and ``ids [B, T]``.

    Equal, element for element, to ``cross_entropy(logits[:, :-1].float().reshape(-1, V),
    ids[:, 1:].reshape(-1))`` (each row's log-softmax is reduced on its own), but one window
    at a time: the fp32 temporaries are ``[T−1, V]``, not ``[B·(T−1), V]`` (400 MB at
    8 × 512 × 49,152).
    """
    return torch.cat([nn.functional.cross_entropy(logits[i, :-1].float(), ids[i, 1:],
                                                  reduction="none")
                      for i in range(ids.shape[0])])
