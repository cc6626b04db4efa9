"""First-order Taylor importance of attention groups and FFN channels (LLM-Pruner Element¹).

Salience of a weight: |w · ∂L/∂w| (LLM-Pruner ``--taylor param_first``), with L the mean
next-token cross-entropy over the calibration windows; gradients are accumulated over all
windows in fp32. A group's importance is the **sum** of its members' saliences
(``--grouping_strategy sum``):

* attention group (one KV head with its query heads; see ``surgery`` for the GQA rule): the
  q/k/v rows of those heads (bias entries included) + the matching columns of o_proj;
* FFN channel j: row j of gate_proj and up_proj (+ bias) + column j of down_proj (OPT: row j
  of fc1 (+ bias) + column j of fc2).
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from tqdm.auto import tqdm

from flexigpt.core.devices import model_device
from flexigpt.storage.models.adapters import get_adapter

log = logging.getLogger(__name__)


def accumulate_gradients(model: nn.Module, windows: torch.Tensor, params: list[nn.Parameter],
                         batch_size: int = 1) -> tuple[dict[torch.Tensor, torch.Tensor], float]:
    """fp32 gradients of the mean LM loss over ``windows [N, T]`` w.r.t. ``params``.

    Only ``params`` require grad during the passes; every parameter's ``requires_grad`` and
    ``grad`` are restored/cleared afterwards. Returns ``({param: grad}, mean loss)``.
    """
    n = windows.shape[0]
    flags = {p: p.requires_grad for p in model.parameters()}
    # keyed by the parameters (typed as tensors: nn.Linear.weight is a Tensor to the checker)
    grads: dict[torch.Tensor, torch.Tensor] = {
        p: torch.zeros_like(p, dtype=torch.float32) for p in params}
    device = model_device(model)
    total = 0.0
    was_training = model.training
    model.eval()
    try:
        for p in model.parameters():
            p.requires_grad_(False)
            p.grad = None
        for p in params:
            p.requires_grad_(True)
        with torch.enable_grad():
            for start in tqdm(range(0, n, batch_size), desc="taylor gradients"):
                ids = windows[start:start + batch_size].to(device)
                logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   ids[:, 1:].reshape(-1))
                # per-window mean loss, weighted so the sum is the mean over all N windows
                (loss * (ids.shape[0] / n)).backward()
                total += float(loss.detach()) * ids.shape[0]
                for p in params:
                    assert p.grad is not None  # every p requires grad and feeds the loss
                    grads[p] += p.grad.float()
                    p.grad = None
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)
            p.grad = None
        model.train(was_training)
    return grads, total / n


def _row_saliency(lin: nn.Linear, grads: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Σ over each output row of |w·g| (bias entry included): ``[out_features]``."""
    sal = (lin.weight.float() * grads[lin.weight]).abs().sum(dim=1)
    if lin.bias is not None:
        sal = sal + (lin.bias.float() * grads[lin.bias]).abs()
    return sal


def _col_saliency(lin: nn.Linear, grads: dict[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Σ over each input column of |w·g|: ``[in_features]`` (a bias belongs to no column)."""
    return (lin.weight.float() * grads[lin.weight]).abs().sum(dim=0)


def group_importance(model: nn.Module, windows: torch.Tensor, layers: list[int],
                     head_dim: int, batch_size: int = 1) -> tuple[dict[int, dict], float]:
    """Importance of every attention group and FFN channel of ``layers``.

    Returns ``({layer: {"attn": [n_kv], "ffn": [intermediate]}}, calibration loss)``; the
    attention group j is KV head j with query heads ``j·g … (j+1)·g − 1`` (g = heads / kv heads,
    the order in which HF ``repeat_kv`` pairs them).
    """
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    params = [p for i in layers for lin in adapter.block_linears(blocks[i]).values()
              for p in lin.parameters()]
    grads, loss = accumulate_gradients(model, windows, params, batch_size)
    scores: dict[int, dict] = {}
    for i in layers:
        q, k, v, o, down = (adapter.linear(blocks[i], r) for r in ("q", "k", "v", "o", "down"))
        n_kv = k.out_features // head_dim
        attn = (_row_saliency(q, grads) + _col_saliency(o, grads)).view(n_kv, -1).sum(1)
        attn = attn + (_row_saliency(k, grads) + _row_saliency(v, grads)).view(n_kv, -1).sum(1)
        ffn = _col_saliency(down, grads)
        for role in adapter.mlp_in_roles():
            ffn = ffn + _row_saliency(adapter.linear(blocks[i], role), grads)
        scores[i] = {"attn": attn, "ffn": ffn}
    del grads
    return scores, loss
