"""Trainable-set recipes: which parameters recovery training updates.

- ``flexigpt``: the replacement/repeat blocks' adapters (parameters named ``lora_A``,
  ``lora_B`` of ``SharedLoRALinear`` and ``gamma`` of ``OutputNorm``); everything else is
  frozen. With ``lora_other_blocks`` the other blocks' unshared linears also get mergeable
  LoRA (:mod:`flexigpt.methods.lora`).
- ``lora``: mergeable LoRA on the target linears of every decoder block (not embeddings or
  head, not FlexiGPT's wrappers, not weights shared between modules); the rest frozen.
- ``full``: every parameter (the extension's control: the base model trained on the same
  tokens).
- ``none``: nothing (the model is evaluated and saved unchanged).
- ``last_blocks``: every parameter of the last k decoder blocks (``last_blocks``), the final
  norm and the LM head; the rest frozen (the layer-pruning literature's recovery baseline,
  e.g. ShortGPT + "fine-tune the LM head and the last 3 blocks", Reassessing Layer Pruning
  in LLMs). Where the LM head's weight is tied to the input embedding (SmolLM2), training
  the head trains the tied embedding too: logged, and recorded as ``tied_embedding``.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from torch import nn

from flexigpt.core.params import count_parameters
from flexigpt.methods.lora import (
    inject_lora,
    lora_candidates,
    lora_params_per_rank,
    rank_for_budget,
)
from flexigpt.methods.sharing import ADAPTER_PARAMS, adapter_trainable
from flexigpt.runtime.training.config import TrainPlan, check_last_blocks
from flexigpt.storage.models.adapters import get_adapter

log = logging.getLogger(__name__)

#: Parameter names (last path component) trained by the ``flexigpt`` recipe.
FLEXIGPT_PARAMS = ADAPTER_PARAMS
#: A matched trainable budget further off than this (relative) is logged as a warning.
BUDGET_TOLERANCE = 0.02


@dataclass
class RecipeReport:
    """What a recipe did to the model (recorded in the manifest history)."""

    recipe: str
    trainable_parameters: int
    trainable_tensors: int
    frozen_parameters: int
    lora_injected: list[str] = field(default_factory=list)
    lora_skipped_shared: list[str] = field(default_factory=list)
    lora_rank: int | None = None
    lora_alpha: float | None = None
    budget: dict[str, Any] | None = None
    last_blocks: int | None = None  # recipe last_blocks: k, the trailing blocks trained
    tied_embedding: bool = False  # recipe last_blocks: the head's tied input embedding trained

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["lora_injected"] = len(self.lora_injected)
        out["lora_skipped_shared"] = self.lora_skipped_shared
        return out


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def apply_recipe(model: nn.Module, plan: TrainPlan) -> RecipeReport:
    """Freeze ``model`` except the recipe's trainable set (injecting LoRA where needed).

    Raises:
        ValueError: the recipe finds nothing to train (e.g. ``flexigpt`` on a model without
            replacement adapters, or ``lora`` on a model whose linears are all shared).
    """
    adapter = get_adapter(model)
    model.requires_grad_(False)
    targets = plan.lora_targets or tuple(dict.fromkeys(adapter.attn_linears
                                                       + adapter.mlp_linears))
    blocks = [(f"{adapter.layers_path}.{i}", b) for i, b in enumerate(adapter.layers(model))]
    own = [n for n, _ in model.named_parameters() if _leaf(n) in FLEXIGPT_PARAMS]
    lora_blocks = blocks
    if plan.recipe == "flexigpt":
        lora_blocks = [(p, b) for p, b in blocks
                       if not any(_leaf(n) in FLEXIGPT_PARAMS for n, _ in b.named_parameters())]
    rank, alpha, budget = plan.lora_rank, plan.lora_alpha, None
    if plan.lora_budget is not None:
        rank, alpha, budget = _budget_rank(model, plan, plan.lora_budget, lora_blocks, targets)
    injected, skipped = _make_trainable(model, plan, bool(own), lora_blocks, targets, rank,
                                        alpha)
    tied = plan.recipe == "last_blocks" and _check_last_blocks_set(model, plan)
    if skipped:
        log.info("recipe %s: %d linear(s) share their weight with another module and get "
                 "no mergeable LoRA (e.g. %s)", plan.recipe, len(skipped), skipped[0])
    trainable = count_parameters(model, trainable_only=True)
    report = RecipeReport(
        recipe=plan.recipe, trainable_parameters=trainable,
        trainable_tensors=sum(1 for p in model.parameters() if p.requires_grad),
        frozen_parameters=count_parameters(model) - trainable,
        lora_injected=injected, lora_skipped_shared=skipped,
        lora_rank=rank if injected else None, lora_alpha=alpha if injected else None,
        budget=budget, last_blocks=plan.last_blocks if plan.recipe == "last_blocks" else None,
        tied_embedding=tied)
    if budget is not None and budget["achieved"] != trainable:
        raise RuntimeError(f"budget arithmetic predicted {budget['achieved']:,} trainable "
                           f"parameters, the model has {trainable:,}")
    log.info("recipe %s: %s trainable / %s frozen parameters, %d LoRA module(s) injected",
             plan.recipe, f"{trainable:,}", f"{report.frozen_parameters:,}", len(injected))
    return report


def _budget_rank(model: nn.Module, plan: TrainPlan, target: int,
                 lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...]) -> tuple[int, float, dict[str, Any]]:
    """``(rank, alpha, budget record)`` of the mergeable LoRA whose trainable count (the
    FlexiGPT adapters included for recipe ``flexigpt``) is nearest ``target``
    (``plan.lora_budget``); α is scaled to keep the LoRA scaling α/r. Logs a warning beyond
    :data:`BUDGET_TOLERANCE`."""
    fixed = adapter_trainable(model) if plan.recipe == "flexigpt" else 0
    per_rank = lora_params_per_rank(lora_candidates(model, lora_blocks, targets)[0])
    smallest = fixed + per_rank
    if target < smallest and (smallest - target) / target > BUDGET_TOLERANCE:
        raise ValueError(f"lora budget {target:,} is below the smallest trainable set of this "
                         f"model: {smallest:,} parameters (LoRA rank 1"
                         + (" + the FlexiGPT adapters)" if fixed else ")"))
    rank = rank_for_budget(target, fixed, per_rank)
    alpha = plan.lora_alpha * rank / plan.lora_rank  # keep the LoRA scaling α/r
    achieved = fixed + rank * per_rank
    budget = {"target": target, "achieved": achieved, "rank": rank,
              "rel_error": round((achieved - target) / target, 6)}
    if abs(budget["rel_error"]) > BUDGET_TOLERANCE:
        log.warning("trainable budget %d met only to %.2f%% (%d at rank %d)",
                    target, 100 * budget["rel_error"], achieved, rank)
    return rank, alpha, budget


def _make_trainable(model: nn.Module, plan: TrainPlan, has_adapters: bool,
                    lora_blocks: list[tuple[str, nn.Module]], targets: tuple[str, ...],
                    rank: int, alpha: float) -> tuple[list[str], list[str]]:
    """Unfreeze the recipe's trainable set of the frozen ``model`` (injecting mergeable LoRA
    into ``lora_blocks`` where the recipe has it); ``has_adapters``: the model had FlexiGPT
    adapter parameters before any injection. Returns the injected and the skipped (shared)
    linears' names.

    Raises:
        ValueError: nothing to train for the recipe, or an unknown recipe.
    """
    injected: list[str] = []
    skipped: list[str] = []
    if plan.recipe == "full":
        model.requires_grad_(True)
    elif plan.recipe == "lora":
        injected, skipped = inject_lora(model, lora_blocks, targets, rank, alpha,
                                        plan.lora_dropout)
        if not injected:
            raise ValueError(f"recipe 'lora' found no unshared nn.Linear named {targets} in "
                             "the decoder blocks")
        for name in injected:
            for p in model.get_submodule(name).parameters(recurse=False):
                p.requires_grad_(True)
    elif plan.recipe == "flexigpt":
        if not has_adapters:
            raise ValueError("recipe 'flexigpt' found no parameters named "
                             f"{FLEXIGPT_PARAMS} (no replacement/repeat blocks in this model)")
        if plan.lora_other_blocks:
            injected, skipped = inject_lora(model, lora_blocks, targets, rank, alpha,
                                            plan.lora_dropout)
        for name, p in model.named_parameters():
            if _leaf(name) in FLEXIGPT_PARAMS:
                p.requires_grad_(True)
    elif plan.recipe == "last_blocks":
        for module in _last_blocks_set(model, plan.last_blocks).values():
            module.requires_grad_(True)
    elif plan.recipe != "none":
        raise ValueError(f"unknown recipe {plan.recipe!r}")
    return injected, skipped


def _last_blocks_set(model: nn.Module, k: int | None) -> dict[str, nn.Module]:
    """``{dotted name: module}`` trained by recipe ``last_blocks``: the last ``k`` decoder
    blocks, the final norm and the LM head (reached through the architecture adapter).

    Raises:
        ValueError: ``k`` is missing, not a positive integer, or not below the model's block
            count (k ≥ the block count would train every block: that is recipe ``full``).
    """
    check_last_blocks("last_blocks", k, given=True)  # k: an integer >= 1
    assert isinstance(k, int)
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    n = len(blocks)
    if k >= n:
        raise ValueError(f"recipe 'last_blocks': last_blocks k = {k} must be below the model's "
                         f"block count ({n} decoder blocks); k >= {n} would train every block "
                         "(use recipe 'full')")
    out = {f"{adapter.layers_path}.{i}": blocks[i] for i in range(n - k, n)}
    out[adapter.final_norm_path] = adapter.final_norm(model)
    out[adapter.lm_head_path] = adapter.lm_head(model)
    return out


def _check_last_blocks_set(model: nn.Module, plan: TrainPlan) -> bool:
    """After recipe ``last_blocks``: whether the trainable set reaches the input embedding
    through a tied LM head (logged). Any other trainable parameter outside the set (a weight
    the set shares with an earlier block) is logged as a warning."""
    adapter = get_adapter(model)
    inside = tuple(f"{name}." for name in _last_blocks_set(model, plan.last_blocks))
    outside = [n for n, p in model.named_parameters(remove_duplicate=False)
               if p.requires_grad and not n.startswith(inside)]
    embed = f"{adapter.embed_path}."
    tied = [n for n in outside if n.startswith(embed)]
    if tied:
        log.info("recipe last_blocks: the LM head's weight is tied to the input embedding "
                 "(%s): training the head trains the embedding too", tied[0])
    shared = [n for n in outside if not n.startswith(embed)]
    if shared:
        log.warning("recipe last_blocks: %d trainable tensor(s) are shared with modules "
                    "outside the last %d blocks, final norm and head, and train there too "
                    "(e.g. %s)", len(shared), plan.last_blocks, shared[0])
    return bool(tied)
