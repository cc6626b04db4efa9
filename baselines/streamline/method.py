"""LLM-Streamline behind the harness's method interface.

``compress``: the span length n by the harness's block-count rule (the module's parameters
count against the saving), the most similar span (:mod:`~baselines.streamline.span`), the
lightweight module fitted on calibration hidden states (:mod:`~baselines.streamline.train`),
then blocks ``start … end − 1`` are replaced by it: ``L − n + 1`` blocks. With
``module: block`` (the official default) the module *is* block ``start``, trained, so the
result is a stock architecture; ``module: ffn`` puts a :class:`StreamlineFFN` there.
``rebuild``: the skeleton from ``(config, structure)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from baselines.streamline.config import StreamlineConfig
from baselines.streamline.modules import StreamlineFFN
from baselines.streamline.span import choose_span, span_similarities
from baselines.streamline.train import fit_module, span_pairs
from flexigpt.core.params import compression_ratio
from flexigpt.methods.block_count import block_count, uniform_block_size, unique_param_count
from flexigpt.methods.lora import lora_recovery
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import CompressionResult, Method
from flexigpt.storage.structure import block_span, check_block_count, dense_block_count

log = logging.getLogger(__name__)


def module_parameters(cfg: StreamlineConfig, hidden: int, per_block: int) -> int:
    """Parameters the lightweight module adds back."""
    return per_block if cfg.module == "block" else StreamlineFFN.parameter_count(hidden)


def _counts(model: nn.Module, cfg: StreamlineConfig) -> tuple[int, int, int, int]:
    """``(blocks, dense parameters, one block's parameters, the module's)`` of ``model``
    (real or meta-device skeleton)."""
    blocks = get_adapter(model).layers(model)
    config: Any = model.config  # an HF config: its fields vary by family
    per_block = unique_param_count(blocks[0])
    return (len(blocks), unique_param_count(model), per_block,
            module_parameters(cfg, config.hidden_size, per_block))


def _achieved(dense: int, per_block: int, added: int) -> Callable[[int], float]:
    """The ratio of replacing n blocks of ``per_block`` parameters by a module of ``added``."""
    return lambda n: compression_ratio(dense - n * per_block + added, dense)


def span_length(model: nn.Module, cfg: StreamlineConfig) -> tuple[int, float]:
    """The span length n (:func:`flexigpt.methods.block_count.block_count` on the net saving: n
    blocks removed, the module added) and the ratio it achieves.

    Raises:
        ValueError: the blocks differ in size, or no span length saves parameters.
    """
    uniform_block_size(model, "LLM-Streamline")  # the span's position must not matter
    n_blocks, dense, per_block, added = _counts(model, cfg)
    achieved = _achieved(dense, per_block, added)
    target = cfg.match_ratio if cfg.match_ratio is not None else cfg.ratio
    n = block_count(cfg.policy, target if cfg.policy == "matched" else cfg.ratio,
                    n_blocks, achieved)
    if achieved(n) <= 0:
        raise ValueError(f"replacing {n} blocks by a {cfg.module} module saves no parameters "
                         f"(module {added:,} vs {n} blocks of {per_block:,})")
    return n, achieved(n)


def check_structure(structure: dict[str, Any], config: Any) -> None:
    """``Method.check_structure``: the span lies in the dense model, the module is a block or
    an FFN, and the saved config holds the L − n + 1 blocks it implies."""
    n = dense_block_count(structure)
    start, end = block_span(structure, "span", n)
    if structure.get("module") not in ("block", "ffn"):
        raise ValueError(f"structure.module must be 'block' or 'ffn', got "
                         f"{structure.get('module')!r}")
    check_block_count(config, n - (end - start) + 1,
                      f"{n} dense blocks, span {start}..{end - 1} replaced by one module")


def ratio_curve(model: nn.Module, cfg: StreamlineConfig) -> tuple[int, Callable[[int], float]]:
    """``(blocks, achieved(n))``: the ratio of replacing n blocks by the module (``Method
    .ratio_curve``; the curve :func:`span_length` picks n on); counts a real model or a
    meta-device skeleton alike."""
    n_blocks, dense, per_block, added = _counts(model, cfg)
    return n_blocks, _achieved(dense, per_block, added)


def _module(model: nn.Module, start: int, cfg: StreamlineConfig) -> nn.Module:
    """Block ``start`` itself (``block``: trained in place and kept) or a new FFN
    (initialised from ``cfg.seed``)."""
    if cfg.module == "block":
        return get_adapter(model).layers(model)[start]
    config: Any = model.config  # an HF config: its fields vary by family
    ref = next(model.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return StreamlineFFN(config.hidden_size, dtype=ref.dtype).to(ref.device)


def compress(model: nn.Module, tokenizer: Any, calibration: Any,
             cfg: StreamlineConfig) -> CompressionResult:
    """Replace the most similar span by the fitted module (module docstring);
    ``calibration``: ``[N, T]`` token ids."""
    METHOD.check_family(model)
    if not isinstance(calibration, torch.Tensor) or calibration.dim() != 2:
        raise ValueError("LLM-Streamline needs calibration token windows as a LongTensor [N, T]")
    t0 = time.perf_counter()
    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    n, expected = span_length(model, cfg)
    similarities = span_similarities(model, calibration, n, cfg.batch_size)
    # an FFN in block 0's place would leave KV-cache layer 0 (where transformers reads the
    # sequence length) unwritten: that variant's span starts at block 1 or later
    first = 1 if cfg.module == "ffn" else 0
    start, end = choose_span(similarities[first:], n)
    start, end = start + first, end + first
    inputs, targets, kwargs = span_pairs(model, calibration, start, end, cfg.batch_size)
    module = _module(model, start, cfg)
    fit = fit_module(module, inputs, targets, kwargs, cfg)
    adapter.set_layers(model, [*blocks[:start], module, *blocks[end:]])
    log.info("LLM-Streamline replaced blocks %d..%d of %d by a %s (expected ratio %.4f; "
             "MSE %.4g -> %.4g)", start, end - 1, len(blocks), cfg.module, expected,
             fit["mse_before"], fit["mse_after"])
    structure = {"span": [start, end], "module": cfg.module, "dense_blocks": len(blocks)}
    info = {"span": [start, end], "k": n, "dense_blocks": len(blocks), "module": cfg.module,
            "policy": cfg.policy, "match_ratio": cfg.match_ratio, "expected_ratio": expected,
            "span_similarities": [round(float(s), 6) for s in similarities], "fit": fit,
            "seconds": round(time.perf_counter() - t0, 3),
            "recovery": lora_recovery(adapter)}
    return CompressionResult(model=model, structure=structure, info=info)


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """The skeleton: ``config`` already has ``L − n + 1`` blocks; an FFN module replaces
    the block at the span's start."""
    try:
        start, module = int(structure["span"][0]), structure["module"]
    except (KeyError, TypeError, IndexError, ValueError) as err:
        raise ValueError(f"not an LLM-Streamline structure ({err}): {structure!r}") from None
    model = empty_model(config)
    if module == "ffn":
        adapter = get_adapter(model)
        blocks = list(adapter.layers(model))
        ref = next(model.parameters())
        blocks[start] = StreamlineFFN(config.hidden_size, dtype=ref.dtype)
        adapter.set_layers(model, blocks)
    return model


def card_lines(manifest: Any) -> list[str]:
    """The model card's structure lines (``Method.card_lines``)."""
    s = manifest.structure
    start, end = s.get("span") or (None, None)
    return [f"- blocks {start}..{None if end is None else end - 1} of {s.get('dense_blocks')} "
            f"replaced by one trained {s.get('module')} module at position {start}"]


METHOD = Method(name="streamline", config_cls=StreamlineConfig, compress=compress,
                rebuild=rebuild, recovery="lora",
                description="LLM-Streamline: a contiguous span of blocks replaced by one "
                            "lightweight module trained to reproduce its output",
                card_lines=card_lines, ratio_curve=ratio_curve,
                check_structure=check_structure)
