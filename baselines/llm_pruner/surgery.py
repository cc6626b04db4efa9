"""Structured surgery on decoder blocks: drop attention groups and FFN channels.

Why not torch-pruning: PyPI ``torch-pruning`` 1.6.1 does not ship LLM-Pruner (its LLM example
prunes the hidden size uniformly in all layers with magnitude importance), and LLM-Pruner's
vendored fork relies on ``root_instances``/``consecutive_groups`` that 1.6.1 lacks. Its
dependency tracing cannot see the GQA coupling hidden in HF's ``repeat_kv`` (expand +
reshape), and it would be one more pinned dependency to trust for what is, once the groups
are known, plain row/column slicing of ``nn.Linear`` weights. Slicing directly keeps the
surgery transparent and lets the tests prove it exact against a masked dense model.

**GQA rule.** The unit of attention pruning is a *KV group*: one key/value head together
with the ``g = num_attention_heads / num_key_value_heads`` query heads that read it (query
heads ``j·g … (j+1)·g − 1`` for KV head j, the pairing of HF ``repeat_kv``). This is what
LLM-Pruner's own ``llama3.py`` does (root = ``k_proj`` with consecutive groups of
``head_dim``, query heads following through the dependency graph). It keeps g, and with it
``num_key_value_groups``, unchanged in every layer, so HF attention needs no new code:
``LlamaAttention`` reshapes with ``-1`` heads of ``head_dim`` and ``o_proj`` takes the
flattened output. For MHA (g = 1) the unit is a single head, as in the LLaMA paper setting.

Per-layer head/KV-head counts and FFN widths live in the method's ``structure`` (the saved
``config.json`` keeps the dense counts); :func:`apply_structure` rebuilds those shapes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flexigpt.storage.models.adapters import ArchAdapter, get_adapter


def head_dim_of(model: nn.Module) -> int:
    """Attention head width from the config (``head_dim`` or hidden / heads)."""
    cfg: Any = model.config  # an HF config: its fields vary by family
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _new_linear(like: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    """An uninitialised ``nn.Linear`` with ``like``'s dtype, device and bias presence."""
    return torch.nn.utils.skip_init(nn.Linear, in_features, out_features,
                                    bias=like.bias is not None, device=like.weight.device,
                                    dtype=like.weight.dtype)


def slice_linear(lin: nn.Linear, rows: torch.Tensor | None = None,
                 cols: torch.Tensor | None = None) -> nn.Linear:
    """A new ``nn.Linear`` keeping output ``rows`` and input ``cols`` (index tensors)."""
    weight = lin.weight.detach()
    bias = None if lin.bias is None else lin.bias.detach()
    if rows is not None:
        weight = weight.index_select(0, rows)
        bias = None if bias is None else bias.index_select(0, rows)
    if cols is not None:
        weight = weight.index_select(1, cols)
    new = _new_linear(lin, weight.shape[1], weight.shape[0])
    new.weight.data.copy_(weight)
    if bias is not None:
        new.bias.data.copy_(bias)
    new.weight.requires_grad_(lin.weight.requires_grad)
    return new


def set_attention_counts(attn: Any, n_heads: int, n_kv: int) -> None:
    """Update the head-count attributes an attention module may read at runtime."""
    # Any: an HF attention module of any family; its count attributes are plain ints
    attn.num_key_value_groups = n_heads // n_kv
    for name, value in (("num_heads", n_heads), ("num_key_value_heads", n_kv)):
        if hasattr(attn, name):
            setattr(attn, name, value)


