"""LLM-Pruner's fragment of the standalone remote-code loader: per-layer attention-head
counts and MLP widths (mirrors :mod:`baselines.llm_pruner.surgery`). Assembled after
:mod:`flexigpt.storage.standalone` by :mod:`flexigpt.export.standalone`.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from flexigpt.storage.standalone import (
    ATTN,
    ATTN_LINEARS,
    MLP,
    MLP_LINEARS,
    _linear,
    register_replay,
)


def replay_llm_pruner(model: PreTrainedModel, s: dict[str, Any]) -> None:
    """LLM-Pruner: per-layer query/KV head counts and MLP widths (whole KV groups removed)."""
    hd = int(s["head_dim"])
    layers = model.model.layers
    counts = list(zip(s["num_attention_heads"], s["num_key_value_heads"], s["intermediate_size"]))
    if len(counts) != len(layers):
        raise ValueError(f"structure describes {len(counts)} layers, config {len(layers)}")
    for block, (n_heads, n_kv, inter) in zip(layers, counts):
        attn, mlp = getattr(block, ATTN), getattr(block, MLP)
        for name, rows in zip(ATTN_LINEARS[:3], (n_heads, n_kv, n_kv)):
            old = getattr(attn, name)
            setattr(attn, name, _linear(old, old.in_features, rows * hd))
        attn.o_proj = _linear(attn.o_proj, n_heads * hd, attn.o_proj.out_features)
        attn.num_key_value_groups = n_heads // n_kv
        for name, value in (("num_heads", n_heads), ("num_key_value_heads", n_kv)):
            if hasattr(attn, name):
                setattr(attn, name, value)
        for name in MLP_LINEARS[:2]:
            old = getattr(mlp, name)
            setattr(mlp, name, _linear(old, old.in_features, inter))
        mlp.down_proj = _linear(mlp.down_proj, inter, mlp.down_proj.out_features)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = inter


register_replay("llm_pruner", replay_llm_pruner, "LLMPruner")
