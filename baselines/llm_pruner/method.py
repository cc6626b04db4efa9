"""LLM-Pruner block-wise (Element¹, sum aggregation, local ranking) as a registry method.

Pipeline: (1) choose per-layer removal counts from the config (``"paper"``: LLM-Pruner's group
``pruning_ratio``; ``"matched"``: searched so the whole-model parameter reduction hits
``ratio``), analytically and before any gradient work; (2) first-order Taylor importance
from a backward pass over the calibration windows (``importance.py``); (3) in every pruned
layer remove the lowest-importance attention groups and FFN channels (``surgery.py``).

Removal counts follow LLM-Pruner's rule for a module of C prunable channels in units of u
channels and group fraction f: ``(C − int(C·(1−f))) // u`` units. Attention: C = n_kv·head_dim,
u = head_dim (whole KV groups, see ``surgery``); FFN: C = intermediate, u = 1.

``"matched"`` search: first the common fraction f (heads and FFN alike, as in LLM-Pruner)
whose achieved reduction is nearest to ``ratio``; then, with that head count fixed, the FFN
fraction is re-solved to the nearest reduction (attention groups are coarse — one KV group
of SmolLM2-135M is ≈5 % of the model over 24 layers — so a common fraction alone can miss
the target by several points). Both fractions are recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from baselines.llm_pruner.config import LLMPrunerConfig
from baselines.llm_pruner.importance import group_importance
from baselines.llm_pruner.surgery import apply_structure, head_dim_of, prune_block, structure_of
from flexigpt.core.params import count_parameters
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import ArchAdapter, get_adapter
from flexigpt.storage.registry import CompressionResult, Method, NotExportable, RecoveryRecipe

log = logging.getLogger(__name__)

#: The paper's recovery recipe (official ``post_training.py``: LoRA r 8, α 16, dropout
#: 0.05, lr 1e-4 on every attention and MLP linear), for the shared trainer; the targets
#: come from the architecture adapter (:func:`recovery_recipe`).
RECOVERY = RecoveryRecipe("lora", lr=1e-4, lora_rank=8, lora_alpha=16.0, lora_dropout=0.05)


def recovery_recipe(adapter: ArchAdapter) -> dict[str, Any]:
    """``info["recovery"]`` read by ``flexigpt.runtime.training.config.resolve_plan``: :data:`RECOVERY`
    with ``targets`` = the adapter's attention and MLP linears (short names)."""
    targets = tuple(dict.fromkeys(adapter.attn_linears + adapter.mlp_linears))
    return dataclasses.replace(RECOVERY, lora_targets=targets).to_dict()


@dataclass(frozen=True)
class LayerCost:
    """Prunable units of one layer and the parameters each unit carries."""

    n_kv: int  # attention groups (KV heads)
    group_params: int  # parameters removed with one group (q/k/v rows + o columns + biases)
    n_ffn: int  # FFN channels
    channel_params: int  # parameters removed with one channel
    head_dim: int

    def groups_removed(self, f: float) -> int:
        c = self.n_kv * self.head_dim
        return (c - int(round(c * (1.0 - f), 9))) // self.head_dim

    def channels_removed(self, f: float) -> int:
        return self.n_ffn - int(round(self.n_ffn * (1.0 - f), 9))


def layer_cost(model: nn.Module, block: nn.Module, head_dim: int) -> LayerCost:
    """Parameter arithmetic of one block (counts exactly what ``prune_block`` removes)."""
    adapter = get_adapter(model)
    q, k, v, o, down = (adapter.linear(block, role) for role in ("q", "k", "v", "o", "down"))
    ins = [adapter.linear(block, role) for role in adapter.mlp_in_roles()]
    n_kv = k.out_features // head_dim
    g = q.out_features // head_dim // n_kv

    def row(m: nn.Linear) -> int:
        return m.in_features + (m.bias is not None)

    group = g * head_dim * (row(q) + o.out_features) + head_dim * (row(k) + row(v))
    return LayerCost(n_kv, group, down.in_features, sum(row(m) for m in ins) + down.out_features,
                     head_dim)


