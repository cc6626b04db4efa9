"""FlexiGPT pruning (Smith et al., NAACL 2025) as a registry method.

Pipeline (see docs/method-flexigpt.md §1): Block Influence scores → prune the k lowest →
per pruned block choose an unpruned base by the low-rank SVD distance (Eq. 2–5) → put a
weight-shared replacement block at the pruned position (depth unchanged): the base block's
linears (same storage) + block-specific LoRA initialised from the SVD of W_pruned − W_base
(Eq. 7–8) + output LayerNorms with small γ (Eq. 6). The pruned weights are used only for
selection and initialisation and are then dropped. Every choice the paper leaves open is a
field of :class:`FlexiGPTConfig` and so lands in the manifest. Linear biases (Qwen2 q/k/v)
are shared with the base like the weights; the LoRA adapters do not model their difference.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from flexigpt.core.params import count_parameters
from flexigpt.methods.block_count import POLICIES, block_count
from flexigpt.methods.block_influence import lowest_blocks, scores_for, validate_scores
from flexigpt.methods.flexigpt.base_selection import DISTANCES, select_bases
from flexigpt.methods.flexigpt.export_hooks import card_pruned, draft_skip_pruned, plain_pruned
from flexigpt.methods.sharing import adapter_trainable
from flexigpt.methods.surgery import (
    OUTPUT_NORM_EPS,
    check_flexigpt_rank,
    default_rank,
    init_standard_,
    init_svd_,
    matrix_ranks,
    prenorm_numel,
    rank_problem,
    saving_per_block,
    share_block,
    sharing_summary,
)
from flexigpt.methods.truncated_svd import SOLVERS as SVD_SOLVERS
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import CompressionResult, Method, RecoveryRecipe, validate_ratio
from flexigpt.storage.structure import block_indices, is_int

log = logging.getLogger(__name__)

SVD_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _positive_int_or_none(value: Any, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{what} must be a positive integer or None, got {value!r}")


def _choice(value: Any, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ValueError(f"{what} must be one of {list(choices)}, got {value!r}")


@dataclass
class FlexiGPTConfig:
    """Options of FlexiGPT pruning (each open choice of the paper is explicit).

    Attributes:
        ratio: compression target in (0, 1).
        policy: the block count rule of :mod:`flexigpt.methods.block_count`, shared with ShortGPT:
            ``paper``: k = int(ratio·L) blocks (LLaMA-2 7B at 0.3 → 9, the paper's +3.67%
            adapter overhead); ``matched``: the k whose *net* parameter reduction (adapters,
            γ's and kept pre-norms included, counted like
            ``flexigpt.core.params.count_parameters``) is nearest to ``ratio`` (ties: fewer).
        rank: LoRA rank of every replacement linear (clamped to min(out, in) per matrix);
            None → hidden/16 (the paper's 256/4096).
        distance: base-selection metric: ``lowrank`` (Eq. 2–5), ``full`` (no high-rank
            removal, Table 4 row 1) or ``frobenius`` (Fig. 2c).
        distance_rank: truncation rank r of ``lowrank``/``full``; None → ``rank``.
        lora_init: ``svd`` (Eq. 7–8: lora_B = U_rΣ_r, lora_A = V_rᵀ, scaling 1) or
            ``standard`` (PEFT default: Kaiming A, zero B; Table 4 row 3).
        output_norm: LayerNorm·γ on the attention and MLP outputs of replacement blocks
            (Eq. 6; Table 4 row 2 turns it off).
        gamma_init: initial value of every γ entry (paper: "a small value", unreported).
            1e-3 keeps a replacement block's start close to removing it (the start PPL of
            ShortGPT-style removal); recovery training gives γ its own learning rate, chosen
            on the tuning split (never on the perplexity test windows).
        prenorm: RMSNorm weights of replacement blocks: ``copy`` keeps the pruned block's
            own (2·d params each) or ``share`` reuses the base block's modules.
        svd_dtype: dtype of all SVDs (selection and initialisation).
        svd: how the top-r factors of the truncations and the SVD init are computed:
            ``exact`` (full thin SVD; the default), ``randomized`` (randomized subspace
            iteration with a stated error bound) or ``auto`` (randomized for matrices whose
            smaller side is ≥ 1024, else exact); :mod:`flexigpt.methods.truncated_svd`.
        bi_batch_size: sequences per forward when scoring Block Influence.
        bi_scores: precomputed Block Influence, one per block (the DAG computes it once per
            model); None computes it from the calibration windows.
    """

    ratio: float = 0.3
    policy: str = "paper"
    rank: int | None = None
    distance: str = "lowrank"
    distance_rank: int | None = None
    lora_init: str = "svd"
    output_norm: bool = True
    gamma_init: float = 1e-3
    prenorm: str = "copy"
    svd_dtype: str = "float32"
    svd: str = "exact"
    bi_batch_size: int = 4
    bi_scores: list[float] | None = None

    def __post_init__(self) -> None:
        self.ratio = validate_ratio(self.ratio)
        self.bi_scores = validate_scores(self.bi_scores)
        _choice(self.policy, POLICIES, "policy")
        _positive_int_or_none(self.rank, "rank")
        _choice(self.distance, DISTANCES, "distance")
        _positive_int_or_none(self.distance_rank, "distance_rank")
        _choice(self.lora_init, ("svd", "standard"), "lora_init")
        if not isinstance(self.output_norm, bool):
            raise ValueError(f"output_norm must be true or false, got {self.output_norm!r}")
        if (isinstance(self.gamma_init, bool) or not isinstance(self.gamma_init, (int, float))
                or not math.isfinite(self.gamma_init)):
            raise ValueError(f"gamma_init must be a finite number, got {self.gamma_init!r}")
        self.gamma_init = float(self.gamma_init)
        _choice(self.prenorm, ("copy", "share"), "prenorm")
        _choice(self.svd_dtype, tuple(SVD_DTYPES), "svd_dtype")
        _choice(self.svd, SVD_SOLVERS, "svd")
        if (isinstance(self.bi_batch_size, bool) or not isinstance(self.bi_batch_size, int)
                or self.bi_batch_size < 1):
            raise ValueError(f"bi_batch_size must be a positive integer, got {self.bi_batch_size!r}")


def blocks_to_prune(ratio: float, policy: str, n_blocks: int, dense_params: int,
                    net_per_block: int) -> int:
    """Number of blocks k for ``ratio`` under ``policy`` (:func:`flexigpt.methods.block_count.block_count`
    with FlexiGPT's achieved ratio k·net/dense).

    Raises:
        ValueError: k would be 0, would prune every block, or ``ratio`` is unreachable.
    """
    if policy == "matched" and net_per_block <= 0:
        raise ValueError(f"a replacement block saves no parameters (net {net_per_block}); "
                         "lower the rank for policy 'matched'")
    if n_blocks < 2:
        raise ValueError(f"FlexiGPT needs at least 2 blocks, the model has {n_blocks}")
    return block_count(policy, ratio, n_blocks, lambda k: k * net_per_block / dense_params)


def compress(model: nn.Module, tokenizer: Any, calibration: torch.Tensor | None,
             cfg: FlexiGPTConfig) -> CompressionResult:
    """Prune ``model`` in place with FlexiGPT (see module docstring)."""
    t_start = time.perf_counter()
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    svd_dtype = SVD_DTYPES[cfg.svd_dtype]
    config: Any = model.config  # an HF config: its fields vary by family
    rank = cfg.rank or default_rank(config.hidden_size)
    ranks = matrix_ranks(adapter, blocks[0], rank)
    dist_ranks = matrix_ranks(adapter, blocks[0], cfg.distance_rank or rank)
    dense = count_parameters(model)
    saving = saving_per_block(model, ranks, cfg.output_norm, cfg.prenorm)
    k = blocks_to_prune(cfg.ratio, cfg.policy, len(blocks), dense, saving["net"])
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    scores = scores_for(model, calibration, cfg.bi_scores, batch_size=cfg.bi_batch_size)
    timings["block_influence"] = time.perf_counter() - t0
    pruned = lowest_blocks(scores, k)
    log.info("pruning %d of %d blocks: %s", k, len(blocks), pruned)

    selection = select_bases(blocks, adapter, pruned, dist_ranks, cfg.distance, svd_dtype,
                             solver=cfg.svd)
    timings.update(selection.timings)

    t0 = time.perf_counter()
    residuals = _replace_blocks(model, pruned, selection.base_map, ranks, cfg, svd_dtype)
    timings["surgery_init"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_start

    params = _param_summary(model, dense, saving, k, cfg.prenorm)
    structure = {"pruned_blocks": pruned,
                 "base_map": {str(i): j for i, j in selection.base_map.items()},
                 "ranks": ranks, "output_norm": cfg.output_norm,
                 "output_norm_eps": OUTPUT_NORM_EPS, "prenorm": cfg.prenorm}
    info = {"block_influence": scores, "pruned_blocks": pruned,
            "base_map": structure["base_map"], "distance_matrix": selection.matrix_json(),
            "distance_ranks": dist_ranks, "k": k, "policy": cfg.policy,
            "predicted_ratio": k * saving["net"] / dense, "params": params,
            "svd_init_residual": residuals,
            "timings": {key: round(v, 3) for key, v in timings.items()},
            "recovery": RecoveryRecipe("flexigpt",
                                       trainable_params=adapter_trainable(model)).to_dict()}
    if selection.rechecked:  # close calls of a randomized truncation, compared exactly
        info["svd_rechecked"] = {str(i): js for i, js in selection.rechecked.items()}
    if selection.flat_fallback:  # svd auto found every candidate a close call: exact truncations
        info["svd_flat_fallback"] = True
    return CompressionResult(model=model, structure=structure, info=info)


def _replace_blocks(model: nn.Module, pruned: list[int], base_map: dict[int, int],
                    ranks: dict[str, int], cfg: FlexiGPTConfig,
                    svd_dtype: torch.dtype) -> dict[str, dict[str, float]]:
    """Turn each pruned block ``i`` into a weight-shared block over ``base_map[i]`` and
    initialise its adapters (``cfg.lora_init``); returns the SVD init residuals
    ``{str(i): {linear name: residual}}`` (empty under ``standard`` init)."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    config: Any = model.config  # an HF config: its fields vary by family
    residuals: dict[str, dict[str, float]] = {}
    for i in pruned:
        pruned_weights = {n: lin.weight for n, lin in adapter.block_linears(blocks[i]).items()}
        modules = share_block(blocks[i], blocks[base_map[i]], adapter, config.hidden_size,
                              ranks, cfg.output_norm, cfg.gamma_init,
                              share_prenorms=cfg.prenorm == "share")
        for name, module in modules.items():
            if cfg.lora_init == "svd":
                residuals.setdefault(str(i), {})[name] = round(
                    init_svd_(module, pruned_weights[name], svd_dtype, cfg.svd), 6)
            else:
                init_standard_(module)
        del pruned_weights  # the pruned linears are now unreferenced and freed
    return residuals


def _param_summary(model: nn.Module, dense: int, saving: dict[str, int], k: int,
                   prenorm: str) -> dict[str, int]:
    """The manifest's parameter counts of a pruned model (:func:`sharing_summary` plus the
    arithmetic of replacing ``k`` blocks); warns when the prediction misses the count."""
    adapter = get_adapter(model)
    params = sharing_summary(model)
    params.update(dense=dense, removed_per_block=saving["removed"],
                  added_per_block=saving["added"],
                  replacement_prenorms=k * prenorm_numel(adapter, adapter.layers(model)[0])
                  if prenorm == "copy" else 0,
                  predicted=dense - k * saving["net"])
    if params["predicted"] != params["unique"]:
        log.warning("parameter arithmetic mismatch: predicted %d, counted %d",
                    params["predicted"], params["unique"])
    return params


def apply_structure(model: nn.Module, structure: dict[str, Any]) -> nn.Module:
    """Replay the surgery of ``structure`` on a dense model, with zero placeholder adapters."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    config: Any = model.config  # an HF config: its fields vary by family
    for i_str, j in structure["base_map"].items():
        share_block(blocks[int(i_str)], blocks[int(j)], adapter, config.hidden_size,
                    structure["ranks"], structure["output_norm"], gamma_init=0.0,
                    share_prenorms=structure["prenorm"] == "share",
                    eps=structure.get("output_norm_eps", OUTPUT_NORM_EPS))
    return model


def check_structure(structure: dict[str, Any], config: Any) -> None:
    """``Method.check_structure``: ``pruned_blocks`` are positions of the saved model (which
    keeps every block), ``base_map`` maps exactly those to unpruned blocks, ``ranks`` are
    positive integers."""
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(n, int):
        raise ValueError(f"config.json's num_hidden_layers is {n!r}")
    pruned = block_indices(structure, "pruned_blocks", n)
    base_map = structure.get("base_map")
    if not isinstance(base_map, dict) or set(base_map) != {str(i) for i in pruned}:
        raise ValueError(f"structure.base_map must map exactly the pruned blocks {pruned} "
                         f"(as strings) to their bases, got {base_map!r}")
    for replaced, base in base_map.items():
        if not is_int(base) or not 0 <= base < n or base in pruned:
            raise ValueError(f"structure.base_map[{replaced!r}] = {base!r} is not an unpruned "
                             f"block in [0, {n})")
    ranks = structure.get("ranks")
    if not isinstance(ranks, dict) or not ranks or not all(
            is_int(r) and r >= 1 for r in ranks.values()):
        raise ValueError(f"structure.ranks must map linears to positive integers, got {ranks!r}")


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """An empty skeleton with the replacement blocks of ``structure`` (weights loaded later)."""
    return apply_structure(empty_model(config), structure)


METHOD = Method(name="flexigpt", config_cls=FlexiGPTConfig, compress=compress, rebuild=rebuild,
                recovery="flexigpt",
                description="FlexiGPT pruning: low-Block-Influence blocks replaced by "
                            "weight-shared blocks (another block's linears + block-specific "
                            "LoRA + output norms)",
                check_model=check_flexigpt_rank, check_sizes=rank_problem,
                draft_skip=draft_skip_pruned, plain=plain_pruned, card_lines=card_pruned,
                check_structure=check_structure)
