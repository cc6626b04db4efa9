"""FlexiGPT's recovery recipe (``flexigpt``): train the replacement/repeat blocks' adapters.

The trainable set is every parameter named ``lora_A``, ``lora_B`` (of
:class:`~flexigpt.methods.sharing.SharedLoRALinear`) and ``gamma`` (of
:class:`~flexigpt.methods.sharing.OutputNorm`); everything else stays frozen. With
``lora_other_blocks`` the blocks without adapters also get mergeable LoRA
(:mod:`flexigpt.methods.lora`), sized by ``lora_budget`` when one is set (the adapters count
towards it). Its facts are declared in the registry (``MethodFacts.recipes``); the shared
trainer applies it through :class:`~flexigpt.storage.recipe_facts.TrainableSet`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from flexigpt.methods.lora import inject_lora
from flexigpt.methods.sharing import ADAPTER_PARAMS, adapter_trainable
from flexigpt.storage.recipe_facts import TrainableSet


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _has_adapters(module: nn.Module) -> bool:
    return any(_leaf(n) in ADAPTER_PARAMS for n, _ in module.named_parameters())


class AdapterRecipe(TrainableSet):
    """FlexiGPT's adapters, and optionally LoRA on the other blocks."""

    def lora_blocks(self, blocks: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
        """The blocks without FlexiGPT adapters (``lora_other_blocks`` puts LoRA there)."""
        return [(p, b) for p, b in blocks if not _has_adapters(b)]

    def fixed_trainable(self, model: nn.Module) -> int:
        """The adapters' parameter count (a ``lora_budget`` includes them)."""
        return adapter_trainable(model)

    def unfreeze(self, model: nn.Module, plan: Any, lora_blocks: list[tuple[str, nn.Module]],
                 targets: tuple[str, ...], rank: int,
                 alpha: float) -> tuple[list[str], list[str]]:
        if not _has_adapters(model):
            raise ValueError("recipe 'flexigpt' found no parameters named "
                             f"{ADAPTER_PARAMS} (no replacement/repeat blocks in this model)")
        injected: list[str] = []
        skipped: list[str] = []
        if plan.lora_other_blocks:
            injected, skipped = inject_lora(model, lora_blocks, targets, rank, alpha,
                                            plan.lora_dropout)
        for name, p in model.named_parameters():
            if _leaf(name) in ADAPTER_PARAMS:
                p.requires_grad_(True)
        return injected, skipped


RECIPE = AdapterRecipe()
