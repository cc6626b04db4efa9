"""Attention over prefix-tree rows laid end to end in one sequence (the fast scorer's layout).

The mask layout (``packing.collate``) pads rows into ``[B, T]`` and runs dense attention over
every ``T × T`` pair of a row, so several documents packed into one row pay for attention
between each other that the mask then throws away. Here each row holds one document's tree,
rows of similar length form a *bucket* (padded to the bucket's width ``W``), and the buckets
sit one after another in a single ``[1, N]`` sequence. The linear layers see ``N`` tokens with
almost no padding; attention runs bucket by bucket as ``[rows, heads, W, W]`` with that
bucket's tree mask, so its cost follows each document's size instead of the packed row's.

The attention function is registered with transformers' ``AttentionInterface`` as
``"flexigpt_tree"`` and reads the layout from the ``tree_layout`` keyword, which decoder
models pass through to their attention modules; without it, it is plain ``sdpa``.
:func:`tree_attention` switches a model to it for the duration of a ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PretrainedConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from flexigpt.runtime.evaluation.fast.packing import Bucket, TreeLayout

ATTENTION_NAME = "flexigpt_tree"


def _split(states: torch.Tensor, bucket: Bucket) -> torch.Tensor:
    """``[1, H, N, D]`` → the bucket's ``[rows, H, width, D]`` (a view, no copy)."""
    part = states[0, :, bucket.start:bucket.end]  # [H, rows*width, D]
    return part.unflatten(1, (bucket.rows, bucket.width)).transpose(0, 1)


def tree_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0,
              scaling: float | None = None, tree_layout: TreeLayout | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query [1, Hq, N, D]``, ``key/value [1, Hkv, N, D]``
    → ``([1, N, Hq, D], None)``, attention restricted to each bucket's tree mask.

    Without ``tree_layout`` this is transformers' ``sdpa`` attention, unchanged. A sliding-
    window layer (``sliding_window`` keyword, Gemma 3's local layers) attends only to keys
    less than the window behind the query, in position ids (``Bucket.window_mask``), as
    transformers' own sliding mask does; a bucket no wider than the window needs no change.
    """
    if tree_layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    window = kwargs.get("sliding_window")  # Gemma 3's local layers pass their window
    batch, heads, length, dim = query.shape
    if batch != 1 or length != tree_layout.length:
        raise ValueError(f"tree attention needs one sequence of {tree_layout.length} tokens, "
                         f"got query {tuple(query.shape)}")
    out = query.new_empty(1, length, heads, dim)
    gqa = key.shape[1] != heads
    for bucket in tree_layout.buckets:
        mask = (bucket.mask if window is None or bucket.width <= window
                else bucket.window_mask(window))
        attended = F.scaled_dot_product_attention(
            _split(query, bucket), _split(key, bucket), _split(value, bucket),
            attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa)
        out[0, bucket.start:bucket.end].view(bucket.rows, bucket.width, heads, dim).copy_(
            attended.transpose(1, 2))
    return out, None


AttentionInterface.register(ATTENTION_NAME, tree_sdpa)


@contextmanager
def tree_attention(model: nn.Module) -> Iterator[None]:
    """Run ``model``'s transformers attention modules through :func:`tree_sdpa` inside the
    block (every config reachable from its modules is switched and restored afterwards)."""
    configs: dict[int, PretrainedConfig] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            configs.setdefault(id(config), config)
    saved = {key: config._attn_implementation_internal for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation_internal = ATTENTION_NAME
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]
