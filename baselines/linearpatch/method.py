"""LinearPatch behind the harness's method interface.

``compress``: the span length n by the harness's block-count rule (the patch's parameters
count against the saving), the most similar span by the official criterion
(:mod:`~baselines.linearpatch.span`), the channel scales on calibration windows, then blocks
``start … end − 1`` are replaced by one :class:`LinearPatchLayer`: ``L − n + 1`` layers.
``rebuild``: the skeleton from ``(config, structure)``. Training-free; the ``lora`` variant
recovers with the harness's LoRA recipe (the patch stays as computed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from baselines.linearpatch.config import LinearPatchConfig
from baselines.linearpatch.replay import LinearPatchLayer
from baselines.linearpatch.span import (
    channel_scales,
    choose_span,
    patch_matrix,
    span_similarities,
)
from flexigpt.core.params import compression_ratio
from flexigpt.methods.block_count import block_count, uniform_block_size, unique_param_count
from flexigpt.methods.lora import lora_recovery
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import CompressionResult, Method
from flexigpt.storage.structure import block_span, check_block_count, dense_block_count

log = logging.getLogger(__name__)


def _counts(model: nn.Module, cfg: LinearPatchConfig) -> tuple[int, int, int, int]:
    """``(blocks, dense parameters, one block's parameters, the patch's)`` of ``model`` (real
    or meta-device skeleton)."""
    blocks = get_adapter(model).layers(model)
    config: Any = model.config  # an HF config: its fields vary by family
    return (len(blocks), unique_param_count(model), unique_param_count(blocks[0]),
            LinearPatchLayer.parameter_count(config.hidden_size, cfg.rotate))


def ratio_curve(model: nn.Module, cfg: LinearPatchConfig) -> tuple[int, Callable[[int], float]]:
    """``(blocks, achieved(n))``: the ratio of replacing n blocks by the patch (``Method
    .ratio_curve``); counts a real model or a meta-device skeleton alike."""
    n_blocks, dense, per_block, added = _counts(model, cfg)
    return n_blocks, lambda n: compression_ratio(dense - n * per_block + added, dense)


def span_length(model: nn.Module, cfg: LinearPatchConfig) -> tuple[int, float]:
    """The span length n and the ratio it achieves.

    Raises:
        ValueError: the blocks differ in size, or n leaves no candidate span.
    """
    uniform_block_size(model, "LinearPatch")  # the span's position must not matter
    n_blocks, achieved = ratio_curve(model, cfg)
    target = cfg.match_ratio if cfg.match_ratio is not None else cfg.ratio
    n = block_count(cfg.policy, target if cfg.policy == "matched" else cfg.ratio, n_blocks,
                    achieved)
    return n, achieved(n)


def check_structure(structure: dict[str, Any], config: Any) -> None:
    """``Method.check_structure``: the span lies inside the dense model (never block 0 nor
    the last), ``rotate`` is a boolean, and the saved config holds ``L − n + 1`` layers."""
    n = dense_block_count(structure)
    start, end = block_span(structure, "span", n)
    if start < 1 or end > n - 1:
        raise ValueError(f"structure.span {[start, end]} must keep block 0 and the last block")
    if not isinstance(structure.get("rotate"), bool):
        raise ValueError(f"structure.rotate must be true or false, got "
                         f"{structure.get('rotate')!r}")
    check_block_count(config, n - (end - start) + 1,
                      f"{n} dense blocks, span {start}..{end - 1} replaced by one patch")


def compress(model: nn.Module, tokenizer: Any, calibration: Any,
             cfg: LinearPatchConfig) -> CompressionResult:
    """Replace the most similar span by the patch (module docstring); ``calibration``:
    ``[N, T]`` token ids."""
    METHOD.check_family(model)
    if not isinstance(calibration, torch.Tensor) or calibration.dim() != 2:
        raise ValueError("LinearPatch needs calibration token windows as a LongTensor [N, T]")
    t0 = time.perf_counter()
    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    n, expected = span_length(model, cfg)
    similarities = span_similarities(model, calibration, n, cfg.batch_size)
    start, end = choose_span(similarities, n)
    scales = channel_scales(model, calibration, start, end, cfg.rotate, cfg.batch_size)
    config: Any = model.config
    ref = next(model.parameters())
    patch = LinearPatchLayer(config.hidden_size, cfg.rotate, dtype=ref.dtype).to(ref.device)
    with torch.no_grad():
        if cfg.rotate:
            patch.patch.weight.copy_(patch_matrix(scales, rotate=True))  # symmetric: W = P
        else:
            patch.scale.copy_(scales)
    adapter.set_layers(model, [*blocks[:start], patch, *blocks[end:]])
    log.info("LinearPatch replaced blocks %d..%d of %d by a %s patch (expected ratio %.4f; "
             "channel scales %.3f..%.3f)", start, end - 1, len(blocks),
             "rotated" if cfg.rotate else "diagonal", expected, float(scales.min()),
             float(scales.max()))
    structure = {"span": [start, end], "rotate": cfg.rotate, "dense_blocks": len(blocks)}
    info = {"span": [start, end], "k": n, "dense_blocks": len(blocks), "rotate": cfg.rotate,
            "policy": cfg.policy, "match_ratio": cfg.match_ratio, "expected_ratio": expected,
            "span_similarities": {str(i): round(s, 6) for i, s in similarities.items()},
            "scale_range": [round(float(scales.min()), 6), round(float(scales.max()), 6)],
            "seconds": round(time.perf_counter() - t0, 3),
            "recovery": lora_recovery(adapter)}
    return CompressionResult(model=model, structure=structure, info=info)


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """The skeleton: ``config`` already has ``L − n + 1`` layers; the patch stands at the
    span's start."""
    try:
        start, rotate = int(structure["span"][0]), bool(structure["rotate"])
    except (KeyError, TypeError, IndexError, ValueError) as err:
        raise ValueError(f"not a LinearPatch structure ({err}): {structure!r}") from None
    model = empty_model(config)
    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    ref = next(model.parameters())
    blocks[start] = LinearPatchLayer(config.hidden_size, rotate, dtype=ref.dtype)
    adapter.set_layers(model, blocks)
    return model


def card_lines(manifest: Any) -> list[str]:
    """The model card's structure lines (``Method.card_lines``)."""
    s = manifest.structure
    start, end = s.get("span") or (None, None)
    kind = "Hadamard-rotated channel-scaling" if s.get("rotate") else "channel-scaling"
    return [f"- blocks {start}..{None if end is None else end - 1} of {s.get('dense_blocks')} "
            f"removed; a {kind} patch of the residual stream stands at position {start}"]


METHOD = Method(name="linearpatch", config_cls=LinearPatchConfig, compress=compress,
                rebuild=rebuild, recovery="none",
                description="LinearPatch: a contiguous span of blocks removed and the residual "
                            "stream patched by a Hadamard-rotated channel scaling "
                            "(training-free)",
                card_lines=card_lines, ratio_curve=ratio_curve, check_structure=check_structure)