def _bisect(fn: Callable[[float], float], target: float, steps: int = 60) -> list[float]:
    """For non-decreasing ``fn`` on [0, 1): the f just below and at the crossing of target."""
    lo, hi = 0.0, 1.0 - 1e-9
    if fn(hi) < target:
        return [hi]
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fn(mid) < target else (lo, mid)
    return [lo, hi]


def plan(costs: list[LayerCost], dense: int, cfg: LLMPrunerConfig) -> dict[str, Any]:
    """Per-layer removal counts for ``cfg`` over the pruned layers' ``costs``.

    Raises:
        ValueError: the setting removes every head/channel of a layer, or (``"matched"``)
            the target is not reachable within ``tolerance``.
    """
    def counts(fh: float, ff: float) -> tuple[list[int], list[int]]:
        return [c.groups_removed(fh) for c in costs], [c.channels_removed(ff) for c in costs]

    def ratio(fh: float, ff: float) -> float:
        g, ch = counts(fh, ff)
        return sum(n * c.group_params + m * c.channel_params
                   for n, m, c in zip(g, ch, costs)) / dense

    def valid(fh: float, ff: float) -> bool:
        g, ch = counts(fh, ff)
        return all(n < c.n_kv and m < c.n_ffn for n, m, c in zip(g, ch, costs))

    if cfg.policy == "paper":
        fh = ff = cfg.ratio
        if not valid(fh, ff):
            raise ValueError(f"ratio {cfg.ratio} with policy 'paper' would remove every "
                             "attention head (or every FFN channel) of a pruned layer; "
                             "use a smaller ratio")
    else:
        cands = [f for f in _bisect(lambda f: ratio(f, f), cfg.ratio) if valid(f, f)] or [0.0]
        fh = min(cands, key=lambda f: abs(ratio(f, f) - cfg.ratio))
        cands = [f for f in _bisect(lambda f: ratio(fh, f), cfg.ratio) if valid(fh, f)]
        ff = min(cands or [fh], key=lambda f: abs(ratio(fh, f) - cfg.ratio))
        if abs(ratio(fh, ff) - cfg.ratio) > cfg.tolerance:
            most = sum((c.n_kv - 1) * c.group_params + (c.n_ffn - 1) * c.channel_params
                       for c in costs) / dense
            raise ValueError(
                f"ratio {cfg.ratio} is not reachable within ±{cfg.tolerance}: the nearest "
                f"achievable is {ratio(fh, ff):.4f} (at most {most:.4f} can be removed from "
                f"the {len(costs)} pruned layers without removing every head or channel)")
    g, ch = counts(fh, ff)
    return {"head_fraction": fh, "ffn_fraction": ff, "groups_removed": g,
            "channels_removed": ch, "expected_ratio": ratio(fh, ff)}


def _keep(scores: torch.Tensor, n_remove: int) -> torch.Tensor:
    """Indices (ascending) left after removing the ``n_remove`` lowest scores (ties: low index)."""
    order = torch.argsort(scores, stable=True)
    return order[n_remove:].sort().values


