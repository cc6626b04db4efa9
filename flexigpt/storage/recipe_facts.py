"""What a recovery recipe is, for the shared trainer that knows no method.

A recipe says which parameters recovery training updates. Its facts (:class:`RecipeFacts`:
name, default learning rate, the grid keys a tuning sweep may vary, which options apply) are
light and importable anywhere; its behaviour (:class:`TrainableSet`: unfreeze the model,
inject LoRA where it has one) loads from ``implementation`` when a model is trained.

The trainer's own recipes (``lora``, ``full``, ``none``, ``last_blocks``) are declared in
:mod:`flexigpt.runtime.training.config`; a method that brings a recipe of its own declares
it in its registry facts (``MethodFacts.recipes``, e.g. FlexiGPT's adapters), with its
implementation in the method's folder. The trainer asks the recipe; it never compares a
recipe's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flexigpt.storage.targets import load_target

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class RecipeFacts:
    """One recovery recipe's facts.

    Attributes:
        name: its key (config ``recipe``, a ``tuning.grid`` key, ``info.recovery.recipe``).
        default_lr: peak learning rate when neither the config nor the manifest sets one.
        grid_keys: the learning-rate fields a tuning grid may sweep for it (``lr`` first).
        own_lrs: learning-rate fields beyond ``lr`` its trainable set uses (e.g.
            ``gamma_lr`` of FlexiGPT's output norms): recorded per tuning trial and run,
            None for every other recipe.
        lora: it injects mergeable LoRA into the decoder blocks (``lora_budget`` sizes it).
        other_blocks: its LoRA is optional, on the blocks outside the method's own adapters
            (``lora_other_blocks``); a ``lora_budget`` needs that LoRA switched on.
        last_blocks: it trains the last k blocks (``last_blocks`` k required).
        trains: False for the recipe that leaves the model unchanged (no training loop).
        implementation: ``"module:attribute"`` of its :class:`TrainableSet`.
    """

    name: str
    default_lr: float
    implementation: str
    grid_keys: tuple[str, ...] = ("lr",)
    own_lrs: tuple[str, ...] = ()
    lora: bool = False
    other_blocks: bool = False
    last_blocks: bool = False
    trains: bool = True

    def trainable_set(self) -> TrainableSet:
        """Its implementation, imported on first use."""
        found = load_target(self.implementation)
        if not isinstance(found, TrainableSet):
            raise TypeError(f"recipe {self.name!r}: {self.implementation} is not a TrainableSet")
        return found


class TrainableSet:
    """How a recipe unfreezes a frozen model (every parameter ``requires_grad=False`` when
    :meth:`unfreeze` is called). Subclasses override :meth:`unfreeze` and, where they differ
    from the defaults, the other hooks."""

    def lora_blocks(self, blocks: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
        """The ``(dotted name, block)`` pairs its LoRA may go into (default: every block)."""
        return blocks

    def fixed_trainable(self, model: nn.Module) -> int:
        """Trainable parameters it adds besides its LoRA (a ``lora_budget`` counts them)."""
        return 0

    def unfreeze(self, model: nn.Module, plan: Any, lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...], rank: int,
                 alpha: float) -> tuple[list[str], list[str]]:
        """Unfreeze the trainable set of ``model`` for ``plan`` (a resolved ``TrainPlan``),
        injecting mergeable LoRA of ``rank``/``alpha`` into ``targets`` of ``lora_blocks``
        where the recipe has LoRA. Returns the injected and the skipped (shared) linears.

        Raises:
            ValueError: nothing to train on this model (the message names the recipe).
        """
        raise NotImplementedError

    def tied_embedding(self, model: nn.Module, plan: Any) -> bool:
        """After :meth:`unfreeze`: whether training reaches the input embedding through a
        tied LM head (recorded in the report)."""
        return False
