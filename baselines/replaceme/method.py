"""ReplaceMe behind the harness's method interface: compress (span, map, fold, remove) and
rebuild (a stock skeleton: the saved config already has ``L − n`` blocks)."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from baselines.replaceme.config import ReplaceMeConfig
from baselines.replaceme.span import angular_distances, choose_span, last_token_outputs
from baselines.replaceme.transform import (
    cosine_transform,
    fold_,
    lstsq_transform,
    mlp_writer,
    span_activations,
)
from flexigpt.core.params import compression_ratio, count_parameters
from flexigpt.methods.block_count import block_count, uniform_block_size
from flexigpt.methods.lora import lora_recovery
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import CompressionResult, Method
from flexigpt.storage.structure import check_removed_blocks

log = logging.getLogger(__name__)


def span_length(model: nn.Module, cfg: ReplaceMeConfig) -> tuple[int, float]:
    """The number of blocks n to remove (the harness's one block-count rule) and the ratio
    it achieves (``T`` adds no parameters: n blocks' worth are saved).

    Raises:
        ValueError: the policy gives n = 0 or n ≥ L − 1 (block 0 always stays), or the
            blocks differ in size (the span's position would change the count).
    """
    blocks = get_adapter(model).layers(model)
    dense, per_block = count_parameters(model), uniform_block_size(model, "ReplaceMe")

    def achieved(n: int) -> float:
        return compression_ratio(dense - n * per_block, dense)

    target = cfg.match_ratio if cfg.match_ratio is not None else cfg.ratio
    n = block_count(cfg.policy, target if cfg.policy == "matched" else cfg.ratio,
                    len(blocks), achieved)
    if n > len(blocks) - 2:
        raise ValueError(f"ReplaceMe keeps block 0 and at least one more; removing {n} of "
                         f"{len(blocks)} blocks is too many")
    return n, achieved(n)


def compress(model: nn.Module, tokenizer: Any, calibration: Any,
             cfg: ReplaceMeConfig) -> CompressionResult:
    """Remove the most redundant span and fold its linear replacement (module docstrings of
    :mod:`~baselines.replaceme.span` and :mod:`~baselines.replaceme.transform`);
    ``calibration``: ``[N, T]`` token ids."""
    METHOD.check_family(model)
    if not isinstance(calibration, torch.Tensor) or calibration.dim() != 2:
        raise ValueError("ReplaceMe needs calibration token windows as a LongTensor [N, T]")
    t0 = time.perf_counter()
    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    n, expected = span_length(model, cfg)
    distances = angular_distances(last_token_outputs(model, calibration, cfg.batch_size), n)
    start, end = choose_span(distances, n)
    batches = span_activations(model, calibration, start, end, cfg.batch_size)
    if cfg.objective == "lstsq":
        t, fit = lstsq_transform(batches, cfg.alpha)
    else:
        t, fit = cosine_transform(batches, cfg.cosine_epochs, cfg.cosine_lr, cfg.cosine_batch,
                                  cfg.seed)
    fold_(mlp_writer(adapter, blocks[start - 1]), t)
    removed = list(range(start, end))
    adapter.set_layers(model, [b for i, b in enumerate(blocks) if i not in removed])
    log.info("ReplaceMe removed blocks %d..%d of %d (%s; expected ratio %.4f)", start, end - 1,
             len(blocks), cfg.objective, expected)
    info = {"removed_blocks": removed, "k": n, "dense_blocks": len(blocks),
            "policy": cfg.policy, "match_ratio": cfg.match_ratio, "expected_ratio": expected,
            "span_distances": [round(float(d), 6) for d in distances],
            "objective": cfg.objective, "fit": fit, "folded_into": start - 1,
            "seconds": round(time.perf_counter() - t0, 3),
            "recovery": lora_recovery(adapter)}
    structure = {"removed_blocks": removed, "dense_blocks": len(blocks)}
    return CompressionResult(model=model, structure=structure, info=info)


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """The saved config already has ``num_hidden_layers = L − n``: a stock skeleton."""
    return empty_model(config)


def card_lines(manifest: Any) -> list[str]:
    """The model card's structure lines (``Method.card_lines``)."""
    s, info = manifest.structure, manifest.info
    return [f"- removed blocks {s.get('removed_blocks')} of {s.get('dense_blocks')}; a "
            f"linear map ({info.get('objective')}) folded into block "
            f"{info.get('folded_into')}'s MLP output projection; nothing is shared"]


METHOD = Method(name="replaceme", config_cls=ReplaceMeConfig, compress=compress,
                rebuild=rebuild, check_structure=check_removed_blocks, recovery="lora",
                description="ReplaceMe: a contiguous span of blocks removed, replaced by a "
                            "linear map folded into the block before it",
                card_lines=card_lines)
