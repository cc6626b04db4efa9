"""Modules of a sliced model: weight-free RMSN, the shortcut-carrying block, the final norm.

The attention and MLP internals stay HF's own modules; :class:`SlicedBlock` only re-does
the two residual adds of a pre-norm decoder layer with a shortcut matrix on the residual:

    h = x @ S_attn + attn(RMSN(x))        x [.., d_in]  → h [.., d_mid]
    y = h @ S_mlp  + mlp(RMSN(h))         h [.., d_mid] → y [.., d_out]
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer


class RMSN(nn.Module):
    """Weight-free RMS normalisation ``x · rsqrt(Σx²/D + eps)`` computed in fp32.

    ``D`` is the *original* hidden size even when ``x`` is sliced to fewer features, so a
    sliced signal is scaled exactly as the full-width one it approximates.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        scale = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / self.hidden_size + self.eps)
        return (xf * scale).to(dtype)

    def extra_repr(self) -> str:
        return f"divisor={self.hidden_size}, eps={self.eps}"


class ProjectedRMSN(nn.Module):
    """Final norm of a re-tied model: ``RMSN(x) @ proj.weightᵀ``, ``[.., d_in] → [.., d_out]``.

    ``proj`` carries the fused final-norm scale and the change of basis from the last
    block's rotation to the embedding's, so the head can share the sliced embedding.
    """

    def __init__(self, hidden_size: int, eps: float, d_in: int, d_out: int) -> None:
        super().__init__()
        self.norm = RMSN(hidden_size, eps)
        self.proj = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class SlicedBlock(GradientCheckpointingLayer):
    """A pre-norm decoder block with shortcut matrices on the residual path.

    Holds the HF parts under their original attribute names (so ``state_dict`` keys keep
    the HF layout): ``parts`` maps each name to its module — the attention, and the MLP
    module (``names["mlp"]``) or, for a family whose MLP linears live on the block (OPT:
    ``names["mlp"] == ""``), the in-linear, activation and out-linear named by
    ``names["mlp_in"]``, ``names["activation"]``, ``names["mlp_out"]``. The norms become
    weight-free :class:`RMSN` under the original norm names; ``attn_shortcut`` /
    ``mlp_shortcut`` are ``nn.Linear`` without bias, or None for a plain add. ``dropout``
    applies to each sub-layer's output in training (OPT's residual dropout; 0 = none).
    """

    def __init__(self, names: dict[str, str], parts: dict[str, nn.Module], hidden_size: int,
                 eps: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.names = dict(names)
        for name, module in parts.items():
            setattr(self, name, module)
        setattr(self, names["input_norm"], RMSN(hidden_size, eps))
        setattr(self, names["post_attn_norm"], RMSN(hidden_size, eps))
        self.dropout = float(dropout)
        self.attn_shortcut: nn.Linear | None = None
        self.mlp_shortcut: nn.Linear | None = None

    def _part(self, key: str) -> nn.Module:
        return getattr(self, self.names[key])

    def _drop(self, out: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(out, self.dropout, self.training) if self.dropout else out

    def mlp_forward(self, h: torch.Tensor) -> torch.Tensor:
        """The MLP on normalised ``h``: the MLP module, or out(act(in(h))) on the block."""
        if self.names["mlp"]:
            return self._part("mlp")(h)
        return self._part("mlp_out")(self._part("activation")(self._part("mlp_in")(h)))

    def attn_residual(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """``x @ S_attn + attn(RMSN(x))``; ``kwargs``: the decoder layer's (mask, rope, cache)."""
        out = self._part("attn")(hidden_states=self._part("input_norm")(x), **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        return (x if self.attn_shortcut is None else self.attn_shortcut(x)) + self._drop(out)

    def mlp_residual(self, h: torch.Tensor) -> torch.Tensor:
        """``h @ S_mlp + mlp(RMSN(h))``."""
        out = self.mlp_forward(self._part("post_attn_norm")(h))
        return (h if self.mlp_shortcut is None else self.mlp_shortcut(h)) + self._drop(out)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args:  # HF passes everything but the hidden states by keyword
            raise TypeError("SlicedBlock takes the decoder-layer arguments by keyword only")
        return self.mlp_residual(self.attn_residual(hidden_states, **kwargs))


def set_shortcut(block: SlicedBlock, which: str, matrix: torch.Tensor | None) -> None:
    """Set ``block.<which>_shortcut`` to ``x ↦ x @ matrix`` (``matrix [d_in, d_out]``) or None."""
    if matrix is None:
        setattr(block, f"{which}_shortcut", None)
        return
    ref = next(block.parameters())
    lin = nn.Linear(matrix.shape[0], matrix.shape[1], bias=False, device=ref.device,
                    dtype=ref.dtype)
    lin.weight = nn.Parameter(matrix.t().to(device=ref.device, dtype=ref.dtype).contiguous())
    setattr(block, f"{which}_shortcut", lin)


def resize_linear(linear: nn.Linear, in_features: int | None = None,
                  out_features: int | None = None) -> None:
    """Give ``linear`` uninitialised weights (and bias) of a new shape, in place."""
    out_f = linear.out_features if out_features is None else out_features
    in_f = linear.in_features if in_features is None else in_features
    w = linear.weight
    linear.weight = nn.Parameter(torch.empty(out_f, in_f, dtype=w.dtype, device=w.device),
                                 requires_grad=w.requires_grad)
    if linear.bias is not None:
        b = linear.bias
        linear.bias = nn.Parameter(torch.empty(out_f, dtype=b.dtype, device=b.device),
                                   requires_grad=b.requires_grad)
    linear.in_features, linear.out_features = in_f, out_f


class Rows(Protocol):
    """A ``[V, D]`` matrix read in row slices: a tensor, or rows staged on disk
    (``activations.StagedRows``)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    def __getitem__(self, rows: slice) -> torch.Tensor: ...


def matmul_rows(w: Rows, right: torch.Tensor, chunk: int = 4096,
                scale: torch.Tensor | None = None) -> torch.Tensor:
    """``w @ right`` computed in float64 over row chunks, returned in ``w``'s dtype.

    Keeps the float64 temporaries of a ``[V, D]`` embedding or head to ``chunk`` rows.
    ``scale [D]``: first ``w ← w · diag(scale)`` rounded to ``w``'s dtype (what
    :func:`scale_columns_` stores), chunk by chunk, without touching ``w``.
    """
    out = torch.empty(w.shape[0], right.shape[1], dtype=w.dtype, device=w.device)
    right = right.to(device=w.device, dtype=torch.float64)
    if scale is not None:
        scale = scale.to(device=w.device, dtype=torch.float64)
    for start in range(0, w.shape[0], chunk):
        rows = w[start:start + chunk].detach()
        if scale is not None:
            rows = (rows.double() * scale).to(w.dtype)
        out[start:start + chunk] = (rows.double() @ right).to(w.dtype)
    return out


def scale_columns_(w: torch.Tensor, alpha: torch.Tensor, chunk: int = 4096) -> None:
    """``w ← w · diag(alpha)`` in place (input columns scaled), in float64 over row chunks.

    In place so that weights memory-mapped from a checkpoint are not duplicated.
    """
    alpha = alpha.to(device=w.device, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, w.shape[0], chunk):
            rows = w[start:start + chunk]
            rows.copy_(rows.double() * alpha)


def set_linear(linear: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """Replace ``linear``'s weight ``[out, in]`` (and bias ``[out]``) keeping its dtype."""
    dtype, grad = linear.weight.dtype, linear.weight.requires_grad
    linear.weight = nn.Parameter(weight.to(dtype).contiguous(), requires_grad=grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias.to(dtype).contiguous(), requires_grad=grad)
    linear.out_features, linear.in_features = weight.shape
