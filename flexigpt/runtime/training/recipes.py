"""Trainable-set recipes: which parameters recovery training updates.

:func:`apply_recipe` asks the plan's recipe (:data:`flexigpt.runtime.training.recipe_table.RECIPE_FACTS`,
a :class:`~flexigpt.storage.recipe_facts.RecipeFacts`) for its trainable set and never names
a method. The trainer's own recipes are implemented here:

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

A method's own recipe lives in its folder (FlexiGPT's adapters:
:mod:`flexigpt.methods.flexigpt.recipe`).
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
from flexigpt.runtime.training.config import TrainPlan, check_last_blocks
from flexigpt.runtime.training.recipe_table import RECIPE_FACTS
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.recipe_facts import TrainableSet

log = logging.getLogger(__name__)

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


def apply_recipe(model: nn.Module, plan: TrainPlan) -> RecipeReport:
    """Freeze ``model`` except the recipe's trainable set (injecting LoRA where needed).

    Raises:
        ValueError: the recipe finds nothing to train (e.g. ``flexigpt`` on a model without
            replacement adapters, or ``lora`` on a model whose linears are all shared).
    """
    adapter = get_adapter(model)
    trainable_set = RECIPE_FACTS[plan.recipe].trainable_set()
    model.requires_grad_(False)
    targets = plan.lora_targets or tuple(dict.fromkeys(adapter.attn_linears
                                                       + adapter.mlp_linears))
    blocks = [(f"{adapter.layers_path}.{i}", b) for i, b in enumerate(adapter.layers(model))]
    lora_blocks = trainable_set.lora_blocks(blocks)
    rank, alpha, budget = plan.lora_rank, plan.lora_alpha, None
    if plan.lora_budget is not None:
        rank, alpha, budget = _budget_rank(model, plan, plan.lora_budget, lora_blocks, targets,
                                           trainable_set.fixed_trainable(model))
    injected, skipped = trainable_set.unfreeze(model, plan, lora_blocks, targets, rank, alpha)
    tied = trainable_set.tied_embedding(model, plan)
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
        budget=budget,
        last_blocks=plan.last_blocks if RECIPE_FACTS[plan.recipe].last_blocks else None,
        tied_embedding=tied)
    if budget is not None and budget["achieved"] != trainable:
        raise RuntimeError(f"budget arithmetic predicted {budget['achieved']:,} trainable "
                           f"parameters, the model has {trainable:,}")
    log.info("recipe %s: %s trainable / %s frozen parameters, %d LoRA module(s) injected",
             plan.recipe, f"{trainable:,}", f"{report.frozen_parameters:,}", len(injected))
    return report


def _budget_rank(model: nn.Module, plan: TrainPlan, target: int,
                 lora_blocks: list[tuple[str, nn.Module]], targets: tuple[str, ...],
                 fixed: int) -> tuple[int, float, dict[str, Any]]:
    """``(rank, alpha, budget record)`` of the mergeable LoRA whose trainable count (with the
    ``fixed`` parameters the recipe trains besides, e.g. FlexiGPT's adapters) is nearest
    ``target`` (``plan.lora_budget``); α is scaled to keep the LoRA scaling α/r. Logs a
    warning beyond :data:`BUDGET_TOLERANCE`."""
    per_rank = lora_params_per_rank(lora_candidates(model, lora_blocks, targets)[0])
    smallest = fixed + per_rank
    if target < smallest and (smallest - target) / target > BUDGET_TOLERANCE:
        raise ValueError(f"lora budget {target:,} is below the smallest trainable set of this "
                         f"model: {smallest:,} parameters (LoRA rank 1"
                         + (" + the method's own adapters)" if fixed else ")"))
    rank = rank_for_budget(target, fixed, per_rank)
    alpha = plan.lora_alpha * rank / plan.lora_rank  # keep the LoRA scaling α/r
    achieved = fixed + rank * per_rank
    budget = {"target": target, "achieved": achieved, "rank": rank,
              "rel_error": round((achieved - target) / target, 6)}
    if abs(budget["rel_error"]) > BUDGET_TOLERANCE:
        log.warning("trainable budget %d met only to %.2f%% (%d at rank %d)",
                    target, 100 * budget["rel_error"], achieved, rank)
    return rank, alpha, budget


class _Full(TrainableSet):
    """``full``: every parameter."""

    def unfreeze(self, model: nn.Module, plan: Any, lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...], rank: int,
                 alpha: float) -> tuple[list[str], list[str]]:
        model.requires_grad_(True)
        return [], []


class _Lora(TrainableSet):
    """``lora``: mergeable LoRA on the target linears of every decoder block."""

    def unfreeze(self, model: nn.Module, plan: Any, lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...], rank: int,
                 alpha: float) -> tuple[list[str], list[str]]:
        injected, skipped = inject_lora(model, lora_blocks, targets, rank, alpha,
                                        plan.lora_dropout)
        if not injected:
            raise ValueError(f"recipe 'lora' found no unshared nn.Linear named {targets} in "
                             "the decoder blocks")
        for name in injected:
            for p in model.get_submodule(name).parameters(recurse=False):
                p.requires_grad_(True)
        return injected, skipped


class _Nothing(TrainableSet):
    """``none``: nothing trains."""

    def unfreeze(self, model: nn.Module, plan: Any, lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...], rank: int,
                 alpha: float) -> tuple[list[str], list[str]]:
        return [], []


class _LastBlocks(TrainableSet):
    """``last_blocks``: the last k blocks, the final norm and the LM head."""

    def unfreeze(self, model: nn.Module, plan: Any, lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...], rank: int,
                 alpha: float) -> tuple[list[str], list[str]]:
        for module in _last_blocks_set(model, plan.last_blocks).values():
            module.requires_grad_(True)
        return [], []

    def tied_embedding(self, model: nn.Module, plan: Any) -> bool:
        return _check_last_blocks_set(model, plan)


FULL, LORA, NONE, LAST_BLOCKS = _Full(), _Lora(), _Nothing(), _LastBlocks()


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
