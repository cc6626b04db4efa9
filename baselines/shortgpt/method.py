"""ShortGPT: one-shot removal of the k decoder blocks with the lowest Block Influence.

Block Influence comes from :func:`flexigpt.methods.block_influence.block_influence` (the harness's one
implementation, shared with FlexiGPT): BI_i = 1 − mean cos(X_i, X_{i+1}) over every token of
the calibration windows, fp32, hooks on the blocks. The k lowest-BI blocks are deleted at once
(BI is not recomputed) through ``ArchAdapter.set_layers``, which renumbers the KV-cache
``layer_idx`` and updates ``config.num_hidden_layers`` so the saved ``config.json`` already
describes the shallower model and ``rebuild`` is just ``empty_model(config)``.

``METHOD_LORA`` ("shortgpt_lora") removes the same blocks and asks the shared trainer for a
LoRA recovery on every linear of the remaining blocks, with a rank chosen so that its trainable
parameter count matches FlexiGPT's adapters at the same ratio and policy (see
:func:`lora_budget`). The trainer merges the LoRA back, so the saved structure is unchanged.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

from torch import nn

from baselines.shortgpt.config import ShortGPTConfig, ShortGPTLoRAConfig
from flexigpt.core.params import compression_ratio, count_parameters
from flexigpt.methods.block_count import block_count
from flexigpt.methods.block_influence import lowest_blocks, scores_for
from flexigpt.methods.lora import lora_params_per_rank, lora_rank_problem
from flexigpt.methods.surgery import check_flexigpt_rank
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import ArchAdapter, get_adapter
from flexigpt.storage.registry import CompressionResult, Method, RecoveryRecipe
from flexigpt.storage.structure import check_removed_blocks

log = logging.getLogger(__name__)


def choose_k(model: nn.Module, scores: list[float], cfg: ShortGPTConfig) -> tuple[int, float]:
    """Block count for ``cfg`` and the parameter reduction that removing them achieves.

    The rule is :func:`flexigpt.methods.block_count.block_count` (shared with FlexiGPT), with the
    achieved ratio ``1 − params(without the k lowest-BI blocks)/params(dense)`` counted by
    ``count_parameters`` (embeddings and head included); ``matched`` aims at
    ``cfg.match_ratio`` when given, else at ``cfg.ratio``.

    Raises:
        ValueError: the policy gives k = 0 or k ≥ L (nothing or everything removed).
    """
    blocks = get_adapter(model).layers(model)
    dense = count_parameters(model)

    def achieved(k: int) -> float:
        removed = sum(count_parameters(blocks[i]) for i in lowest_blocks(scores, k))
        return compression_ratio(dense - removed, dense)

    target = cfg.match_ratio if cfg.match_ratio is not None else cfg.ratio
    k = block_count(cfg.policy, target if cfg.policy == "matched" else cfg.ratio,
                    len(blocks), achieved)
    return k, achieved(k)


def _linear_width(adapter: ArchAdapter, block: nn.Module) -> int:
    """Σ (in_features + out_features) over a block's linears: LoRA parameters per unit rank."""
    return lora_params_per_rank(list(adapter.block_linears(block).items()))


