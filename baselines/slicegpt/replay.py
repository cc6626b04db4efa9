"""SliceGPT's fragment of the standalone remote-code loader: sliced residual stream with
shortcut matrices and weight-free RMS norms (mirrors :mod:`baselines.slicegpt.modules`).
Assembled after :mod:`flexigpt.storage.standalone` by :mod:`flexigpt.export.standalone`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from flexigpt.storage.standalone import (
    ATTN,
    ATTN_LINEARS,
    MLP,
    MLP_LINEARS,
    _linear,
    register_replay,
)


class RMSN(nn.Module):
    """Weight-free ``x · rsqrt(Σx²/D + eps)`` in fp32, D the *original* hidden size."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.hidden_size, self.eps = int(hidden_size), float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        scale = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / self.hidden_size + self.eps)
        return (xf * scale).to(dtype)


class ProjectedRMSN(nn.Module):
    """Final norm of a SliceGPT model with a re-tied head: ``RMSN(x) @ proj.weightᵀ``."""

    def __init__(self, hidden_size: int, eps: float, d_in: int, d_out: int) -> None:
        super().__init__()
        self.norm = RMSN(hidden_size, eps)
        self.proj = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class SlicedBlock(GradientCheckpointingLayer):
    """``h = S_attn(x) + attn(RMSN(x))``; ``y = S_mlp(h) + mlp(RMSN(h))`` (SliceGPT block)."""

    def __init__(self, attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float,
                 d_in: int, d_mid: int, d_out: int) -> None:
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm = RMSN(hidden_size, eps)
        self.post_attention_layernorm = RMSN(hidden_size, eps)
        ref = next(attn.parameters())
        kw: dict[str, Any] = {"bias": False, "dtype": ref.dtype, "device": ref.device}
        self.attn_shortcut = nn.Linear(d_in, d_mid, **kw)
        self.mlp_shortcut = nn.Linear(d_mid, d_out, **kw)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:
            raise TypeError("SlicedBlock takes the decoder-layer arguments by keyword only")
        x = hidden_states
        out = self.self_attn(hidden_states=self.input_layernorm(x), **kwargs)
        h = self.attn_shortcut(x) + (out[0] if isinstance(out, tuple) else out)
        return self.mlp_shortcut(h) + self.mlp(self.post_attention_layernorm(h))


def replay_slicegpt(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """SliceGPT: per-block residual widths, shortcut matrices, weight-free RMS norms."""
    plan, hidden, eps = s["plan"], int(s["hidden_size"]), float(s["eps"])
    outs, mids = plan["out"], plan["mid"]
    inputs = [plan["embed"]] + outs[:-1]
    layers = model.model.layers
    if len(layers) != len(mids):
        raise ValueError(f"structure has {len(mids)} blocks, config {len(layers)}")
    for i, (d_in, d_mid, d_out) in enumerate(zip(inputs, mids, outs)):
        attn, mlp = getattr(layers[i], ATTN), getattr(layers[i], MLP)
        for parent, names, d_new, side in ((attn, ATTN_LINEARS[:3], d_in, "in"),
                                           (attn, ATTN_LINEARS[3:], d_mid, "out"),
                                           (mlp, MLP_LINEARS[:2], d_mid, "in"),
                                           (mlp, MLP_LINEARS[2:], d_out, "out")):
            for name in names:
                old = getattr(parent, name)
                setattr(parent, name, _linear(old, d_new, old.out_features) if side == "in"
                        else _linear(old, old.in_features, d_new))
        block = SlicedBlock(attn, mlp, hidden, eps, d_in, d_mid, d_out)
        if hasattr(layers[i], "attention_type"):
            block.attention_type = layers[i].attention_type
        layers[i] = block
    embed, head = model.model.embed_tokens, model.lm_head
    w = embed.weight
    embed.weight = nn.Parameter(torch.zeros(w.shape[0], plan["embed"], dtype=w.dtype,
                                            device=w.device))
    embed.embedding_dim = plan["embed"]
    if plan["head"] == "tied":
        model.model.norm = ProjectedRMSN(hidden, eps, outs[-1], plan["embed"]).to(w.device, w.dtype)
        head.weight, head.in_features = embed.weight, plan["embed"]
    else:
        model.model.norm = RMSN(hidden, eps)
        model.lm_head = _linear(head, outs[-1], head.out_features)


register_replay("slicegpt", replay_slicegpt, "SliceGPT")
