"""FlexiGPT's fragment of the standalone remote-code loader (pruning and extension).

Weight-shared blocks: each linear of a replacement or repeated block is
``base(x) + (x Aᵀ) Bᵀ`` over *the base block's own* ``nn.Linear`` (the same module, so the
weights are stored once in ``model.safetensors``); attention and MLP outputs optionally go
through a bias-free LayerNorm times ``gamma`` (``OutputNorm``). Mirrors
:mod:`flexigpt.methods.sharing`. Assembled after :mod:`flexigpt.storage.standalone` by
:mod:`flexigpt.export.standalone` (its imports of the harness are dropped there: the names
are the base's own).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from flexigpt.storage.standalone import (
    ATTN,
    INPUT_NORM,
    LINEARS,
    MLP,
    POST_ATTN_NORM,
    _get,
    _set,
    register_replay,
)


class SharedLoRALinear(nn.Module):
    """``y = base(x) + (x @ lora_Aᵀ) @ lora_Bᵀ · scaling``; ``base_layer`` is a shared linear.

    Forward as flexigpt's ``"auto"`` mode: without autograd and with more tokens than
    ``in·out/(in+out)`` the merged weight ``W + s·B@A`` is formed, else the low-rank path.
    """

    def __init__(self, base_layer: nn.Linear, rank: int, scaling: float = 1.0) -> None:
        super().__init__()
        w = base_layer.weight
        self.base_layer = base_layer
        self.lora_A = nn.Parameter(torch.zeros(rank, w.shape[1], dtype=w.dtype, device=w.device))
        self.lora_B = nn.Parameter(torch.zeros(w.shape[0], rank, dtype=w.dtype, device=w.device))
        self.scaling = float(scaling)

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.base_layer.weight, self.base_layer.bias
        in_f, out_f = self.in_features, self.out_features
        if not torch.is_grad_enabled() and x.numel() // x.shape[-1] > in_f * out_f / (in_f + out_f):
            return F.linear(x, torch.addmm(weight, self.lora_B, self.lora_A, alpha=self.scaling),
                            bias)
        y = F.linear(x, weight, bias)
        low = F.linear(x, self.lora_A)
        out = torch.addmm(y.reshape(-1, y.shape[-1]), low.reshape(-1, low.shape[-1]),
                          self.lora_B.t(), alpha=self.scaling)
        return out.view(y.shape)


class OutputNorm(nn.Module):
    """``gamma ⊙ LayerNorm(h)`` (bias-free, fp32) on the output ``h`` of ``inner``."""

    def __init__(self, inner: nn.Module, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.inner = inner
        ref = next(inner.parameters())
        self.gamma = nn.Parameter(torch.zeros(hidden_size, dtype=ref.dtype, device=ref.device))
        self.eps = float(eps)

    def normalize(self, h: torch.Tensor) -> torch.Tensor:
        if h.dtype == torch.float32 and self.gamma.dtype == torch.float32:
            return F.layer_norm(h, (h.shape[-1],), weight=self.gamma, eps=self.eps)
        y = F.layer_norm(h.float(), (h.shape[-1],), eps=self.eps) * self.gamma.float()
        return y.to(h.dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        if isinstance(out, tuple):
            return (self.normalize(out[0]), *out[1:])
        return self.normalize(out)

    def __getattr__(self, name: str) -> Any:  # e.g. ``self_attn.layer_idx`` reaches ``inner``
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")
            if inner is None or name == "inner":
                raise
            return getattr(inner, name)


def _share_block(target: nn.Module, base: nn.Module, s: dict[str, Any], hidden: int,
                 share_prenorms: bool) -> None:
    """``target``'s linears become ``SharedLoRALinear`` over ``base``'s (flexigpt surgery)."""
    for name in LINEARS:
        _set(target, name, SharedLoRALinear(_get(base, name), int(s["ranks"][name])))
    if share_prenorms:
        setattr(target, INPUT_NORM, getattr(base, INPUT_NORM))
        setattr(target, POST_ATTN_NORM, getattr(base, POST_ATTN_NORM))
    if s["output_norm"]:
        eps = s.get("output_norm_eps", 1e-6)
        for sub in (ATTN, MLP):
            setattr(target, sub, OutputNorm(getattr(target, sub), hidden, eps))


def replay_flexigpt(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """FlexiGPT pruning: block i is replaced by a weight-shared copy of block ``base_map[i]``."""
    layers = model.model.layers
    for i, j in s["base_map"].items():
        _share_block(layers[int(i)], layers[int(j)], s, model.config.hidden_size,
                     share_prenorms=s.get("prenorm") == "share")


def replay_flexigpt_extend(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """FlexiGPT extension: position p repeats block ``layout[p]`` (first occurrence = original)."""
    layers = model.model.layers
    first: dict[int, int] = {}
    if len(layers) != len(s["layout"]):
        raise ValueError(f"layout has {len(s['layout'])} blocks, config {len(layers)}")
    for pos, src in enumerate(s["layout"]):
        if src in first:
            _share_block(layers[pos], layers[first[src]], s, model.config.hidden_size, False)
        else:
            first[src] = pos


register_replay("flexigpt", replay_flexigpt, "FlexiGPT")
register_replay("flexigpt_extend", replay_flexigpt_extend, "FlexiGPTExtension")
