"""Fit the lightweight module on calibration hidden states (official ``train_mseloss``).

The module maps the span's input ``h_start`` (the input of block ``start``) to its output
``h_end`` (the output of block ``end − 1``, the block's own output: the official code's target
for a span ending at the last block is the final-normed state transformers reports, which
would put the final norm twice in the pruned model). Loss: MSE over every calibration token;
AdamW (official lr 2e-4, weight decay 1e-3), gradient norm clipped, lr warmed up over 1 % of
the steps (at least one) then cosine-decayed to ``min_lr``; sequences reshuffled every epoch
with the config's seed. The official code counts its schedule in micro-batches at half
length and keeps the state of the best validation loss; here the schedule spans exactly the
optimizer steps taken, and the last state is kept (the calibration set has no held-out part).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from baselines.streamline.config import StreamlineConfig
from flexigpt.methods.hooked_forward import (
    StopForward,
    forward_batches,
    hook_input,
    hook_output,
    registered,
)
from flexigpt.storage.models.adapters import get_adapter


@torch.no_grad()
def span_pairs(model: nn.Module, windows: torch.Tensor, start: int, end: int,
               batch_size: int) -> tuple[torch.Tensor, torch.Tensor, dict[int, dict[str, Any]]]:
    """``(inputs, targets, kwargs)``: ``h_start`` and ``h_end`` ``[N, T, D]`` (the model's
    dtype, on its device) and block ``start``'s keyword arguments (causal mask, rotary
    tables) per batch size, for replaying the block outside the model."""
    blocks = get_adapter(model).layers(model)
    ins: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    kwargs_by_size: dict[int, dict[str, Any]] = {}

    def before(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        x = hook_input(args, kwargs)
        ins.append(x.detach())
        kwargs_by_size.setdefault(x.shape[0], {k: v for k, v in kwargs.items()
                                               if k != "hidden_states"})

    def after(module: nn.Module, args: tuple, output: Any) -> None:
        outs.append(hook_output(output).detach())
        raise StopForward  # block end − 1 has run

    with registered([blocks[start].register_forward_pre_hook(before, with_kwargs=True),
                     blocks[end - 1].register_forward_hook(after)]):
        for _ in forward_batches(model, windows, batch_size):
            pass
    return torch.cat(ins), torch.cat(outs), kwargs_by_size


def lr_at(step: int, total: int, cfg: StreamlineConfig) -> float:
    """Linear warm-up over ``max(1, round(0.01·total))`` steps, then cosine to ``min_lr``."""
    warm = max(1, round(0.01 * total))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def fit_module(module: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
               kwargs_by_size: dict[int, dict[str, Any]], cfg: StreamlineConfig
               ) -> dict[str, Any]:
    """Train ``module`` in place (see the module docstring); returns the MSE before and
    after (over every calibration token) and the steps taken."""
    params = list(module.parameters())
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = inputs.shape[0]
    per_epoch = math.ceil(n / cfg.batch_size)
    total = per_epoch * cfg.epochs

    def loss_on(idx: torch.Tensor) -> torch.Tensor:
        kwargs = kwargs_by_size.get(len(idx), {})
        out = module(inputs[idx], **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return torch.nn.functional.mse_loss(out.float(), targets[idx].float())

    def mse() -> float:
        with torch.no_grad():
            return float(sum(float(loss_on(i)) * len(i)
                             for i in torch.arange(n).split(cfg.batch_size)) / n)

    module.train()
    before, step = mse(), 0
    with torch.enable_grad():
        for _ in range(cfg.epochs):
            for idx in torch.randperm(n, generator=gen).split(cfg.batch_size):
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, total, cfg)
                opt.zero_grad()
                loss_on(idx).backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
                opt.step()
                step += 1
    module.eval()
    for p in params:
        p.requires_grad_(False)
    return {"mse_before": before, "mse_after": mse(), "steps": step,
            "tokens": int(inputs.shape[0] * inputs.shape[1])}
