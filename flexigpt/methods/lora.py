"""The trainer's own mergeable LoRA for ordinary ``nn.Linear`` layers.

Recovery LoRA (ShortGPT+LoRA, SliceGPT RFT, LLM-Pruner, FlexiGPT's optional LoRA on unpruned
blocks) is trained on top of frozen linears and merged back (``W ← W + α/r · B A``) before
saving, so the saved model keeps its method's structure. A small wrapper is used instead of
PEFT so that module paths (``model.layers.i...``), the architecture adapters and
``state_dict`` keys stay unchanged after merging, and so FlexiGPT's own
``SharedLoRALinear`` wrappers are never wrapped a second time.

Linears whose weight is shared with another module (FlexiGPT base blocks whose weights also
serve replacement blocks) are never given mergeable LoRA: merging into a shared weight would
silently change every block that shares it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class RecoveryLoRALinear(nn.Module):
    """``y = base(x) + α/r · dropout(x) Aᵀ Bᵀ`` with ``lora_A [r, in]``, ``lora_B [out, r]``.

    Initialisation as in PEFT: ``lora_A`` Kaiming-uniform, ``lora_B`` zeros (ΔW = 0).
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.base_layer = base
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        kwargs: dict[str, Any] = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kwargs))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **kwargs))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def get_base_layer(self) -> nn.Linear:
        return self.base_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        delta = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return self.base_layer(x) + delta * self.scaling

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """Add ``α/r · B A`` (computed in fp32) into the base weight; return the base."""
        weight = self.base_layer.weight
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling
        weight.copy_((weight.float() + delta).to(weight.dtype))
        return self.base_layer


def is_wrapper(module: nn.Module) -> bool:
    """A LoRA-style wrapper (ours, FlexiGPT's ``SharedLoRALinear``, PEFT's layers)."""
    return hasattr(module, "get_base_layer") or hasattr(module, "base_layer")


def shared_weight_counts(model: nn.Module) -> Counter[int]:
    """How many linear modules (counted with repeats) use each weight storage."""
    counts: Counter[int] = Counter()
    for _, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, nn.Linear):
            counts[module.weight.data_ptr()] += 1
    return counts


def lora_candidates(model: nn.Module, blocks: list[tuple[str, nn.Module]],
                    targets: tuple[str, ...]) -> tuple[list[tuple[str, nn.Linear]], list[str]]:
    """The linears :func:`inject_lora` would wrap, without wrapping them.

    Args:
        model: the whole model (used to detect weights shared between modules).
        blocks: ``(prefix, block)`` pairs; prefix is the block's dotted path in ``model``.
        targets: short module names (last path component) to wrap.

    Returns:
        ``([(dotted name, linear)], skipped_shared)``. Modules inside an existing wrapper
        (e.g. a ``SharedLoRALinear``'s ``base_layer``) are left out silently; linears whose
        weight serves another module too are listed in ``skipped_shared``.
    """
    counts = shared_weight_counts(model)
    found: list[tuple[str, nn.Linear]] = []
    skipped: list[str] = []
    for prefix, block in blocks:
        wrapped_prefixes = [n for n, m in block.named_modules() if n and is_wrapper(m)]
        for name, module in list(block.named_modules()):
            if name.rsplit(".", 1)[-1] not in targets or type(module) is not nn.Linear:
                continue
            if any(name.startswith(w + ".") for w in wrapped_prefixes):
                continue
            full = f"{prefix}.{name}"
            if counts[module.weight.data_ptr()] > 1:
                skipped.append(full)
            else:
                found.append((full, module))
    return found, skipped


def lora_params_per_rank(candidates: list[tuple[str, nn.Linear]]) -> int:
    """Σ (in + out) over the candidates: trainable LoRA parameters per unit of rank."""
    return sum(lin.in_features + lin.out_features for _, lin in candidates)


def rank_for_budget(budget: int, fixed: int, per_rank: int) -> int:
    """The rank r ≥ 1 whose ``fixed + r · per_rank`` is nearest to ``budget`` (ties: smaller).

    Raises:
        ValueError: nothing to put LoRA on, or ``fixed`` alone already exceeds ``budget``.
    """
    if per_rank <= 0:
        raise ValueError("no linear can take a mergeable LoRA, so no rank meets the budget")
    if fixed >= budget:
        raise ValueError(f"the fixed trainable parameters ({fixed:,}) already reach the "
                         f"budget ({budget:,}): no room for LoRA")
    low = max(1, (budget - fixed) // per_rank)
    return min((low, low + 1), key=lambda r: (abs(fixed + r * per_rank - budget), r))


def inject_lora(model: nn.Module, blocks: list[tuple[str, nn.Module]], targets: tuple[str, ...],
                rank: int, alpha: float, dropout: float) -> tuple[list[str], list[str]]:
    """Wrap the target linears of ``blocks`` (:func:`lora_candidates`) with
    :class:`RecoveryLoRALinear`; returns ``(injected, skipped_shared)`` dotted names."""
    found, skipped = lora_candidates(model, blocks, targets)
    for full, module in found:
        parent_name, _, child = full.rpartition(".")
        setattr(model.get_submodule(parent_name), child,
                RecoveryLoRALinear(module, rank, alpha, dropout))
    return [full for full, _ in found], skipped


def merge_lora(model: nn.Module) -> int:
    """Replace every :class:`RecoveryLoRALinear` by its merged base linear; return the count."""
    wrappers = [(n, m) for n, m in model.named_modules() if isinstance(m, RecoveryLoRALinear)]
    for name, wrapper in wrappers:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, wrapper.merge())
    return len(wrappers)


def lora_rank_problem(model: Any, cfg: Any, option: str) -> tuple[str, str] | None:
    """``(option, problem)`` when the LoRA rank option ``option`` of ``cfg`` is not below
    ``model``'s hidden size (ranks are clamped per matrix, so it buys nothing); else None."""
    value = getattr(cfg, option, None)
    hidden = int(model.config.hidden_size)
    if isinstance(value, int) and value >= hidden:
        return option, (f"{option} {value} is not below the model's hidden size {hidden} "
                        f"(LoRA ranks are clamped per matrix); the largest useful "
                        f"{option} is {hidden - 1}")
    return None


def lora_recovery(adapter: Any) -> dict[str, Any]:
    """``info["recovery"]`` of a method whose recovered variant trains LoRA on every attention
    and MLP linear of the remaining blocks (rank set by the DAG's ``budget`` to FlexiGPT's
    trainable count, as for ShortGPT + LoRA); read only when a run sets ``recovery: true``."""
    from flexigpt.storage.registry import RecoveryRecipe

    return RecoveryRecipe("lora", lora_targets=tuple(
        dict.fromkeys(adapter.attn_linears + adapter.mlp_linears))).to_dict()
