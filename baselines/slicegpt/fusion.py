"""Norm fusion: make a pre-norm transformer invariant under rotations of its residual stream.

After :func:`fuse_model` every norm is a weight-free :class:`RMSN` (dividing by the original
hidden size), the norm scales (and LayerNorm shifts) live in the linears that read the
normalised signal, and the model computes the same function as before (paper §3.1):

* RMSNorm families (Llama, Mistral, Qwen): ``W_in ← W_in diag(α)``; final ``α`` into the head.
* LayerNorm families: additionally ``b_in ← b_in + W_in β`` and the mean-removal
  ``M = I − 11ᵀ/D`` baked into every writer of the residual stream (token and learned
  position embedding rows, attention and MLP output linears) — then
  ``LayerNorm(x) = RMSN(x)·α + β`` holds exactly. The LM head under a final LayerNorm with a
  shift gets a bias ``W β`` (as in the official code; OPT).

Which path applies is decided from the norm modules (``norm_kind``); the family's parts
(position table, MLP on the block, residual dropout) come from its adapter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from baselines.slicegpt.modules import RMSN, SlicedBlock, scale_columns_
from flexigpt.storage.models.adapters import ArchAdapter

log = logging.getLogger(__name__)


@dataclass
class FusionInfo:
    """What fusion found: norm kind, eps, whether the head was tied, the final norm's scale.

    ``final_alpha [D]`` (float64) is kept for re-tying the head; None for a final norm with
    a shift (LayerNorm bias), which a tied head cannot carry.
    """

    norm: str  # "rms" | "layernorm"
    eps: float
    was_tied: bool
    final_alpha: torch.Tensor | None = None
    #: the head is still tied to the original embedding; ``rotate._finish_head`` builds the
    #: untied, ``final_alpha``-scaled head from it (``fuse_model(defer_untie=True)``)
    head_pending: bool = False


def norm_kind(norm: nn.Module) -> str:
    """``"layernorm"`` for a mean-subtracting norm (nn.LayerNorm, biased norms), else ``"rms"``."""
    if isinstance(norm, nn.LayerNorm) or getattr(norm, "bias", None) is not None:
        return "layernorm"
    if getattr(norm, "weight", None) is None:
        raise ValueError(f"cannot fuse norm {type(norm).__name__}: it has no weight")
    return "rms"


def norm_eps(norm: nn.Module) -> float:
    for attr in ("variance_epsilon", "eps", "epsilon"):
        if hasattr(norm, attr):
            return float(getattr(norm, attr))
    raise ValueError(f"cannot find the epsilon of norm {type(norm).__name__}")


def is_tied(model: nn.Module, adapter: ArchAdapter) -> bool:
    """Whether the LM head shares storage with the input embedding."""
    head, embed = adapter.lm_head(model).weight, adapter.embed(model).weight
    return head.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()


def untie_head(model: nn.Module, adapter: ArchAdapter) -> bool:
    """Give the LM head its own copy of a tied embedding; returns whether it was tied."""
    if not is_tied(model, adapter):
        return False
    head = adapter.lm_head(model)
    head.weight = nn.Parameter(head.weight.detach().clone(),
                               requires_grad=head.weight.requires_grad)
    mark_untied(model)
    return True


def mark_untied(model: nn.Module) -> None:
    """Tell transformers the head no longer shares the embedding (config and tie keys)."""
    config: Any = model.config  # an HF config: its fields vary by family
    config.tie_word_embeddings = False
    if hasattr(model, "all_tied_weights_keys"):
        model.all_tied_weights_keys = {}  # type: ignore[assignment]  # torch stub: setattr of tensors/modules


def _fold_into_inputs(norm: Any, linears: list[nn.Linear], add_bias: bool = False) -> None:
    """``W ← W diag(α)``, ``b ← b + W β`` (float64, in place) for the readers of ``norm``.

    A reader without a bias gets one (``add_bias``, the LM head under a LayerNorm with
    bias, as the official code does) or, when ``W β ≠ 0``, raises ValueError.
    """
    # norm: Any, a LayerNorm or a family's RMSNorm module (a weight, maybe a bias)
    alpha = norm.weight.detach().double()
    beta = getattr(norm, "bias", None)
    for lin in linears:
        if beta is not None:
            shift = lin.weight.detach().double() @ beta.detach().double()
            if lin.bias is None and add_bias:
                lin.bias = nn.Parameter(shift.to(lin.weight.dtype),
                                        requires_grad=lin.weight.requires_grad)
            elif lin.bias is None:
                if torch.count_nonzero(shift):
                    raise ValueError(f"cannot fold a LayerNorm bias into {lin!r}: it has no bias")
            else:
                lin.bias.copy_(lin.bias.double() + shift)
        scale_columns_(lin.weight, alpha)


def head_gets_bias(model: nn.Module, adapter: ArchAdapter) -> bool:
    """Whether fusion gives the (untied) LM head a bias: the final norm has a shift."""
    return getattr(adapter.final_norm(model), "bias", None) is not None


def stream_writers(model: nn.Module, adapter: ArchAdapter) -> list[nn.Embedding]:
    """The embeddings that write block 0's input: tokens, and learned positions if any."""
    positions = adapter.position_embed(model)
    return [adapter.embed(model)] + ([] if positions is None else [positions])