def prune_block(adapter: ArchAdapter, block: nn.Module, keep_groups: torch.Tensor,
                keep_channels: torch.Tensor, head_dim: int) -> None:
    """Keep attention groups ``keep_groups`` ([n] KV-head indices) and FFN channels
    ``keep_channels`` ([m] indices) of ``block``, in place.

    q rows / o columns: the g·head_dim channels of each kept group; k/v rows: the head_dim
    channels of each kept KV head; gate/up rows and down columns: the kept channels (a
    family without a gate, OPT: fc1 rows and fc2 columns). Biases follow their rows.
    """
    attn = adapter.attn(block)
    mlp: Any = adapter.mlp_owner(block)  # HF MLP or OPT block; may carry intermediate_size
    q_name, k_name, v_name, o_name = (adapter.role_name(r) for r in ("q", "k", "v", "o"))
    in_names = [adapter.role_name(r) for r in adapter.mlp_in_roles()]
    down_name = adapter.role_name("down")
    q, k = getattr(attn, q_name), getattr(attn, k_name)
    n_kv = k.out_features // head_dim
    group = q.out_features // head_dim // n_kv
    if len(keep_groups) == 0 or len(keep_channels) == 0:
        raise ValueError("refusing to remove every attention group or every FFN channel")
    offsets = torch.arange(head_dim, device=keep_groups.device)
    kv_rows = (keep_groups[:, None] * head_dim + offsets).reshape(-1)
    q_offsets = torch.arange(group * head_dim, device=keep_groups.device)
    q_rows = (keep_groups[:, None] * group * head_dim + q_offsets).reshape(-1)
    setattr(attn, q_name, slice_linear(q, rows=q_rows))
    setattr(attn, k_name, slice_linear(k, rows=kv_rows))
    setattr(attn, v_name, slice_linear(getattr(attn, v_name), rows=kv_rows))
    setattr(attn, o_name, slice_linear(getattr(attn, o_name), cols=q_rows))
    set_attention_counts(attn, len(keep_groups) * group, len(keep_groups))
    for name in in_names:
        setattr(mlp, name, slice_linear(getattr(mlp, name), rows=keep_channels))
    setattr(mlp, down_name, slice_linear(getattr(mlp, down_name), cols=keep_channels))
    if hasattr(mlp, "intermediate_size"):
        mlp.intermediate_size = len(keep_channels)


def structure_of(model: nn.Module) -> dict[str, Any]:
    """Per-layer ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``."""
    adapter = get_adapter(model)
    head_dim = head_dim_of(model)
    out: dict[str, Any] = {"head_dim": head_dim, "num_attention_heads": [],
                           "num_key_value_heads": [], "intermediate_size": []}
    for block in adapter.layers(model):
        out["num_attention_heads"].append(adapter.linear(block, "q").out_features // head_dim)
        out["num_key_value_heads"].append(adapter.linear(block, "k").out_features // head_dim)
        out["intermediate_size"].append(adapter.linear(block, "up").out_features)
    return out


def apply_structure(model: nn.Module, structure: dict[str, Any]) -> nn.Module:
    """Give a dense skeleton the per-layer shapes of ``structure`` (weights uninitialised).

    Raises:
        ValueError: ``structure`` does not fit the model (layer count, head_dim, GQA ratio).
    """
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    head_dim = head_dim_of(model)
    heads, kvs = structure["num_attention_heads"], structure["num_key_value_heads"]
    inters = structure["intermediate_size"]
    if not len(heads) == len(kvs) == len(inters) == len(blocks):
        raise ValueError(f"structure describes {len(heads)} layers, the model has {len(blocks)}")
    if structure.get("head_dim", head_dim) != head_dim:
        raise ValueError(f"structure head_dim {structure['head_dim']} != model's {head_dim}")
    for block, n_heads, n_kv, inter in zip(blocks, heads, kvs, inters):
        if n_kv < 1 or n_heads % n_kv:
            raise ValueError(f"bad head counts {n_heads}/{n_kv} in structure")
        attn, mlp = adapter.attn(block), adapter.mlp_owner(block)
        q_name, k_name, v_name, o_name = (adapter.role_name(r) for r in ("q", "k", "v", "o"))
        in_names = [adapter.role_name(r) for r in adapter.mlp_in_roles()]
        down_name = adapter.role_name("down")
        for name, rows in ((q_name, n_heads), (k_name, n_kv), (v_name, n_kv)):
            old = getattr(attn, name)
            setattr(attn, name, _new_linear(old, old.in_features, rows * head_dim))
        old = getattr(attn, o_name)
        setattr(attn, o_name, _new_linear(old, n_heads * head_dim, old.out_features))
        set_attention_counts(attn, n_heads, n_kv)
        for name in in_names:
            old = getattr(mlp, name)
            setattr(mlp, name, _new_linear(old, old.in_features, inter))
        old = getattr(mlp, down_name)
        setattr(mlp, down_name, _new_linear(old, inter, old.out_features))
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = inter
    return model
