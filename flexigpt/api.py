"""The compression entry point shared by the CLI and the Snakemake scripts."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from flexigpt import faults
from flexigpt.block_count import RatioOutOfReach, counts_blocks, unique_param_count
from flexigpt.calibration import token_windows
from flexigpt.compression_basis import achieved_ratios, check_basis, embedding_parameters, to_total
from flexigpt.devices import model_device
from flexigpt.export.publish import publish_compressed
from flexigpt.fileio import check_output
from flexigpt.manifest import Manifest
from flexigpt.models.adapters import get_adapter
from flexigpt.models.loading import load_model
from flexigpt.params import compression_ratio, count_parameters
from flexigpt.provenance import setup_run
from flexigpt.registry import get_method

log = logging.getLogger(__name__)


def compress(method: str, model_spec: str, out_dir: str | os.PathLike,
             options: dict[str, Any] | None = None, calibration: str | None = None,
             n_calibration: int = 128, calibration_seq_len: int = 512, seed: int = 0,
             dtype: str = "float32", force: bool | None = None,
             device: str = "cpu", accept_ratio_miss: bool = False,
             basis: str = "total") -> Manifest:
    """Load ``model_spec``, compress it with ``method`` and save to ``out_dir``.

    Args:
        method: registry key (``flexigpt``, ``shortgpt``, ``slicegpt``, ...).
        model_spec: local checkpoint directory or hub id of the dense model.
        out_dir: output directory (written atomically; nothing left on failure), published
            with :func:`flexigpt.export.publish.publish_compressed` (remote code, card).
        options: the method's config fields (validated by its config dataclass).
        calibration: text file for calibration windows (methods that need it).
        n_calibration: number of calibration windows N.
        calibration_seq_len: window length T in tokens.
        seed: seed for every RNG and for the window sample.
        dtype: dtype the dense model is loaded in.
        device: where the model is loaded and compressed (:mod:`flexigpt.devices`; every
            calibration forward, SVD, PCA and importance pass runs there); recorded in the
            manifest. The saved weights are the same files on any device.
        force: replace an existing ``out_dir`` that is not a saved model (default: the
            :func:`flexigpt.fileio.force_outputs` setting, off).
        accept_ratio_miss: compress a block-count method (``MethodFacts.block_count``) at a
            ratio no block count reaches within half a block step (logged as a warning with
            target and achieved) instead of refusing it.
        basis: what ``options["ratio"]`` is a fraction of (:mod:`flexigpt.compression_basis`):
            ``total`` parameters, or ``non_embedding`` (converted to the equal total-basis
            target once the model is loaded; refused for a method that slices embeddings).
            The manifest records the basis and the achieved ratio on both bases.

    Returns:
        The manifest written to ``out_dir/manifest.json``.

    Raises:
        OutputExistsError: ``out_dir`` holds something else (checked before any work).
        ValueError: bad options, a non-positive ``n_calibration``/``calibration_seq_len``, a
            FlexiGPT rank too large to compress (names the largest useful rank), calibration
            windows longer than the model's positions, or a ratio out of reach of the block
            count policy (:class:`flexigpt.block_count.RatioOutOfReach`, naming target,
            achieved and the achievable range; checked after loading, before any work).
    """
    spec, cfg = _checked_request(method, options, calibration, n_calibration,
                                 calibration_seq_len, out_dir, force)
    check_basis_for(spec, basis)
    setup_run(seed)
    # weights in process memory: every method replaces some, which then frees them
    model, tokenizer = load_model(model_spec, dtype=dtype, device=device, mapped=False)
    dense_params = count_parameters(model)
    embedding = embedding_parameters(model)
    target = getattr(cfg, "ratio", None)
    if target is not None and basis != "total":
        cfg.ratio = to_total(target, basis, dense_params, embedding)
        log.info("ratio %g of the %s parameters = %.6f of all parameters", target, basis,
                 cfg.ratio)
    _check_loaded(method, spec, model, cfg, accept_ratio_miss, calibration_seq_len)
    step = block_step(model, dense_params)
    calib = (token_windows(calibration, tokenizer, calibration_seq_len, n_calibration, seed)
             if spec.needs_calibration and calibration is not None else None)
    start = time.perf_counter()
    log.info("compressing %s with %s (%s)", model_spec, method, cfg)
    with torch.no_grad():
        result = spec.compress(model, tokenizer, calib, cfg)
    faults.point("compress:done")
    seconds = time.perf_counter() - start
    compressed = count_parameters(result.model)
    check_achieved(method, cfg, compression_ratio(compressed, dense_params), step,
                   accept_ratio_miss)
    extra: dict[str, Any] = {}
    if basis != "total":  # total-basis manifests stay as they were
        extra["compression_basis"] = {
            "basis": basis, "target": target, "embedding_params": embedding,
            "achieved": achieved_ratios(dense_params, compressed, embedding)}
    manifest = Manifest.new(
        method, config=_jsonable(cfg), base_model=str(model_spec), structure=result.structure,
        info=result.info, dense_params=dense_params, compressed_params=compressed,
        calibration=_calibration_record(calibration, calib, seed), seed=seed, dtype=dtype,
        compress_seconds=round(seconds, 3), device=str(model_device(model)), **extra)
    return publish_compressed(result.model, tokenizer, manifest, out_dir, force=force)


def _checked_request(method: str, options: dict[str, Any] | None, calibration: str | None,
                     n_calibration: int, calibration_seq_len: int,
                     out_dir: str | os.PathLike, force: bool | None) -> tuple[Any, Any]:
    """``(method spec, validated config)`` of a :func:`compress` call, once every check that
    needs no model passed: the options, the counts, the calibration file where the method
    needs one, and ``out_dir`` (:class:`OutputExistsError` before anything is loaded)."""
    spec = get_method(method)
    cfg = spec.make_config(**(options or {}))  # validate before any heavy work
    check_count(n_calibration, "n_calibration")
    check_count(calibration_seq_len, "calibration_seq_len")
    if spec.needs_calibration and calibration is None:
        raise ValueError(f"method {method!r} needs a calibration text file (--calibration)")
    check_output(out_dir, "model", force)  # refuse before loading anything
    return spec, cfg


def _check_loaded(method: str, spec: Any, model: Any, cfg: Any, accept_ratio_miss: bool,
                  calibration_seq_len: int) -> None:
    """The checks of a :func:`compress` call that need the loaded dense ``model``, before any
    work: its family, the method's own check (``Method.check_model``: e.g. FlexiGPT's rank),
    the block-count ratio's reach and the calibration window length against the model's
    positions."""
    spec.check_family(model)
    if spec.check_model is not None:
        spec.check_model(model, cfg)
    check_ratio_reach(method, model, cfg, accept_ratio_miss)
    if spec.needs_calibration:
        check_positions(model.config, calibration_seq_len, "--seq-len (calibration window)")


def _calibration_record(calibration: str | None, calib: torch.Tensor | None,
                        seed: int) -> dict[str, Any] | None:
    """The manifest's ``calibration`` entry for the windows ``calib`` (``[N, T]`` token ids)
    drawn from ``calibration`` with ``seed``; None when the method saw none."""
    if calib is None:
        return None
    return {"file": str(calibration), "n_windows": int(calib.shape[0]),
            "seq_len": int(calib.shape[1]), "sample_seed": seed}


def check_basis_for(spec: Any, basis: str) -> None:
    """``ValueError`` for an unknown basis, or ``non_embedding`` with a method that removes
    embedding parameters (``MethodFacts.embedding_surgery``: its ratio is total-basis only)."""
    check_basis(basis)
    if basis != "total" and spec.facts.embedding_surgery:
        raise ValueError(f"{spec.name} removes embedding parameters, so its ratio is defined "
                         f"on the total basis only (got basis {basis!r})")


def check_ratio_reach(method: str, model: Any, cfg: Any, accept_miss: bool = False) -> None:
    """Refuse a block-count method's ratio that no block count of ``model`` reaches within
    half a block step (:func:`flexigpt.block_count.method_plan`); with ``accept_miss`` log
    it as a warning instead. Either way target and achieved are logged."""
    from flexigpt.block_count import method_plan

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
    refused (:class:`flexigpt.block_count.RatioOutOfReach`) unless ``accept_miss``, which
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


def check_count(value: Any, what: str, minimum: int = 1) -> None:
    """``ValueError`` naming ``what`` unless ``value`` is an integer >= ``minimum`` (a bool
    is not a count). Used for every count-like argument and CLI flag (``what`` = the flag)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")


def check_positions(config: Any, seq_len: int, what: str = "sequence length") -> None:
    """``ValueError`` when ``seq_len`` exceeds the model's ``max_position_embeddings``."""
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and seq_len > limit:
        raise ValueError(f"{what} {seq_len} is longer than the model's {limit} positions "
                         f"(max_position_embeddings); use at most {limit}")


def _jsonable(cfg: Any) -> dict[str, Any]:
    import dataclasses

    is_instance = dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
    out = dataclasses.asdict(cfg) if is_instance else dict(cfg)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in out.items()}