def block_names(adapter: ArchAdapter) -> dict[str, str]:
    """:class:`SlicedBlock` names of a family's block parts (MLP parts when it has no MLP
    module)."""
    names = {"attn": adapter.attn_name, "mlp": adapter.mlp_name,
             "input_norm": adapter.input_norm_name, "post_attn_norm": adapter.post_attn_norm_name}
    if not adapter.mlp_name:
        (mlp_in,), (mlp_out,) = adapter.mlp_in_linears, adapter.mlp_out_linears
        names.update(mlp_in=mlp_in, mlp_out=mlp_out, activation=adapter.mlp_activation_name)
    return names


def sliced_block(adapter: ArchAdapter, layer: nn.Module, config: Any, eps: float) -> SlicedBlock:
    """A :class:`SlicedBlock` over ``layer``'s own attention and MLP modules (shortcuts unset)."""
    names = block_names(adapter)
    keys = [names["attn"]] + ([names["mlp"]] if names["mlp"] else
                              [names["mlp_in"], names["activation"], names["mlp_out"]])
    block = SlicedBlock(names, {k: getattr(layer, k) for k in keys}, config.hidden_size, eps,
                        adapter.residual_dropout(config))
    if hasattr(layer, "attention_type"):
        block.attention_type = layer.attention_type
    return block


def check_residual_stream(model: nn.Module, adapter: ArchAdapter) -> None:
    """ValueError naming why the model has no single pre-norm residual stream to rotate."""
    problems = adapter.residual_stream_problems(model.config)
    if problems:
        raise ValueError(f"slicegpt needs pre-norm blocks on one residual stream of width "
                         f"hidden_size; this {adapter.family} model has " + "; ".join(problems))


def _center_outputs(lin: nn.Linear) -> None:
    """Bake ``M = I − 11ᵀ/D`` into a writer of the residual stream (output rows), in place."""
    w = lin.weight.detach().double()
    lin.weight.copy_(w - w.mean(0, keepdim=True))
    if lin.bias is not None:
        lin.bias.copy_(lin.bias.double() - lin.bias.double().mean())


@torch.no_grad()
def fuse_model(model: nn.Module, adapter: ArchAdapter, untie: bool = True,
               defer_untie: bool = False) -> FusionInfo:
    """Untie the head, fold every norm into its readers, replace blocks by :class:`SlicedBlock`.

    The model's function is unchanged (up to float rounding); shapes are still dense. With
    ``untie=False`` (a head that will be re-tied) a tied head is left alone and the final
    norm's scale is only recorded in ``final_alpha``: the head is then wrong until
    ``rotate._finish_head`` re-ties it (no ``[V, D]`` copy is made). With ``defer_untie``
    (RMSNorm models) a tied head is also left alone (``head_pending``): ``_finish_head``
    builds the untied head from the original embedding in row chunks, so no ``[V, D]`` copy
    is held while the blocks are sliced; until then the head lacks the final norm's scale.
    """
    check_residual_stream(model, adapter)
    layers = adapter.layers(model)
    kind = norm_kind(adapter.input_norm(layers[0]))
    eps = norm_eps(adapter.input_norm(layers[0]))
    config: Any = model.config  # an HF config: its fields vary by family
    hidden = config.hidden_size
    was_tied = is_tied(model, adapter)
    final: Any = adapter.final_norm(model)  # a LayerNorm or a family's RMSNorm
    has_shift = getattr(final, "bias", None) is not None
    pending = was_tied and untie and defer_untie and kind == "rms" and not has_shift
    keep_tied = was_tied and (not untie or pending)
    if not keep_tied:
        untie_head(model, adapter)
    if kind == "layernorm":  # every writer of block 0's input is centred
        for embedding in stream_writers(model, adapter):
            e = embedding.weight
            e.copy_(e.double() - e.double().mean(-1, keepdim=True))
    for i, layer in enumerate(layers):
        attn, mlp = adapter.attn(layer), adapter.mlp_owner(layer)
        _fold_into_inputs(adapter.input_norm(layer),
                          [getattr(attn, n) for n in adapter.attn_in_linears])
        _fold_into_inputs(adapter.post_attn_norm(layer),
                          [getattr(mlp, n) for n in adapter.mlp_in_linears])
        if kind == "layernorm":
            for lin in [getattr(attn, n) for n in adapter.attn_out_linears] + \
                       [getattr(mlp, n) for n in adapter.mlp_out_linears]:
                _center_outputs(lin)
        layers[i] = sliced_block(adapter, layer, config, eps)
    alpha = None if has_shift else final.weight.detach().double().clone()
    if not keep_tied:
        _fold_into_inputs(final, [adapter.lm_head(model)], add_bias=True)
    set_module(model, adapter.final_norm_path, RMSN(hidden, eps))
    log.info("fused %s norms of %d blocks (head was tied: %s)", kind, len(layers), was_tied)
    return FusionInfo(norm=kind, eps=eps, was_tied=was_tied, final_alpha=alpha,
                      head_pending=pending)


def set_module(root: nn.Module, dotted: str, module: nn.Module) -> None:
    """Replace the submodule at ``dotted`` (relative to ``root``)."""
    parent_path, _, name = dotted.rpartition(".")
    parent: Any = root  # a module, or a ModuleList indexed by position
    for part in parent_path.split(".") if parent_path else []:
        parent = parent[int(part)] if part.isdigit() else getattr(parent, part)
    setattr(parent, name, module)
