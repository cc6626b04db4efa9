"""Opt-in merged-weights decode path: replacement linears with precomputed merged weights.

At batch 1 a :class:`~flexigpt.methods.sharing.SharedLoRALinear` costs the shared base
matmul plus two thin adapter matmuls (and their dispatch). :func:`merge_replacement_linears`
replaces every ``SharedLoRALinear`` of a model, in place, by a plain ``nn.Linear`` whose
weight is ``W + s·B@A`` formed once — one matmul per call, at the price of a private
``[out, in]`` weight per replacement linear (the memory the weight sharing saved comes
back: ``extra_bytes``). The bias stays shared. This is a memory/speed trade for inference
only: the merged model no longer has adapters to train, and it is never saved by the
harness. ``SharedLoRALinear`` itself is unchanged, and the self-speculative draft (which
only holds original blocks) works on a merged model as on the unmerged one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flexigpt.methods.sharing import SharedLoRALinear


def merge_replacement_linears(model: nn.Module) -> dict[str, Any]:
    """Replace every ``SharedLoRALinear`` in ``model`` by an ``nn.Linear`` of merged weight.

    Returns:
        ``{"merged": number of linears, "extra_bytes": bytes of the new weights}``.
    """
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, SharedLoRALinear)]
    extra = 0
    with torch.no_grad():
        for name, module in targets:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            base = module.base_layer
            merged = nn.Linear(base.in_features, base.out_features, bias=False,
                               device=base.weight.device, dtype=base.weight.dtype)
            merged.weight.copy_(torch.addmm(base.weight, module.lora_B, module.lora_A,
                                            alpha=module.scaling))
            if base.bias is not None:
                merged.bias = base.bias  # shared, as in the SharedLoRALinear
            merged.weight.requires_grad_(False)
            setattr(parent, child, merged)
            extra += merged.weight.numel() * merged.weight.element_size()
    return {"merged": len(targets), "extra_bytes": extra}
