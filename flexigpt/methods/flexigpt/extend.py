"""FlexiGPT model extension (paper §5.2 / docs/method-flexigpt.md §3) as a registry method.

Blocks ``span = [start, end)`` are repeated until the model has ``layers`` blocks. Each
repeated copy shares the original block's linears (``SharedLoRALinear``, standard LoRA init
with ``lora_B = 0``), owns copies of the block's norms, and wraps attention and MLP in
``OutputNorm`` (repeats only; the originals are untouched). With ``gamma_init = 0`` every
repeat is exactly the identity, so the extended model equals the original at init.

Patterns: ``block`` → ``…, b, b′, b+1, (b+1)′, …``; ``sequential`` → ``…, s..e−1, s′..(e−1)′, …``.
When the added count is not a multiple of the span length, ``block`` gives the first blocks
of the span one extra copy and ``sequential`` appends a partial pass over the span's start.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flexigpt.core.memory import traced_bytes
from flexigpt.core.params import count_parameters
from flexigpt.methods.block_count import unique_param_count
from flexigpt.methods.flexigpt.export_hooks import (
    card_extended,
    draft_skip_extended,
    plain_extended,
)
from flexigpt.methods.lora import lora_rank_problem
from flexigpt.methods.sharing import adapter_trainable
from flexigpt.methods.surgery import (
    OUTPUT_NORM_EPS,
    default_rank,
    init_standard_,
    matrix_ranks,
    repeat_shell,
    share_block,
    sharing_summary,
)
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import CompressionResult, Method, RecoveryRecipe

log = logging.getLogger(__name__)

PATTERNS = ("block", "sequential")


@dataclass
class ExtendConfig:
    """Options of FlexiGPT extension.

    Attributes:
        layers: target depth (must exceed the model's depth); required.
        pattern: ``block`` or ``sequential`` (see module docstring).
        span: ``[start, end)`` of the repeated blocks; None → the ``min(added, L)`` middle
            blocks (TinyLlama 22 → 36: blocks 4..17 each repeated once).
        rank: LoRA rank of repeated linears (clamped per matrix); None → hidden/16.
        gamma_init: initial γ of the repeats' output norms; 0 → extended model == original.
        output_norm: wrap the repeats' attention/MLP in OutputNorm (the paper does).
    """

    layers: int | None = None
    pattern: str = "block"
    span: list[int] | None = None
    rank: int | None = None
    gamma_init: float = 0.0
    output_norm: bool = True

    def __post_init__(self) -> None:
        if self.layers is None:
            raise ValueError("layers (the target depth) is required, got None")
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 2:
            raise ValueError(f"layers must be an integer ≥ 2, got {self.layers!r}")
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {list(PATTERNS)}, got {self.pattern!r}")
        if self.span is not None:
            span = list(self.span)
            if (len(span) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                          for v in span) or not 0 <= span[0] < span[1]):
                raise ValueError(f"span must be [start, end) with 0 ≤ start < end, "
                                 f"got {self.span!r}")
            self.span = span
        if self.rank is not None and (isinstance(self.rank, bool) or
                                      not isinstance(self.rank, int) or self.rank < 1):
            raise ValueError(f"rank must be a positive integer or None, got {self.rank!r}")
        if (isinstance(self.gamma_init, bool) or not isinstance(self.gamma_init, (int, float))
                or not math.isfinite(self.gamma_init)):
            raise ValueError(f"gamma_init must be a finite number, got {self.gamma_init!r}")
        self.gamma_init = float(self.gamma_init)
        if not isinstance(self.output_norm, bool):
            raise ValueError(f"output_norm must be true or false, got {self.output_norm!r}")


def extension_layout(n_blocks: int, layers: int, pattern: str,
                     span: list[int] | None = None) -> list[int]:
    """Source block index of every position of the extended model (first occurrence = original).

    Raises:
        ValueError: ``layers ≤ n_blocks`` or a span outside ``[0, n_blocks)``.
    """
    extra = layers - n_blocks
    if extra < 1:
        raise ValueError(f"layers must exceed the model's depth {n_blocks}, got {layers}")
    if span is None:
        width = min(extra, n_blocks)
        start = (n_blocks - width) // 2
        span = [start, start + width]
    start, end = span
    if end > n_blocks:
        raise ValueError(f"span {span} exceeds the model's {n_blocks} blocks")
    width = end - start
    full, rest = divmod(extra, width)
    if pattern == "block":
        layout = []
        for b in range(n_blocks):
            copies = full + (1 if start <= b < start + rest else 0) if start <= b < end else 0
            layout.extend([b] * (1 + copies))
        return layout
    run = list(range(start, end))
    return list(range(end)) + run * full + run[:rest] + list(range(end, n_blocks))


def apply_layout(model: nn.Module, layout: list[int], ranks: dict[str, int],
                 output_norm: bool, gamma_init: float, initialise: bool,
                 eps: float = OUTPUT_NORM_EPS) -> list[int]:
    """Rebuild the block list of ``model`` per ``layout`` (in place); returns repeat positions.

    Repeats get zero adapters, or standard LoRA init when ``initialise``.
    """
    adapter = get_adapter(model)
    config: Any = model.config  # an HF config: its fields vary by family
    blocks = list(adapter.layers(model))
    seen: set[int] = set()
    new_blocks, repeats = [], []
    for pos, src in enumerate(layout):
        if src not in seen:
            seen.add(src)
            new_blocks.append(blocks[src])
            continue
        shell = repeat_shell(blocks[src], adapter, config)
        modules = share_block(shell, blocks[src], adapter, config.hidden_size, ranks,
                              output_norm, gamma_init, eps=eps)
        if initialise:
            for module in modules.values():
                init_standard_(module)
        new_blocks.append(shell)
        repeats.append(pos)
    if seen != set(range(len(blocks))):
        raise ValueError(f"layout {layout} drops blocks {sorted(set(range(len(blocks))) - seen)}")
    adapter.set_layers(model, new_blocks)
    return repeats


#: bytes a CPU tensor's storage is aligned to (c10's ``gAlignment``): what the smallest
#: tensor takes at least
ALIGNMENT = 64


@dataclass(frozen=True)
class ExtensionMemory:
    """What a model extended to ``layers`` blocks holds in memory, before any block is built
    (:func:`extension_memory`): its ``weights`` (the dense model's unique tensors) and
    ``added`` repeats of ``per_block`` bytes each."""

    layers: int
    weights: int
    added: int
    per_block: int

    @property
    def total(self) -> int:
        return self.weights + self.added * self.per_block


def repeat_bytes(model: nn.Module, rank: int | None = None,
                 dtype: torch.dtype = torch.float32, output_norm: bool = True) -> int:
    """Bytes one added block of ``model`` (real, or a meta skeleton: then nothing is
    allocated) holds although it shares its linears: one repeat of block 0 is built as
    :func:`apply_layout` builds it, and counted. Its own tensors (LoRA factors, γ's, norm
    copies, every buffer and any other tensor the copy owns: whatever its source does not
    also hold) in ``dtype`` (floating tensors; others in their own type), each rounded up to
    :data:`ALIGNMENT`; plus the Python heap its modules and tensor objects hold
    (:func:`flexigpt.core.memory.traced_bytes`). A lower bound: a tensor's C++ bookkeeping
    and the allocator's slack come on top."""
    adapter = get_adapter(model)
    block = adapter.layers(model)[0]
    config: Any = model.config  # an HF config: its fields vary by family
    ranks = matrix_ranks(adapter, block, rank or default_rank(config.hidden_size))

    def build() -> nn.Module:
        shell = repeat_shell(block, adapter, config)
        share_block(shell, block, adapter, config.hidden_size, ranks, output_norm, 0.0)
        return shell

    build()  # first-use caches are no block's
    shell, heap = traced_bytes(build)
    source = {id(t) for t in (*block.parameters(), *block.buffers())}
    owned = {id(t): t for t in (*shell.parameters(), *shell.buffers()) if id(t) not in source}
    tensors = sum(-(-t.numel() * (dtype.itemsize if t.is_floating_point()
                                  else t.element_size()) // ALIGNMENT) * ALIGNMENT
                  for t in owned.values())
    return tensors + heap


def extension_memory(model: nn.Module, layers: int, rank: int | None = None,
                     dtype: torch.dtype = torch.float32) -> ExtensionMemory:
    """The memory ``model`` (real or meta skeleton) extended to ``layers`` blocks holds
    (:class:`ExtensionMemory`): the dense model's unique parameters in ``dtype`` and, per
    added block, :func:`repeat_bytes`; counted before anything is built."""
    added = max(layers - len(get_adapter(model).layers(model)), 0)
    return ExtensionMemory(layers=layers, weights=unique_param_count(model) * dtype.itemsize,
                           added=added,
                           per_block=repeat_bytes(model, rank, dtype) if added else 0)


def compress(model: nn.Module, tokenizer: Any, calibration: torch.Tensor | None,
             cfg: ExtendConfig) -> CompressionResult:
    """Extend ``model`` in place to ``cfg.layers`` blocks (see module docstring)."""
    t0 = time.perf_counter()
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    n_blocks = len(blocks)
    assert cfg.layers is not None  # ExtendConfig.__post_init__ rejects None
    layout = extension_layout(n_blocks, cfg.layers, cfg.pattern, cfg.span)
    config: Any = model.config  # an HF config: its fields vary by family
    ranks = matrix_ranks(adapter, blocks[0], cfg.rank or default_rank(config.hidden_size))
    dense = count_parameters(model)
    repeats = apply_layout(model, layout, ranks, cfg.output_norm, cfg.gamma_init,
                           initialise=True)
    params: dict[str, float] = dict(sharing_summary(model))  # + the float "overhead"
    params["dense"] = dense
    params["overhead"] = (params["unique"] - dense) / dense
    structure = {"original_layers": n_blocks, "layout": layout, "ranks": ranks,
                 "output_norm": cfg.output_norm, "output_norm_eps": OUTPUT_NORM_EPS}
    info = {"layout": layout, "repeat_positions": repeats, "original_layers": n_blocks,
            "layers": len(layout), "pattern": cfg.pattern, "params": params,
            "timings": {"surgery": round(time.perf_counter() - t0, 3)},
            "recovery": RecoveryRecipe("flexigpt",
                                       trainable_params=adapter_trainable(model)).to_dict()}
    log.info("extended %d -> %d blocks (+%.2f%% parameters)", n_blocks, len(layout),
             100 * params["overhead"])
    return CompressionResult(model=model, structure=structure, info=info)


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """Skeleton of the extended model: the original-depth model + the same layout surgery.

    The original block ``s`` sat where ``layout`` first names it, so the original config is
    the extended one at those positions (per-layer types included: a repeat keeps its
    source's attention type, e.g. Gemma 3's sliding window)."""
    layout = structure["layout"]
    original = get_adapter(config).with_blocks(
        config, [layout.index(s) for s in range(structure["original_layers"])])
    model = empty_model(original)
    apply_layout(model, layout, structure["ranks"], structure["output_norm"],
                 gamma_init=0.0, initialise=False,
                 eps=structure.get("output_norm_eps", OUTPUT_NORM_EPS))
    return model


METHOD = Method(name="flexigpt_extend", config_cls=ExtendConfig, compress=compress,
                rebuild=rebuild, recovery="flexigpt",
                description="FlexiGPT extension: blocks repeated with shared linears + LoRA",
                check_sizes=lambda model, cfg: lora_rank_problem(model, cfg, "rank"),
                draft_skip=draft_skip_extended, plain=plain_extended,
                card_lines=card_extended)
