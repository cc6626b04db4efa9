"""The compression entry point shared by the CLI and the Snakemake scripts: load, check,
compress, count, publish (:func:`compress`)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from flexigpt.api.ratios import block_step, check_achieved, check_basis_for, check_ratio_reach
from flexigpt.api.values import check_count, check_positions
from flexigpt.core import faults
from flexigpt.core.devices import model_device
from flexigpt.core.fileio import check_output
from flexigpt.core.params import compression_ratio, count_parameters
from flexigpt.core.provenance import setup_run
from flexigpt.export.publish import publish_compressed
from flexigpt.methods.calibration import token_windows
from flexigpt.methods.compression_basis import (
    achieved_ratios,
    embedding_parameters,
    to_total,
)
from flexigpt.storage.manifest import Manifest
from flexigpt.storage.models.loading import load_model
from flexigpt.storage.registry import get_method

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
        device: where the model is loaded and compressed (:mod:`flexigpt.core.devices`; every
            calibration forward, SVD, PCA and importance pass runs there); recorded in the
            manifest. The saved weights are the same files on any device.
        force: replace an existing ``out_dir`` that is not a saved model (default: the
            :func:`flexigpt.core.fileio.force_outputs` setting, off).
        accept_ratio_miss: compress a block-count method (``MethodFacts.block_count``) at a
            ratio no block count reaches within half a block step (logged as a warning with
            target and achieved) instead of refusing it.
        basis: what ``options["ratio"]`` is a fraction of (:mod:`flexigpt.methods.compression_basis`):
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
            count policy (:class:`flexigpt.methods.block_count.RatioOutOfReach`, naming target,
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
    log.info("compressed with %s (compute %.1f s)", method, seconds)
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


def _jsonable(cfg: Any) -> dict[str, Any]:
    import dataclasses

    is_instance = dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)
    out = dataclasses.asdict(cfg) if is_instance else dict(cfg)
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in out.items()}