def compress(model: nn.Module, tokenizer: Any, calibration: Any,
             cfg: LLMPrunerConfig) -> CompressionResult:
    """Prune attention groups and FFN channels in place. ``calibration``: ``[N, T]`` ids.
    Llama-family (gated MLP, grouped KV heads) and OPT (MHA, fc1/fc2 with biases) models;
    others raise ``UnsupportedArchitectureError``."""
    METHOD.check_family(model)
    if calibration is None:
        raise ValueError("LLM-Pruner needs calibration windows for its Taylor importance")
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    start, end = cfg.layer_range(len(blocks))
    layers = list(range(start, end))
    head_dim = head_dim_of(model)
    dense = count_parameters(model)
    costs = [layer_cost(model, blocks[i], head_dim) for i in layers]
    chosen = plan(costs, dense, cfg)
    windows = calibration if cfg.n_windows is None else calibration[:cfg.n_windows]
    t0 = time.perf_counter()
    scores, loss = group_importance(model, windows, layers, head_dim, cfg.batch_size)
    t1 = time.perf_counter()
    removed_groups: dict[str, list[int]] = {}
    for i, n_g, n_c in zip(layers, chosen["groups_removed"], chosen["channels_removed"]):
        keep_g = _keep(scores[i]["attn"], n_g)
        keep_c = _keep(scores[i]["ffn"], n_c)
        removed_groups[str(i)] = sorted(set(range(len(scores[i]["attn"]))) - set(keep_g.tolist()))
        prune_block(adapter, blocks[i], keep_g, keep_c, head_dim)
    predicted = dense - sum(n * c.group_params + m * c.channel_params for n, m, c in
                            zip(chosen["groups_removed"], chosen["channels_removed"], costs))
    if count_parameters(model) != predicted:
        raise RuntimeError(f"surgery left {count_parameters(model)} parameters, "
                           f"the plan predicted {predicted}")
    structure = structure_of(model)
    log.info("LLM-Pruner: layers [%d, %d), heads %s, ffn %s, expected ratio %.4f", start, end,
             structure["num_attention_heads"], structure["intermediate_size"],
             chosen["expected_ratio"])
    info = {"policy": cfg.policy, "layer_range": [start, end], **chosen,
            "removed_kv_groups": removed_groups, "gqa_rule": "whole KV groups",
            "importance": "taylor first order |w*grad| (Element1), sum over group, local",
            "calibration_loss": loss, "n_windows": int(windows.shape[0]),
            "importance_seconds": round(t1 - t0, 3),
            "surgery_seconds": round(time.perf_counter() - t1, 3),
            "recovery": recovery_recipe(adapter)}
    return CompressionResult(model=model, structure=structure, info=info)


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """Dense skeleton of ``config`` reshaped to the per-layer counts in ``structure``."""
    return apply_structure(empty_model(config), structure)


def uniform_config(config: Any, structure: dict[str, Any]) -> Any:
    """A stock copy of ``config`` with the pruned head counts and FFN width, when every layer
    kept the same ones (``head_dim`` explicit).

    Raises:
        NotExportable: per-layer widths, or counts the stock config class rejects.
    """
    heads, kvs = set(structure["num_attention_heads"]), set(structure["num_key_value_heads"])
    inters = set(structure["intermediate_size"])
    if len(heads) > 1 or len(kvs) > 1 or len(inters) > 1:
        raise NotExportable(
            "LLM-Pruner left per-layer widths (query heads "
            f"{structure['num_attention_heads']}, KV heads {structure['num_key_value_heads']}, "
            f"FFN {structure['intermediate_size']}); a stock config has one "
            "num_attention_heads / num_key_value_heads / intermediate_size for every layer")
    out = copy.deepcopy(config)
    out.num_attention_heads, out.num_key_value_heads = heads.pop(), kvs.pop()
    out.intermediate_size = inters.pop()
    out.head_dim = int(structure["head_dim"])
    try:
        out.validate()
    except Exception as err:  # huggingface_hub's StrictDataclassClassValidationError
        cause = getattr(err, "__cause__", None) or err
        raise NotExportable(f"LLM-Pruner kept {out.num_attention_heads} query heads per layer, "
                            f"which a stock {type(config).__name__} rejects: {cause}") from None
    return out


def plain(loaded: Any, unshare: bool) -> tuple[nn.Module, str]:
    """``Method.plain``: uniform widths make a stock config with the pruned counts."""
    model = loaded.model
    out = empty_model(uniform_config(model.config, loaded.manifest.structure))
    out.load_state_dict(model.state_dict(), strict=True)
    return out.eval(), "LLM-Pruner with uniform widths: stock config with the pruned counts"


def card_lines(manifest: Any) -> list[str]:
    """The model card's structure lines (``Method.card_lines``)."""
    s = manifest.structure
    return [f"- query heads per layer: {s.get('num_attention_heads')}",
            f"- KV heads per layer: {s.get('num_key_value_heads')}",
            f"- FFN width per layer: {s.get('intermediate_size')}"]


METHOD = Method(name="llm_pruner", config_cls=LLMPrunerConfig, compress=compress,
                rebuild=rebuild, recovery="lora",
                description="LLM-Pruner (block-wise): Taylor-pruned attention groups and FFN "
                            "channels",
                plain=plain, card_lines=card_lines)
