"""The recovery optimizer and its learning-rate schedule: AdamW parameter groups (weight
decay on ≥2-D tensors, the output-norm γ's at their own rate) and the warm-up + cosine (or
constant) multiplier the training loop's ``LambdaLR`` applies per optimizer step."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from flexigpt.runtime.training.config import TrainConfig, TrainPlan


def lr_factor(cfg: TrainConfig, steps: int) -> Callable[[int], float]:
    """LR multiplier of optimizer step ``i`` (0-based): linear warm-up, then cosine."""
    warm = min(cfg.warmup_steps(steps), steps)

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        if cfg.schedule == "constant":
            return 1.0
        t = min(1.0, (i - warm) / max(1, steps - warm - 1))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return factor


def param_groups(model: nn.Module, cfg: TrainConfig, plan: TrainPlan) -> list[dict]:
    """AdamW groups: ≥2-D tensors with weight decay; 1-D without; the output-norm γ's
    (parameters named ``gamma``) in their own group at ``plan.gamma_lr``."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gammas = [p for n, p in named if n.rsplit(".", 1)[-1] == "gamma"]
    ids = {id(p) for p in gammas}
    decay = [p for _, p in named if p.ndim >= 2 and id(p) not in ids]
    rest = [p for _, p in named if p.ndim < 2 and id(p) not in ids]
    groups = ({"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
              {"params": rest, "weight_decay": 0.0, "name": "no_decay"},
              {"params": gammas, "weight_decay": 0.0, "lr": plan.gamma_lr, "name": "gamma"})
    return [g for g in groups if g["params"]]


def make_optimizer(model: nn.Module, cfg: TrainConfig, plan: TrainPlan) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` at ``plan.lr`` (the γ group at its own rate)."""
    return torch.optim.AdamW(param_groups(model, cfg, plan), lr=plan.lr, betas=cfg.betas,
                             eps=1e-8)
