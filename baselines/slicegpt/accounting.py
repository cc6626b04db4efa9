"""Widths of a sliced model and its exact parameter count, before any slicing is done.

A :class:`Plan` gives the residual width at every point: the embedding output ``embed``,
after each block's attention ``mid[i]`` and after each block ``out[i]`` (the input of block
``i`` is ``out[i-1]``, or ``embed`` for block 0). ``predict_parameters`` counts exactly what
``flexigpt.core.params.count_parameters`` will count on the sliced model (tests check this):

    V·d₀ (embedding) + P·d₀ (learned positions, OPT)
    + head [V·d_L (+V bias: the head's own, or a final LayerNorm's shift) untied
            | d_L·d₀ re-tied projection]
    + Σ_blocks [ in-linears d_in·out + out-linears in·d_mid (+bias) + d_in·d_mid (attn Q)
                 + MLP in-linears d_mid·f + out-linears f·d_out + d_mid·d_out (MLP Q) ]
    (norms become weight-free; other parameters, e.g. per-head q/k norms, unchanged)

Heads "unsliced" and "sliced" (the official ones) are untied: on a dense model whose head
shared the embedding's storage (counted once there), the sliced model's head is a *new*
``V·d_L`` matrix counted on top of the ``V·d₀`` embedding. Only the harness's "tied" variant
keeps one ``V·d₀`` matrix (plus the ``d_L·d₀`` projection).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from baselines.slicegpt.fusion import head_gets_bias
from flexigpt.core.params import count_parameters
from flexigpt.storage.models.adapters import ArchAdapter


@dataclass
class Plan:
    """Residual widths of a sliced model (see module doc)."""

    embed: int
    mid: list[int]
    out: list[int]
    head: str  # "unsliced" | "sliced" (official, untied) | "tied" (harness variant)

    @classmethod
    def constant(cls, width: int, layers: int, hidden: int, head: str) -> Plan:
        """Every block at ``width``; the last writes full ``hidden`` if the head is unsliced."""
        out = [width] * layers
        if head == "unsliced":
            out[-1] = hidden
        return cls(embed=width, mid=[width] * layers, out=out, head=head)

    def inputs(self) -> list[int]:
        """Input width of every block."""
        return [self.embed] + self.out[:-1]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def predict_parameters(model: nn.Module, adapter: ArchAdapter, plan: Plan, tied: bool) -> int:
    """Parameters of ``model`` (dense, unfused) once sliced to ``plan``.

    Args:
        tied: whether the dense model's head shares the embedding's storage.
    """
    layers = adapter.layers(model)
    if len(plan.mid) != len(layers) or len(plan.out) != len(layers):
        raise ValueError(f"plan has {len(plan.mid)}/{len(plan.out)} widths for "
                         f"{len(layers)} blocks")
    embed, head = adapter.embed(model), adapter.lm_head(model)
    vocab, last = embed.weight.shape[0], plan.out[-1]
    total = count_parameters(model) - embed.weight.numel() + vocab * plan.embed
    positions = adapter.position_embed(model)
    if positions is not None:  # learned position table, sliced like the embedding
        total += positions.weight.shape[0] * (plan.embed - positions.weight.shape[1])
    if not tied:
        total -= _numel(head)
    gets_bias = head.bias is not None or head_gets_bias(model, adapter)
    bias = vocab if gets_bias else 0  # fusion folds a final-norm shift into a head bias
    total += last * plan.embed if plan.head == "tied" else vocab * last + bias
    total -= _numel(adapter.final_norm(model))
    for block, d_in, d_mid, d_out in zip(layers, plan.inputs(), plan.mid, plan.out):
        total -= _numel(adapter.input_norm(block)) + _numel(adapter.post_attn_norm(block))
        attn, mlp = adapter.attn(block), adapter.mlp_owner(block)
        sides = ((attn, adapter.attn_in_linears, adapter.attn_out_linears, d_in, d_mid),
                 (mlp, adapter.mlp_in_linears, adapter.mlp_out_linears, d_mid, d_out))
        for parent, ins, outs, a, b in sides:
            for name in ins:
                lin = getattr(parent, name)
                total += lin.out_features * (a - lin.in_features)
            for name in outs:
                lin = getattr(parent, name)
                total += (lin.in_features + (lin.bias is not None)) * (b - lin.out_features)
            total += a * b  # the shortcut matrix
    return total


def slicing_width(fraction: float, hidden: int, round_to: int) -> int:
    """Official width for a slicing fraction: ``int((1−s)·D)`` rounded down to ``round_to``."""
    width = int((1.0 - fraction) * hidden)
    width -= width % round_to
    if width < round_to:
        raise ValueError(f"slicing fraction {fraction} leaves no width on hidden size {hidden} "
                         f"(round_to {round_to})")
    return width


def solve_width(model: nn.Module, adapter: ArchAdapter, ratio: float, head: str, tied: bool,
                round_to: int, tolerance: float) -> tuple[int, float]:
    """The constant width (a multiple of ``round_to``) whose reduction is closest to ``ratio``.

    Returns:
        ``(width, predicted ratio)``.

    Raises:
        ValueError: no width gets within ``tolerance`` (names the reachable range).
    """
    config: Any = model.config  # an HF config: its fields vary by family
    hidden, n_layers = config.hidden_size, len(adapter.layers(model))
    dense = count_parameters(model)
    options = []
    for width in range(round_to, hidden + 1, round_to):
        plan = Plan.constant(width, n_layers, hidden, head)
        options.append((width, 1.0 - predict_parameters(model, adapter, plan, tied) / dense))
    if not options:
        raise ValueError(f"round_to {round_to} exceeds the hidden size {hidden}")
    width, achieved = min(options, key=lambda o: abs(o[1] - ratio))
    if abs(achieved - ratio) > tolerance:
        lo, hi = min(o[1] for o in options), max(o[1] for o in options)
        raise ValueError(
            f"ratio {ratio} is not reachable within tolerance {tolerance} with head={head!r} and "
            f"round_to={round_to}: the closest width {width} gives {achieved:.4f}; reachable "
            f"reductions span [{lo:.4f}, {hi:.4f}] in steps of {round_to} features")
    return width, achieved
