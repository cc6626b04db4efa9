"""What FlexiGPT's two methods (pruning, extension) tell the export, the model card and the
decoder about a saved model: their :class:`flexigpt.storage.registry.Method` hooks ``plain``,
``card_lines`` and ``draft_skip`` (the registry's docstring states each contract).

Weight-shared blocks have a stock form only without output norms, and only by storing every
block's merged weight ``W_base + B·A`` again (``--unshare``): the export then has the dense
model's parameter count.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import torch
from torch import nn

from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.registry import NotExportable


def unshare_(model: nn.Module) -> int:
    """Replace every ``SharedLoRALinear`` by a merged ``nn.Linear`` and give modules that
    several blocks share their own copies (in place). Returns the number merged."""
    merged = 0
    seen: set[int] = set()
    for block in get_adapter(model).layers(model):
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, OutputNorm):
                    raise NotExportable("an output norm is present")  # checked before
                if isinstance(child, SharedLoRALinear):
                    base = child.base_layer
                    lin = nn.Linear(base.in_features, base.out_features,
                                    bias=base.bias is not None, dtype=base.weight.dtype,
                                    device=base.weight.device)
                    with torch.no_grad():
                        w = base.weight.float() + child.delta_weight().float()
                        lin.weight.copy_(w.to(base.weight.dtype))
                        if base.bias is not None:
                            lin.bias.copy_(base.bias)
                    setattr(parent, name, lin)
                    merged += 1
        for name, child in list(block.named_children()):  # shared pre-norms
            if id(child) in seen:
                setattr(block, name, copy.deepcopy(child))
            seen.add(id(child))
    return merged


def _plain_shared(loaded: Any, unshare: bool, n_shared: int) -> tuple[nn.Module, str]:
    """The ``plain`` hook of both methods; ``n_shared`` weight-shared blocks."""
    manifest = loaded.manifest
    method = manifest.method
    if manifest.structure.get("output_norm"):
        raise NotExportable(
            f"{method} output norm: the attention and MLP outputs of {n_shared} weight-shared "
            "blocks go through a mean-centring LayerNorm × γ, which a stock decoder layer "
            "does not have; no plain checkpoint computes the same function (models "
            "compressed with output_norm=false can be exported with --unshare)")
    if not unshare:
        raise NotExportable(
            f"{method} blocks share their base block's linears (W_base + B·A); a plain "
            "checkpoint must store every block's merged weight, which gives up the "
            f"compression (the export would have the dense model's "
            f"{manifest.parameters.dense} parameters). Pass --unshare to write it anyway")
    model = copy.deepcopy(loaded.model)
    merged = unshare_(model)
    return model, f"un-shared: {merged} shared linears merged (W_base + B·A)"


def plain_pruned(loaded: Any, unshare: bool) -> tuple[nn.Module, str]:
    """``plain`` of a FlexiGPT-pruned model."""
    return _plain_shared(loaded, unshare, len(loaded.manifest.structure.get("base_map") or {}))


def plain_extended(loaded: Any, unshare: bool) -> tuple[nn.Module, str]:
    """``plain`` of a FlexiGPT-extended model."""
    s = loaded.manifest.structure
    return _plain_shared(loaded, unshare,
                         len(s.get("layout", [])) - int(s.get("original_layers", 0)))


def card_pruned(manifest: Any) -> list[str]:
    """``card_lines`` of a FlexiGPT-pruned model."""
    s = manifest.structure
    pairs = ", ".join(f"{i}←{j}" for i, j in sorted((s.get("base_map") or {}).items(),
                                                     key=lambda kv: int(kv[0])))
    return [f"- replaced blocks ← the base block whose linears they share: {pairs}",
            f"- LoRA ranks per linear: {json.dumps(s.get('ranks'))}",
            f"- output norm (LayerNorm·γ on attention/MLP outputs): {s.get('output_norm')}",
            f"- pre-norms of replaced blocks: {s.get('prenorm')}"]


def card_extended(manifest: Any) -> list[str]:
    """``card_lines`` of a FlexiGPT-extended model."""
    s = manifest.structure
    return [f"- {s.get('original_layers')} → {len(s.get('layout') or [])} blocks; source "
            f"block of every position: {s.get('layout')}",
            f"- LoRA ranks per linear: {json.dumps(s.get('ranks'))}",
            f"- output norm on repeats: {s.get('output_norm')}"]


def draft_skip_pruned(structure: dict[str, Any]) -> list[int]:
    """``draft_skip`` of a FlexiGPT-pruned model: the replacement blocks."""
    return sorted({int(i) for i in structure.get("base_map", {})}
                  | {int(i) for i in structure.get("pruned_blocks", [])})


def draft_skip_extended(structure: dict[str, Any]) -> list[int]:
    """``draft_skip`` of a FlexiGPT-extended model: every repeat after a block's first use."""
    seen: set[int] = set()
    skip = []
    for pos, src in enumerate(structure["layout"]):
        if src in seen:
            skip.append(pos)
        seen.add(src)
    return skip
