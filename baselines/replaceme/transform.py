"""ReplaceMe's linear map: calibration statistics, the two estimates, and folding.

Blocks ``start … end − 1`` are removed. With row vectors over every calibration token:
``X`` = output of block ``start − 1`` (the span's input), ``M`` = that block's MLP output
(so ``X − M`` is its post-attention residual), ``Y`` = output of block ``end − 1``. The map
``T [D, D]`` is folded into the block before the span, whose output becomes
``X − M + M T ≈ Y`` (official ``lstsq.py`` / ``cosine_dist.py``):

* ``lstsq``: ``T = argmin ||M T − (Y − X + M)||²_F + α||T||²_F
  = (MᵀM + αI)⁻¹ Mᵀ(Y − X + M)``, from the accumulated float64 normal equations
  (solved with ``torch.linalg.solve``; the official code multiplies by the inverse);
* ``cosine``: Adam on ``1 − mean cos(M T + X − M, Y)`` from ``T = I`` (official
  ``--accurate`` mode), activations kept in float32.

Folding: ``M = h W_outᵀ + b`` (the MLP output linear), so ``M T = h (Tᵀ W_out)ᵀ + Tᵀ b``:
``W_out ← Tᵀ W_out``, ``b ← Tᵀ b``, computed in float64, stored in the weight's dtype.
The official code reads ``Y`` of a span ending at the last block after the final norm
(transformers' last hidden state); here ``Y`` is always the block's own output, so the
folded model reproduces what the removed blocks fed the final norm.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from flexigpt.methods.hooked_forward import StopForward, forward_batches, hook_output, registered
from flexigpt.storage.models.adapters import ArchAdapter, get_adapter


def mlp_writer(adapter: ArchAdapter, block: nn.Module) -> nn.Linear:
    """The linear whose output is the block's MLP contribution to the residual stream."""
    return getattr(adapter.mlp_owner(block), adapter.mlp_out_linears[0])


@torch.no_grad()
def span_activations(model: nn.Module, windows: torch.Tensor, start: int, end: int,
                     batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per calibration batch, float64 ``(M, X, Y)`` ``[tokens, D]`` of the span
    ``start … end − 1`` (see the module docstring); requires ``1 ≤ start < end ≤ L``."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    if not 1 <= start < end <= len(blocks):
        raise ValueError(f"span {start}..{end - 1} must lie in blocks 1..{len(blocks) - 1}")
    slot: dict[str, torch.Tensor] = {}

    def keep(name: str, stop: bool = False):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            out = hook_output(output)
            slot[name] = out.detach().reshape(-1, out.shape[-1]).double().cpu()
            if stop:  # block end − 1 has run: later blocks are not needed
                raise StopForward
        return hook

    with registered([
            mlp_writer(adapter, blocks[start - 1]).register_forward_hook(keep("m")),
            blocks[start - 1].register_forward_hook(keep("x")),
            blocks[end - 1].register_forward_hook(keep("y", stop=True))]):
        for _ in forward_batches(model, windows, batch_size):
            yield slot.pop("m"), slot.pop("x"), slot.pop("y")


def lstsq_transform(batches: Iterator[tuple[torch.Tensor, ...]], alpha: float = 0.0
                    ) -> tuple[torch.Tensor, dict[str, float]]:
    """``T`` by least squares over every token of ``batches`` ``(M, X, Y)``, float64
    ``[D, D]``, and fit diagnostics (``relative_residual`` ``||M T − R|| / ||R||`` with
    ``R = Y − X + M``, ``residual_identity`` the same for ``T = I``, i.e. plain removal)."""
    mtm: torch.Tensor | None = None
    mtr: torch.Tensor | None = None
    rtr = 0.0
    tokens = 0
    for m, x, y in batches:
        r = y - x + m
        mtm = m.T @ m if mtm is None else mtm + m.T @ m
        mtr = m.T @ r if mtr is None else mtr + m.T @ r
        rtr += float((r * r).sum())
        tokens += m.shape[0]
    if mtm is None or mtr is None or tokens == 0:
        raise ValueError("ReplaceMe needs calibration tokens; none were given")
    eye = torch.eye(mtm.shape[0], dtype=mtm.dtype)
    t = torch.linalg.solve(mtm + alpha * eye, mtr)
    # ||M T − R||² = tr(TᵀMᵀMT) − 2 tr(TᵀMᵀR) + ||R||², from the accumulated moments
    fit = float((t * (mtm @ t)).sum() - 2 * (t * mtr).sum()) + rtr
    removal = float(mtm.trace() - 2 * mtr.trace()) + rtr
    norm = max(rtr, 1e-300)
    return t, {"tokens": tokens, "relative_residual": max(fit, 0.0) ** 0.5 / norm ** 0.5,
               "residual_identity": max(removal, 0.0) ** 0.5 / norm ** 0.5}


def cosine_transform(batches: Iterator[tuple[torch.Tensor, ...]], epochs: int, lr: float,
                     batch: int, seed: int) -> tuple[torch.Tensor, dict[str, float]]:
    """``T`` by Adam on ``1 − mean cos(M T + X − M, Y)`` from the identity (see the module
    docstring); float64 ``[D, D]`` and the loss before and after."""
    ms, rests, ys = [], [], []
    for m, x, y in batches:
        ms.append(m.float())
        rests.append((x - m).float())
        ys.append(y.float())
    if not ms:
        raise ValueError("ReplaceMe needs calibration tokens; none were given")
    m_all, rest, y_all = torch.cat(ms), torch.cat(rests), torch.cat(ys)
    t = torch.eye(m_all.shape[1], requires_grad=True)
    opt = torch.optim.Adam([t], lr=lr)
    gen = torch.Generator().manual_seed(seed)

    def loss_of(idx: torch.Tensor | slice) -> torch.Tensor:
        pred = m_all[idx] @ t + rest[idx]
        return 1 - torch.nn.functional.cosine_similarity(pred, y_all[idx], dim=-1).mean()

    with torch.no_grad():
        before = float(loss_of(slice(None)))
    with torch.enable_grad():
        for _ in range(epochs):
            for idx in torch.randperm(m_all.shape[0], generator=gen).split(batch):
                opt.zero_grad()
                loss_of(idx).backward()
                opt.step()
    with torch.no_grad():
        after = float(loss_of(slice(None)))
    return t.detach().double(), {"tokens": int(m_all.shape[0]), "cosine_loss_identity": before,
                                 "cosine_loss": after}


@torch.no_grad()
def fold_(linear: nn.Linear, t: torch.Tensor) -> None:
    """``W ← Tᵀ W`` and ``b ← Tᵀ b`` in place (float64 arithmetic, the weight's dtype)."""
    tt = t.T.to(device=linear.weight.device, dtype=torch.float64)
    linear.weight.copy_((tt @ linear.weight.double()).to(linear.weight.dtype))
    if linear.bias is not None:
        linear.bias.copy_((tt @ linear.bias.double()).to(linear.bias.dtype))