def lora_budget(adapter: ArchAdapter, removed: list[nn.Module], remaining: list[nn.Module],
                hidden: int, flexigpt_rank: int, lora_rank: int | None) -> dict[str, Any]:
    """Recovery LoRA rank whose trainable count matches FlexiGPT's at the same block count.

    FlexiGPT trains, per replaced block, a rank-``flexigpt_rank`` LoRA on each of the 7 linears
    (``r·(in+out)`` each) plus two output-norm gammas (2·d). ShortGPT + LoRA trains rank-r LoRA
    on every linear of the remaining blocks; r is the integer (≥ 1) whose count is closest
    (ties: the smaller r), unless ``lora_rank`` overrides it.
    """
    flex = sum(flexigpt_rank * _linear_width(adapter, b) + 2 * hidden for b in removed)
    per_rank = sum(_linear_width(adapter, b) for b in remaining)
    source = "config" if lora_rank is not None else "matched to flexigpt"
    if lora_rank is None:
        low = max(1, flex // per_rank)
        lora_rank = min((low, low + 1), key=lambda r: (abs(r * per_rank - flex), r))
    return RecoveryRecipe("lora", lora_rank=lora_rank, lora_alpha=lora_rank,
                          lora_targets=tuple(adapter.attn_linears + adapter.mlp_linears),
                          trainable_params=lora_rank * per_rank,
                          facts={"flexigpt_trainable_params": flex,
                                 "flexigpt_rank": flexigpt_rank,
                                 "rank_source": source}).to_dict()


def remove_blocks(model: nn.Module, calibration: Any, cfg: ShortGPTConfig
                  ) -> tuple[CompressionResult, list[nn.Module], list[nn.Module]]:
    """Score, choose and delete blocks in place; returns the result and (removed, kept)."""
    adapter = get_adapter(model)
    blocks = list(adapter.layers(model))
    start = time.perf_counter()
    scores = scores_for(model, calibration, cfg.bi_scores, batch_size=cfg.batch_size)
    k, expected = choose_k(model, scores, cfg)
    removed = lowest_blocks(scores, k)
    kept = [b for i, b in enumerate(blocks) if i not in removed]
    adapter.set_layers(model, kept)
    log.info("ShortGPT removed %d of %d blocks %s (expected ratio %.4f)", k, len(blocks),
             removed, expected)
    info = {"block_influence": scores, "removed_blocks": removed, "k": k,
            "policy": cfg.policy, "match_ratio": cfg.match_ratio, "dense_blocks": len(blocks), "expected_ratio": expected,
            "seconds": round(time.perf_counter() - start, 3)}
    structure = {"removed_blocks": removed, "dense_blocks": len(blocks)}
    return (CompressionResult(model=model, structure=structure, info=info),
            [blocks[i] for i in removed], kept)


def compress(model: nn.Module, tokenizer: Any, calibration: Any,
             cfg: ShortGPTConfig) -> CompressionResult:
    """Remove the lowest-BI blocks (see module docstring). ``calibration``: ``[N, T]`` ids."""
    return remove_blocks(model, calibration, cfg)[0]


def compress_lora(model: nn.Module, tokenizer: Any, calibration: Any,
                  cfg: ShortGPTLoRAConfig) -> CompressionResult:
    """ShortGPT removal plus ``info["recovery"]``, the LoRA recipe for the shared trainer."""
    result, removed, kept = remove_blocks(model, calibration, cfg)
    config: Any = model.config  # an HF config: its fields vary by family
    hidden = config.hidden_size
    flexigpt_rank = cfg.flexigpt_rank or max(1, hidden // 16)
    recovery = lora_budget(get_adapter(model), removed, kept, hidden, flexigpt_rank,
                           cfg.lora_rank)
    result.info["recovery"] = recovery
    return result


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """The saved config already has ``num_hidden_layers = L − k``: a plain skeleton."""
    return empty_model(config)


def card_lines(manifest: Any) -> list[str]:
    """The model card's structure lines (``Method.card_lines``)."""
    s = manifest.structure
    return [f"- removed blocks {s.get('removed_blocks')} of {s.get('dense_blocks')}; "
            "nothing is shared"]


def lora_size_problem(model: nn.Module, cfg: ShortGPTLoRAConfig) -> tuple[str, str] | None:
    """``Method.check_sizes`` of ShortGPT + LoRA: the FlexiGPT rank its budget is matched to
    (the bound ``flexigpt.api.compression.compress`` applies to FlexiGPT) and the LoRA rank."""
    if cfg.flexigpt_rank is not None:
        try:
            check_flexigpt_rank(model, SimpleNamespace(rank=cfg.flexigpt_rank))
        except ValueError as err:
            return "flexigpt_rank", f"flexigpt_rank: {err}"
    return lora_rank_problem(model, cfg, "lora_rank")


METHOD = Method(name="shortgpt", config_cls=ShortGPTConfig, compress=compress,
                rebuild=rebuild, check_structure=check_removed_blocks, recovery="none",
                description="ShortGPT: the lowest-Block-Influence blocks removed",
                card_lines=card_lines)
METHOD_LORA = Method(name="shortgpt_lora", config_cls=ShortGPTLoRAConfig,
                     compress=compress_lora, rebuild=rebuild, check_structure=check_removed_blocks, recovery="lora",
                     description="ShortGPT + LoRA recovery (merged back into the linears)",
                     check_sizes=lora_size_problem, card_lines=card_lines)
