"""Block surgery shared by FlexiGPT pruning and extension (and by their ``rebuild``).

A weight-shared block is an ordinary decoder block of the model's class whose linears are
:class:`SharedLoRALinear` over another block's ``nn.Linear`` objects, optionally with its
attention and MLP wrapped in :class:`OutputNorm`. The same functions build the real model
(then the adapters are initialised) and the empty skeleton for loading (zero placeholders).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import SymInt, nn

from flexigpt.core.params import count_parameters
from flexigpt.methods.sharing import OutputNorm, SharedLoRALinear
from flexigpt.methods.truncated_svd import top_svd
from flexigpt.storage.models.adapters import ArchAdapter, get_adapter

#: value used by OutputNorm as variance guard; recorded in every structure
OUTPUT_NORM_EPS = 1e-6


def default_rank(hidden_size: int) -> int:
    """r = d/16 (the paper's 256/4096 ratio), at least 1."""
    return max(1, hidden_size // 16)


def matrix_ranks(adapter: ArchAdapter, block: nn.Module, rank: int) -> dict[str, int]:
    """``{dotted linear name: min(rank, out, in)}`` for one block."""
    return {name: min(rank, *lin.weight.shape)
            for name, lin in adapter.block_linears(block).items()}


def linear_numel(adapter: ArchAdapter, block: nn.Module) -> int:
    """Weights + biases of a block's linear matrices."""
    return sum(p.numel() for lin in adapter.block_linears(block).values()
               for p in lin.parameters())


def prenorm_numel(adapter: ArchAdapter, block: nn.Module) -> int:
    """Parameters of a block's norms (``adapter.norm_names()``: the two pre-norms, plus any
    post-norms and q/k norms of the family): what ``prenorm="share"`` saves per block."""
    return sum(p.numel() for m in adapter.block_norms(block).values() for p in m.parameters())


def adapter_numel(adapter: ArchAdapter, block: nn.Module, ranks: dict[str, int]) -> int:
    """LoRA parameters a weight-shared copy of ``block`` adds: Σ r·(in + out)."""
    return sum(ranks[name] * (lin.weight.shape[0] + lin.weight.shape[1])
               for name, lin in adapter.block_linears(block).items())


def saving_per_block(model: nn.Module, ranks: dict[str, int], output_norm: bool,
                     prenorm: str) -> dict[str, int]:
    """Parameter arithmetic of replacing one block of ``model`` by a weight-shared copy
    (FlexiGPT pruning; blocks are assumed homogeneous), with LoRA ``ranks`` per linear.

    Returns ``removed`` (its linears, plus its pre-norms under ``prenorm="share"``),
    ``added`` (LoRA Σ r(in+out), plus 2·d γ's with ``output_norm``) and ``net`` = removed −
    added.

    Raises:
        ValueError: the blocks of ``model`` differ in shape.
    """
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    shapes = {tuple(p.shape for p in b.parameters()) for b in blocks}
    if len(shapes) != 1:
        raise ValueError("FlexiGPT parameter accounting needs blocks of identical shapes")
    block = blocks[0]
    removed = linear_numel(adapter, block) + (prenorm_numel(adapter, block)
                                              if prenorm == "share" else 0)
    config: Any = model.config  # an HF config: its fields vary by family
    added = adapter_numel(adapter, block, ranks) + (
        2 * config.hidden_size if output_norm else 0)
    return {"removed": removed, "added": added, "net": removed - added}


def _set_child(root: nn.Module, dotted: str, module: nn.Module) -> None:
    parent_path, _, name = dotted.rpartition(".")
    parent = root
    for part in parent_path.split(".") if parent_path else []:
        parent = getattr(parent, part)
    setattr(parent, name, module)


def _get_child(root: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def share_block(target: nn.Module, base: nn.Module, adapter: ArchAdapter, hidden_size: int,
                ranks: dict[str, int], output_norm: bool, gamma_init: float,
                share_prenorms: bool = False,
                eps: float = OUTPUT_NORM_EPS) -> dict[str, SharedLoRALinear]:
    """Turn ``target`` (in place) into a weight-shared block over ``base``'s linears.

    Every linear of ``target`` is replaced by ``SharedLoRALinear(base's linear, zeros, zeros)``
    (so ``target``'s own linears are dropped); ``share_prenorms`` makes its norms
    (``adapter.norm_names()``: the two pre-norms, plus a family's post-norms and q/k norms) the
    base's modules; ``output_norm`` wraps its attention's and MLP's residual writers
    (``adapter.writers()``: the attention and MLP modules on Llama, ``fc2`` on OPT) in
    :class:`OutputNorm`.

    Returns:
        ``{dotted linear name: SharedLoRALinear}`` for initialisation.
    """
    out: dict[str, SharedLoRALinear] = {}
    for name, lin in adapter.block_linears(base).items():
        if not isinstance(lin, nn.Linear):
            raise TypeError(f"base linear {name!r} is a {type(lin).__name__}, not nn.Linear: "
                            "a weight-shared block cannot be a base")
        w = lin.weight
        r = ranks[name]
        module = SharedLoRALinear(lin, torch.zeros(r, w.shape[1], dtype=w.dtype, device=w.device),
                                  torch.zeros(w.shape[0], r, dtype=w.dtype, device=w.device))
        _set_child(target, name, module)
        out[name] = module
    if share_prenorms:
        for name, norm in adapter.block_norms(base).items():
            _set_child(target, name, norm)
    if output_norm:
        for sub in adapter.writers():
            _set_child(target, sub, OutputNorm(_get_child(target, sub), hidden_size, gamma_init,
                                               eps))
    return out


def repeat_shell(block: nn.Module, adapter: ArchAdapter, config: object) -> nn.Module:
    """A deep copy of ``block`` that *shares* its linears (and the model config).

    Norms and any other parameters are copied; the linears are the same objects, ready to be
    wrapped by :func:`share_block` (with ``base=block``).
    """
    memo: dict[int, object] = {id(config): config}
    for lin in adapter.block_linears(block).values():
        memo[id(lin)] = lin
    return copy.deepcopy(block, memo)


@torch.no_grad()
def init_svd_(module: SharedLoRALinear, pruned_weight: torch.Tensor,
              svd_dtype: torch.dtype = torch.float32, solver: str = "exact") -> float:
    """FlexiGPT Eq. 7–8: ``lora_B = U_r Σ_r``, ``lora_A = V_r^T`` of ``W_pruned − W_base``
    (the top-r factors by ``solver``: :mod:`flexigpt.methods.truncated_svd`).

    Requires ``module.scaling == 1`` semantics (the product is the rank-r truncation).

    Returns:
        Relative residual ``||Δ − B A||_F / ||Δ||_F`` (0 when Δ = 0 or r is full).
    """
    base = module.base_layer.weight
    delta = pruned_weight.to(svd_dtype) - base.to(svd_dtype)
    top = top_svd(delta, module.rank, solver)
    module.lora_B.copy_((top.u * top.s) / module.scaling)
    module.lora_A.copy_(top.vh)
    total = float(top.energy)
    return math.sqrt(float(top.tail) / total) if total > 0 else 0.0


@torch.no_grad()
def init_standard_(module: SharedLoRALinear) -> None:
    """PEFT's default LoRA init: ``lora_A`` Kaiming-uniform (a=√5), ``lora_B`` zero."""
    nn.init.kaiming_uniform_(module.lora_A, a=math.sqrt(5))
    nn.init.zeros_(module.lora_B)


def sharing_summary(model: nn.Module) -> dict[str, int]:
    """Parameter counts of the weight-sharing parts (for manifests).

    Keys: ``unique`` (``count_parameters``: shared storage once), ``adapters`` (all
    ``lora_A``/``lora_B``), ``output_norms`` (all ``gamma``), ``shared_linears`` (unique
    base linear parameters that weight-shared blocks reuse, counted once).
    """
    adapters = gammas = 0
    shared: dict[tuple[int, int | SymInt], int] = {}
    for module in model.modules():
        if isinstance(module, SharedLoRALinear):
            adapters += module.lora_A.numel() + module.lora_B.numel()
            for p in module.base_layer.parameters():
                shared[(p.untyped_storage().data_ptr(), p.storage_offset())] = p.numel()
        elif isinstance(module, OutputNorm):
            gammas += module.gamma.numel()
    return {"unique": count_parameters(model), "adapters": adapters, "output_norms": gammas,
            "shared_linears": sum(shared.values())}


def largest_useful_rank(adapter: ArchAdapter, block: nn.Module, added_fixed: int = 0,
                        removed_fixed: int = 0) -> int:
    """The largest LoRA rank at which a weight-shared copy of ``block`` is still smaller than
    the block's own linears (0 when no rank is): Σ min(r, out, in)·(in + out) + ``added_fixed``
    < linears + ``removed_fixed``. The adapter size only grows with r (binary search)."""
    removed = linear_numel(adapter, block) + removed_fixed
    full = max(min(lin.weight.shape) for lin in adapter.block_linears(block).values())

    def net(r: int) -> int:
        added = adapter_numel(adapter, block, matrix_ranks(adapter, block, r))
        return removed - added - added_fixed

    lo, hi = 0, full  # net(lo) > 0 invariant (r = 0: nothing added)
    if net(0) <= 0:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if net(mid) > 0:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_rank(adapter: ArchAdapter, block: nn.Module, rank: int, hidden_size: int,
               output_norm: bool, prenorm: str = "copy") -> None:
    """Raise ``ValueError`` (naming the largest useful rank) when replacement blocks of
    ``rank`` would not be smaller than the linears they replace (achieved ratio ≤ 0)."""
    added = 2 * hidden_size if output_norm else 0
    removed = prenorm_numel(adapter, block) if prenorm == "share" else 0
    best = largest_useful_rank(adapter, block, added, removed)
    if rank > best:
        if best == 0:
            raise ValueError(f"rank {rank}: no LoRA rank makes a replacement block smaller than "
                             "the block it replaces in this model")
        raise ValueError(
            f"rank {rank} is too large to compress: a replacement block's adapters would be at "
            f"least as large as the linears they replace (the model would not shrink); the "
            f"largest useful rank for this model is {best}")


def check_flexigpt_rank(model: nn.Module, cfg: object) -> None:
    """:func:`check_rank` for a FlexiGPT pruning config (``rank`` None → hidden/16) on
    ``model``, and its ``distance_rank`` (when set) against the largest matrix rank of a
    block, before any work. Called by ``flexigpt.api.compression.compress`` and the DAG's config check."""
    adapter = get_adapter(model)
    config: Any = model.config  # an HF config: its fields vary by family
    hidden = config.hidden_size
    block = adapter.layers(model)[0]
    rank = getattr(cfg, "rank", None) or default_rank(hidden)
    check_rank(adapter, block, rank, hidden, getattr(cfg, "output_norm", True),
               getattr(cfg, "prenorm", "copy"))
    check_distance_rank(model, cfg)


def rank_problem(model: nn.Module, cfg: object) -> tuple[str, str] | None:
    """The ``check_sizes`` hook of FlexiGPT pruning: ``("distance_rank" | "rank", problem)``
    when :func:`check_distance_rank` or :func:`check_flexigpt_rank` refuses ``cfg``."""
    try:
        check_distance_rank(model, cfg)
    except ValueError as err:
        return "distance_rank", str(err)
    try:
        check_flexigpt_rank(model, cfg)
    except ValueError as err:
        return "rank", str(err)
    return None


def check_distance_rank(model: nn.Module, cfg: object) -> None:
    """Raise ``ValueError`` (naming the largest useful value) when ``cfg.distance_rank`` is
    above the rank of every linear of a block of ``model`` (it would be clamped)."""
    distance_rank = getattr(cfg, "distance_rank", None)
    if distance_rank is None:
        return
    adapter = get_adapter(model)
    block = adapter.layers(model)[0]
    full = max(min(lin.weight.shape) for lin in adapter.block_linears(block).values())
    if distance_rank > full:
        raise ValueError(f"distance_rank {distance_rank} exceeds the rank of every linear of a "
                         f"block (largest min(out, in) = {full}); the largest useful "
                         f"distance_rank for this model is {full}")
