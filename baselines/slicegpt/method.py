"""SliceGPT (Ashkboos et al., ICLR 2024) behind the harness's method interface.

``compress``: choose the width (from a parameter target or the paper's slicing fraction),
fuse norms, then rotate and slice block by block on calibration windows. ``rebuild``: the
sliced skeleton from ``(config, structure)`` so ``flexigpt.load_compressed`` reloads it.

Head (``SliceGPTConfig.head``): by default an official SliceGPT treatment — ``"sliced"`` on
tied models (the head is untied: a new ``V×d′`` matrix, counted), ``"unsliced"`` otherwise.
``"tied"`` (re-tied through a ``d′×d′`` projection) is this harness's variant and is only
used when requested; ``info["head_official"]`` says which one a run used.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any

import torch
from torch import nn

from baselines.slicegpt.accounting import Plan, predict_parameters, slicing_width, solve_width
from baselines.slicegpt.config import SliceGPTConfig
from baselines.slicegpt.fusion import (
    check_residual_stream,
    fuse_model,
    is_tied,
    norm_kind,
    set_module,
    sliced_block,
    stream_writers,
)
from baselines.slicegpt.modules import RMSN, ProjectedRMSN, resize_linear, set_shortcut
from baselines.slicegpt.rotate import rotate_and_slice
from flexigpt.core.memory import release_freed_memory
from flexigpt.core.params import count_parameters
from flexigpt.methods.lora import lora_rank_problem
from flexigpt.storage.artifacts import empty_model
from flexigpt.storage.models.adapters import ArchAdapter, get_adapter
from flexigpt.storage.registry import CompressionResult, Method, NotExportable, RecoveryRecipe

log = logging.getLogger(__name__)

#: Head treatments of the official SliceGPT code; ``"tied"`` is this harness's variant.
OFFICIAL_HEADS = ("unsliced", "sliced")


def rft_targets(adapter: ArchAdapter) -> list[str]:
    """The paper's RFT LoRA targets (official ``--lora-target-option attn_head_and_mlp``):
    every attention and MLP linear of a block, by the architecture adapter's short names
    (the shortcut matrices are not targets)."""
    return list(dict.fromkeys(adapter.attn_linears + adapter.mlp_linears))


def recovery_recipe(cfg: SliceGPTConfig, adapter: ArchAdapter) -> dict[str, Any]:
    """``info["recovery"]`` for the shared trainer (``flexigpt.runtime.training.config.resolve_plan``)."""
    if cfg.recovery == "none":
        return RecoveryRecipe("none").to_dict()
    return RecoveryRecipe("lora", lr=cfg.lora_lr, lora_rank=cfg.lora_rank,
                          lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          lora_targets=tuple(rft_targets(adapter))).to_dict()


def resolve_head(head: str, tied: bool, kind: str) -> str:
    """The head treatment for ``cfg.head`` on a model whose head is (not) tied.

    ``"auto"`` resolves to an official SliceGPT head: ``"sliced"`` (head untied, its input
    rotated by the last Q and sliced) on tied models, ``"unsliced"`` (official default, full
    width, untied) otherwise. ``"tied"`` (re-tied through a projection) is only used when
    asked for explicitly: it is this harness's variant, not the paper's.
    """
    if head == "auto":
        head = "sliced" if tied else "unsliced"
    if head == "tied" and not tied:
        raise ValueError("head='tied' needs a model whose LM head is tied to its embedding; "
                         "this model's head is separate (use 'unsliced' or 'sliced')")
    if head == "tied" and kind != "rms":
        raise ValueError("head='tied' is only exact for RMSNorm models (a LayerNorm model's "
                         "centred embedding cannot serve as its head)")
    return head


def plan_for(model: nn.Module, adapter: ArchAdapter, cfg: SliceGPTConfig, head: str,
             tied: bool) -> tuple[Plan, int]:
    """The constant-width plan for ``cfg`` and its width."""
    config: Any = model.config  # an HF config: its fields vary by family
    hidden, n_layers = config.hidden_size, len(adapter.layers(model))
    if cfg.target == "slicing_fraction":
        width = slicing_width(cfg.ratio, hidden, cfg.round_to)
    else:
        width, _ = solve_width(model, adapter, cfg.ratio, head, tied, cfg.round_to, cfg.tolerance)
    return Plan.constant(width, n_layers, hidden, head), width


def _check_windows(calibration: Any) -> torch.Tensor:
    ok = isinstance(calibration, torch.Tensor)
    if not ok or calibration.dim() != 2 or calibration.dtype != torch.long \
            or calibration.shape[0] < 1 or calibration.shape[1] < 2:
        got = (tuple(calibration.shape), calibration.dtype) if ok else type(calibration).__name__
        raise ValueError(f"slicegpt needs calibration token windows as a LongTensor [N, T] "
                         f"with N ≥ 1, T ≥ 2; got {got}")
    return calibration


def compress(model: nn.Module, tokenizer: Any, calibration: torch.Tensor | None,
             cfg: SliceGPTConfig, mask: torch.Tensor | None = None) -> CompressionResult:
    """Slice ``model`` in place; ``calibration [N, T]``, optional padding ``mask [N, T]``.

    Llama-family (RMSNorm, rotary) and OPT (LayerNorm with bias, learned positions, MLP on
    the block) models; other families raise ``UnsupportedArchitectureError``, a model
    without one pre-norm residual stream (OPT-350m) ValueError.
    """
    METHOD.check_family(model)
    windows = _check_windows(calibration)
    if mask is not None and mask.shape != windows.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} != windows shape {tuple(windows.shape)}")
    adapter = get_adapter(model)
    config: Any = model.config  # an HF config: its fields vary by family
    check_residual_stream(model, adapter)
    tied = is_tied(model, adapter)
    head = resolve_head(cfg.head, tied, norm_kind(adapter.input_norm(adapter.layers(model)[0])))
    plan, width = plan_for(model, adapter, cfg, head, tied)
    dense = count_parameters(model)
    predicted = predict_parameters(model, adapter, plan, tied)
    log.info("slicegpt: width %d of %d, head %s (%s), predicted reduction %.4f",
             width, config.hidden_size, head,
             "official" if head in OFFICIAL_HEADS else "harness variant, not the paper's",
             1 - predicted / dense)
    start = time.perf_counter()
    release_freed_memory()  # e.g. what tokenizing the calibration text left in the heap
    fusion = fuse_model(model, adapter, untie=head != "tied", defer_untie=True)
    diag = rotate_and_slice(model, adapter, fusion, plan, windows, cfg, mask)
    seconds = time.perf_counter() - start
    after = count_parameters(model)
    head_params = (sum(p.numel() for p in adapter.final_norm(model).parameters())
                   if is_tied(model, adapter) else
                   sum(p.numel() for p in adapter.lm_head(model).parameters()))
    if after != predicted:
        log.error("slicegpt parameter count %d differs from the prediction %d", after, predicted)
    structure = {"plan": plan.to_json(), "hidden_size": config.hidden_size,
                 "eps": fusion.eps, "norm": fusion.norm, "was_tied": tied,
                 "head_bias": adapter.lm_head(model).bias is not None}
    info: dict[str, Any] = {
        "target": cfg.target, "ratio_requested": cfg.ratio, "width": width,
        "slicing_fraction": round(1 - width / config.hidden_size, 6),
        "head": head, "head_requested": cfg.head, "head_official": head in OFFICIAL_HEADS,
        "dense_head_tied": tied, "head_parameters": head_params,
        "dense_parameters": dense, "predicted_parameters": predicted, "parameters": after,
        "predicted_ratio": round(1 - predicted / dense, 6),
        "achieved_ratio": round(1 - after / dense, 6),
        "calibration": {"n_windows": int(windows.shape[0]), "seq_len": int(windows.shape[1])},
        "slice_seconds": round(seconds, 3),
        "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **diag,
    }
    info["recovery"] = recovery_recipe(cfg, adapter)
    return CompressionResult(model=model, structure=structure, info=info)


def rebuild(config: Any, structure: dict[str, Any]) -> nn.Module:
    """An uninitialised sliced skeleton whose ``state_dict`` matches a compressed model's."""
    try:
        plan = Plan(**structure["plan"])
        hidden, eps = int(structure["hidden_size"]), float(structure["eps"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a slicegpt structure ({err}): {structure!r}") from None
    model = empty_model(config)
    adapter = get_adapter(model)
    layers = adapter.layers(model)
    if len(layers) != len(plan.mid):
        raise ValueError(f"structure has {len(plan.mid)} blocks, config {len(layers)}")
    for i, (d_in, d_mid, d_out) in enumerate(zip(plan.inputs(), plan.mid, plan.out)):
        attn, mlp = adapter.attn(layers[i]), adapter.mlp_owner(layers[i])
        for name in adapter.attn_in_linears:
            resize_linear(getattr(attn, name), in_features=d_in)
        for name in adapter.attn_out_linears:
            resize_linear(getattr(attn, name), out_features=d_mid)
        for name in adapter.mlp_in_linears:
            resize_linear(getattr(mlp, name), in_features=d_mid)
        for name in adapter.mlp_out_linears:
            resize_linear(getattr(mlp, name), out_features=d_out)
        block = sliced_block(adapter, layers[i], config, eps)
        set_shortcut(block, "attn", torch.empty(d_in, d_mid))
        set_shortcut(block, "mlp", torch.empty(d_mid, d_out))
        layers[i] = block
    embed, head = adapter.embed(model), adapter.lm_head(model)
    for table in stream_writers(model, adapter):
        table.weight = nn.Parameter(torch.empty(table.weight.shape[0], plan.embed,
                                                dtype=table.weight.dtype))
        table.embedding_dim = plan.embed
    if plan.head == "tied":
        final = ProjectedRMSN(hidden, eps, plan.out[-1], plan.embed)
        set_module(model, adapter.final_norm_path, final)
        head.weight, head.in_features = embed.weight, plan.embed
    else:
        set_module(model, adapter.final_norm_path, RMSN(hidden, eps))
        resize_linear(head, in_features=plan.out[-1])
        if structure.get("head_bias") and head.bias is None:
            head.bias = nn.Parameter(torch.empty(head.out_features, dtype=head.weight.dtype))
    return model


def plain(loaded: Any, unshare: bool) -> tuple[nn.Module, str]:
    """``Method.plain``: a sliced model has no stock form."""
    raise NotExportable(
        "SliceGPT blocks carry shortcut matrices on the residual path (d_in × d_out per "
        "sub-layer) and weight-free RMS norms over the original width; a stock decoder "
        "layer has an identity residual, so there is no exact plain form")


def card_lines(manifest: Any) -> list[str]:
    """The model card's structure lines (``Method.card_lines``)."""
    s = manifest.structure
    plan = s.get("plan") or {}
    return [f"- residual width {plan.get('embed')} of {s.get('hidden_size')} (per block "
            f"out: {plan.get('out')}), head {plan.get('head')}",
            "- shortcut matrices on the residual path; norms fused into the linears"]


METHOD = Method(name="slicegpt", config_cls=SliceGPTConfig, compress=compress, rebuild=rebuild,
                recovery="lora",
                description="SliceGPT: PCA rotation and slicing of the residual stream",
                check_sizes=lambda model, cfg: lora_rank_problem(model, cfg, "lora_rank"),
                plain=plain, card_lines=card_lines)
