"""Parameter-level weight sharing: ``SharedLoRALinear`` and ``OutputNorm`` wrappers.

Both compose with unmodified Hugging Face modules: a replacement (or repeated) block is an
ordinary decoder block of the model's class whose linears are swapped for
:class:`SharedLoRALinear` and whose attention / MLP sub-layers are wrapped in
:class:`OutputNorm`. HF's own decoder forward runs unchanged.

Naming contract (relied on by the trainer and by ``artifacts``): ``.base_layer`` is the base
block's ``nn.Linear`` object itself (same storage, never copied), ``.lora_A`` ``[r, in]``,
``.lora_B`` ``[out, r]``, ``.gamma`` ``[d]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

#: forward implementations of :class:`SharedLoRALinear` (see ``benchmarks/bench_flexigpt.py``)
FORWARD_MODES = ("naive", "addmm", "merged", "auto")

#: ``linear_fn(x, weight, bias=None)``: ``x [..., in]``, ``weight [out, in]`` → ``[..., out]``
LinearFn = Callable[..., torch.Tensor]


class SharedLoRALinear(nn.Module):
    """``y = base(x) + (x @ A^T) @ B^T · scaling`` over a *shared* base linear.

    Args:
        base_layer: the base block's ``nn.Linear`` (the same object, so the same storage).
        lora_A: ``[r, in_features]`` adapter (becomes a trainable parameter).
        lora_B: ``[out_features, r]`` adapter (becomes a trainable parameter).
        scaling: multiplier of the low-rank path (FlexiGPT uses 1).

    ``forward_mode`` (instance attribute, ``auto`` by default; set it for a whole model with
    :func:`set_forward_mode`) picks the implementation: ``naive`` (three matmuls and an
    add), ``addmm`` (the low-rank product is fused into the add with ``torch.addmm``),
    ``merged`` (``W + s·B@A`` formed per call, then one matmul) or ``auto``: ``merged`` for
    inference calls (autograd off) with more tokens than ``merge_min_tokens_factor ·
    in·out/(in+out)``, i.e. when forming the merged weight costs fewer flops than the
    low-rank path; else ``addmm`` (under autograd ``merged`` would need a full ``[out, in]``
    weight gradient). All modes are mathematically equal.

    ``linear_fn`` (instance attribute, ``F.linear`` by default) computes every product of
    the forward (``linear_fn(x, weight, bias=None)``, the contract of ``F.linear``); the
    decode loops swap in their few-row form for their duration
    (``flexigpt.runtime.generation.few_rows.routed_linears``).
    """

    merge_min_tokens_factor: ClassVar[float] = 1.0

    def __init__(self, base_layer: nn.Linear, lora_A: torch.Tensor, lora_B: torch.Tensor,
                 scaling: float = 1.0) -> None:
        super().__init__()
        if not isinstance(base_layer, nn.Linear):
            raise TypeError(f"base_layer must be an nn.Linear, got {type(base_layer).__name__}")
        out_f, in_f = base_layer.weight.shape
        if lora_A.dim() != 2 or lora_A.shape[1] != in_f:
            raise ValueError(f"lora_A must be [r, {in_f}], got {list(lora_A.shape)}")
        if lora_B.dim() != 2 or lora_B.shape != (out_f, lora_A.shape[0]):
            raise ValueError(f"lora_B must be [{out_f}, {lora_A.shape[0]}], "
                             f"got {list(lora_B.shape)}")
        self.base_layer = base_layer
        self.lora_A = nn.Parameter(lora_A)
        self.lora_B = nn.Parameter(lora_B)
        self.scaling = float(scaling)
        self.forward_mode = "auto"
        self.linear_fn: LinearFn = F.linear

    # ---- nn.Linear-like surface ---------------------------------------------------------
    def get_base_layer(self) -> nn.Linear:
        return self.base_layer

    @property
    def weight(self) -> torch.Tensor:
        """The shared base weight ``[out, in]`` (not the effective one; see ``delta_weight``)."""
        return self.base_layer.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base_layer.bias

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    @property
    def rank(self) -> int:
        return self.lora_A.shape[0]

    def delta_weight(self) -> torch.Tensor:
        """``scaling · B @ A`` ``[out, in]``."""
        return (self.lora_B @ self.lora_A) * self.scaling

    # ---- forward -------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mode = self.forward_mode
        if mode == "auto":
            mode = "addmm"
            if not torch.is_grad_enabled():
                in_f, out_f = self.in_features, self.out_features
                threshold = self.merge_min_tokens_factor * in_f * out_f / (in_f + out_f)
                if x.numel() // x.shape[-1] > threshold:
                    mode = "merged"
        weight, bias = self.base_layer.weight, self.base_layer.bias
        linear = self.linear_fn
        if mode == "merged":
            return linear(x, torch.addmm(weight, self.lora_B, self.lora_A, alpha=self.scaling),
                          bias)
        if mode == "addmm":
            y = linear(x, weight, bias)
            low = linear(x, self.lora_A)
            out = torch.addmm(y.reshape(-1, y.shape[-1]), low.reshape(-1, low.shape[-1]),
                              self.lora_B.t(), alpha=self.scaling)
            return out.view(y.shape)
        if mode == "naive":
            return linear(x, weight, bias) + linear(linear(x, self.lora_A),
                                                    self.lora_B) * self.scaling
        raise ValueError(f"unknown SharedLoRALinear.forward_mode {mode!r}; use {FORWARD_MODES}")

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, r={self.rank}, "
                f"scaling={self.scaling}")


def set_forward_mode(model: nn.Module, mode: str) -> int:
    """Set ``forward_mode`` of every :class:`SharedLoRALinear` in ``model`` (``model``
    itself included) to ``mode``; returns how many were set. Other models are untouched.

    Raises:
        ValueError: ``mode`` is not one of :data:`FORWARD_MODES`.
    """
    if mode not in FORWARD_MODES:
        raise ValueError(f"unknown SharedLoRALinear forward mode {mode!r}; use {FORWARD_MODES}")
    layers = [m for m in model.modules() if isinstance(m, SharedLoRALinear)]
    for layer in layers:
        layer.forward_mode = mode
    return len(layers)


class OutputNorm(nn.Module):
    """``γ ⊙ (h − μ(h)) / σ(h)`` on the output ``h`` of a wrapped sub-layer (FlexiGPT Eq. 6).

    A bias-free LayerNorm over the last (hidden) dimension; ``eps`` is only a guard against
    an all-constant output (Eq. 6 has none). Normalisation runs in fp32. When the wrapped
    module returns a tuple (HF attention returns ``(output, weights)``), element 0 is
    normalised and the rest passed through. Attributes the wrapper lacks are looked up on
    ``inner``, so HF code that reads e.g. ``block.self_attn.layer_idx`` keeps working.

    Args:
        inner: the attention or MLP module.
        hidden_size: d, the size of ``gamma``.
        gamma_init: initial value of every entry of ``gamma`` (small → block ≈ identity).
        eps: variance guard.
    """

    #: adapters look through this wrapper when it wraps a linear itself (OPT's ``fc2``)
    wraps_sublayer = True

    def __init__(self, inner: nn.Module, hidden_size: int, gamma_init: float,
                 eps: float = 1e-6) -> None:
        super().__init__()
        self.inner = inner
        ref = next(inner.parameters(), None)
        dtype = ref.dtype if ref is not None else torch.get_default_dtype()
        device = ref.device if ref is not None else None
        self.gamma = nn.Parameter(torch.full((hidden_size,), float(gamma_init), dtype=dtype,
                                             device=device))
        self.eps = float(eps)

    def get_base_layer(self) -> nn.Module:
        return self.inner

    def normalize(self, h: torch.Tensor) -> torch.Tensor:
        """``[..., d] → [..., d]`` bias-free LayerNorm times gamma, in the input's dtype."""
        if h.dtype == torch.float32 and self.gamma.dtype == torch.float32:
            return F.layer_norm(h, (h.shape[-1],), weight=self.gamma, eps=self.eps)
        y = F.layer_norm(h.float(), (h.shape[-1],), eps=self.eps) * self.gamma.float()
        return y.to(h.dtype)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.inner(*args, **kwargs)
        if isinstance(out, tuple):
            return (self.normalize(out[0]), *out[1:])
        return self.normalize(out)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_modules", {}).get("inner")
            if inner is None or name == "inner":
                raise
            return getattr(inner, name)

    def extra_repr(self) -> str:
        return f"d={self.gamma.shape[0]}, eps={self.eps}"


#: Parameter names (last path component) of the replacement/repeat adapters: what the
#: ``flexigpt`` recovery recipe trains.
ADAPTER_PARAMS = ("lora_A", "lora_B", "gamma")


def adapter_trainable(model: nn.Module) -> int:
    """Parameters named :data:`ADAPTER_PARAMS` (shared storage once): the ``flexigpt``
    recipe's trainable count, the budget a like-for-like baseline is matched to."""
    seen: set[int] = set()
    total = 0
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1] in ADAPTER_PARAMS and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total
