"""The one ratio rule every method inherits (``docs/ARCHITECTURE.md``, "Values"): block-count
methods are judged before any work (:func:`check_ratio_reach`), every other method after
compressing and before anything is written (:func:`check_achieved`, half a block step,
:func:`block_step`); and the parameter basis a method's ratio may use (:func:`check_basis_for`)."""

from __future__ import annotations

import logging
from typing import Any

from flexigpt.methods.block_count import RatioOutOfReach, counts_blocks, unique_param_count
from flexigpt.methods.compression_basis import check_basis
from flexigpt.storage.models.adapters import get_adapter

log = logging.getLogger(__name__)


def check_basis_for(spec: Any, basis: str) -> None:
    """``ValueError`` for an unknown basis, or ``non_embedding`` with a method that removes
    embedding parameters (``MethodFacts.embedding_surgery``: its ratio is total-basis only)."""
    check_basis(basis)
    if basis != "total" and spec.facts.embedding_surgery:
        raise ValueError(f"{spec.name} removes embedding parameters, so its ratio is defined "
                         f"on the total basis only (got basis {basis!r})")


def check_ratio_reach(method: str, model: Any, cfg: Any, accept_miss: bool = False) -> None:
    """Refuse a block-count method's ratio that no block count of ``model`` reaches within
    half a block step (:func:`flexigpt.methods.block_count.method_plan`); with ``accept_miss`` log
    it as a warning instead. Either way target and achieved are logged."""
    from flexigpt.methods.block_count import method_plan

    found = method_plan(method, model, cfg, accept_miss=accept_miss)
    if found is None:
        return
    if found.in_reach:
        log.info("block count: %s", found.summary())
    else:
        log.warning("%s (kept: accept_ratio_miss)", found.out_of_reach())


def block_step(model: Any, dense_params: int) -> float:
    """One decoder block's share of ``model``'s parameters (mean over its blocks): the
    resolution of every block-count ratio, and the tolerance unit of :func:`check_achieved`."""
    blocks = list(get_adapter(model).layers(model))
    return sum(unique_param_count(b) for b in blocks) / len(blocks) / dense_params


def check_achieved(method: str, cfg: Any, achieved: float, step: float,
                   accept_miss: bool = False) -> None:
    """The ratio rule every method inherits, after compressing and before anything is
    written: a target (``cfg.match_ratio`` when set, else ``cfg.ratio``; total basis) that
    the method missed by more than half a block step (``step``, :func:`block_step`) is
    refused (:class:`flexigpt.methods.block_count.RatioOutOfReach`) unless ``accept_miss``, which
    logs target and achieved. Block-count methods are judged before any work instead
    (:func:`check_ratio_reach`); this catches every other way to miss (a width method, a
    method added later)."""
    if counts_blocks(method):
        return  # its policy sets the block count (policy 'paper' misses the target by design)
    match = getattr(cfg, "match_ratio", None)
    target = match if match is not None else getattr(cfg, "ratio", None)
    if target is None or abs(achieved - target) <= step / 2:
        return
    text = (f"{method} achieved ratio {achieved:.4f} for target {target:g}, more than half a "
            f"block step ({step / 2:.4f}) away")
    if not accept_miss:
        raise RatioOutOfReach(f"{text}; nothing written (--accept-ratio-miss keeps it)")
    log.warning("%s (kept: accept_ratio_miss)", text)
