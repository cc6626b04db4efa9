"""Inference cost of several models on the same input, in one process (paper Tables 6/7).

Forward protocol (the paper's): one fixed random batch ``[batch, seq_len]`` of token ids;
every model runs ``warmup`` untimed forward passes, then ``repeats`` rounds in which the
models take turns (interleaved, so drifting machine load hits all of them alike); the median
round time is reported. Relative time/throughput are fractions of the first model's (the
dense model).

Decoding (``decode``, what a user of a compressed model waits for): greedy generation of
the same held-out prompts by every model, interleaved the same way, at batch 1 and a larger
batch, and self-speculative decoding of the FlexiGPT models
(:func:`flexigpt.runtime.generation.measure.measure_decode`).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flexigpt.core import devices
from flexigpt.core.devices import model_device
from flexigpt.core.fileio import atomic_write_text
from flexigpt.core.params import count_parameters
from flexigpt.core.provenance import provenance
from flexigpt.runtime.generation.generator import Generator
from flexigpt.runtime.generation.measure import default_prompts, measure_decode
from flexigpt.storage.artifacts import load_compressed

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_inference(models: dict[str, PreTrainedModel], batch: int, seq_len: int,
                      repeats: int = 5, warmup: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """Median forward time of each model on the same ``[batch, seq_len]`` input.

    Args:
        models: name → causal LM (the first is the reference, normally dense). All must
            accept ``input_ids`` of their shared vocabulary.
        batch, seq_len: input shape.
        repeats: timed rounds (median taken); warmup: untimed passes per model first.

    Returns:
        One row per model, in order: ``name, seconds, seconds_all, tokens_per_s,
        relative_time, relative_throughput``.
    """
    if not models:
        raise ValueError("measure_inference needs at least one model")
    for name, value in (("batch", batch), ("seq_len", seq_len), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    vocab = min(int(m.config.vocab_size) for m in models.values())
    ids = torch.randint(vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))
    for m in models.values():
        m.eval()
        dev = model_device(m)
        for _ in range(warmup):
            m(input_ids=ids.to(dev), use_cache=False)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, m in models.items():
            dev = model_device(m)
            x = ids.to(dev)
            _sync(dev)
            start = time.perf_counter()
            m(input_ids=x, use_cache=False)
            _sync(dev)
            times[name].append(time.perf_counter() - start)
    rows, ref = [], None
    for name, ts in times.items():
        seconds = statistics.median(ts)
        ref = ref if ref is not None else seconds
        rows.append({"name": name, "seconds": seconds, "seconds_all": ts,
                     "tokens_per_s": batch * seq_len / seconds,
                     "relative_time": seconds / ref, "relative_throughput": ref / seconds})
        log.info("%s: %.4f s/forward (relative time %.3f)", name, seconds, seconds / ref)
    return rows


def _decode_rows(loaded: dict[str, Any], prompts: list[str], dec: dict[str, int],
                 meta: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Decoding cost of the loaded models (:func:`measure_decode`), one row per model with
    its name fields (method, variant, setting, ratio)."""
    def progress(rep: int, name: str, b1: dict[str, Any], seconds: float) -> None:
        log.info("decode [%d/%d] %s: %.2f ms/token at batch 1 (%.1f s)", rep + 1,
                 dec["repeats"], name, b1["per_token_ms"], seconds)

    gens = {name: Generator(value) for name, value in loaded.items()}
    entries = measure_decode(gens, prompts, dec["new_tokens"], dec["batch"],
                             [dec["draft_length"]], dec["repeats"], on_round=progress)
    keys = ("method", "variant", "setting", "ratio")
    return [{**e, **{k: meta[e["name"]][k] for k in keys}} for e in entries]


def _parse_name(name: str) -> dict[str, Any]:
    """``method/variant/setting`` (the DAG's naming) → method, variant, ratio."""
    parts = name.split("/", 2)
    method = parts[0]
    variant = parts[1] if len(parts) > 1 else "default"
    setting = parts[2] if len(parts) > 2 else ""
    ratio = None
    if setting.startswith("r"):
        try:
            ratio = float(setting[1:])
        except ValueError:
            ratio = None
    return {"method": method, "variant": variant, "setting": setting, "ratio": ratio}


#: ``inference.decode`` settings (prompts = 0: no decoding measured)
DECODE_DEFAULTS = {"prompts": 0, "new_tokens": 16, "batch": 4, "draft_length": 1, "repeats": 1}


def decode_settings(decode: dict[str, Any] | None) -> dict[str, int]:
    """``inference.decode`` with its defaults; ValueError naming an unknown or bad key."""
    given = dict(decode or {})
    unknown = sorted(set(given) - set(DECODE_DEFAULTS))
    if unknown:
        raise ValueError(f"inference.decode: unknown key(s) {unknown}; known: "
                         f"{sorted(DECODE_DEFAULTS)}")
    out = {**DECODE_DEFAULTS, **given}
    for key, value in out.items():
        low = 0 if key == "prompts" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"inference.decode.{key} must be an int >= {low}, got {value!r}")
    return out


def run_inference_cost(inputs: dict[str, str | os.PathLike], out_json: str | os.PathLike,
                       batch: int = 4, seq_len: int = 256, repeats: int = 5,
                       model: str | None = None, dtype: str = "float32",
                       device: str = "cpu", warmup: int = 1,
                       decode: dict[str, Any] | None = None,
                       prompt_text: str | os.PathLike | None = None) -> dict[str, Any]:
    """Load each saved model, time them together, write the timing JSON atomically.

    Args:
        inputs: ``"method/variant/setting"`` → model dir, reference (dense) first.
        model: model key recorded in the JSON (default: the parent folder of ``out_json``).
        device: where every model is loaded and timed (:mod:`flexigpt.core.devices`).
        decode: :data:`DECODE_DEFAULTS` keys; with ``prompts > 0`` the decoding cost of the
            first sentences of the first ``prompts`` documents of ``prompt_text`` is
            measured too.

    Output: ``{"schema": 1, "model", "batch", "seq_len", "repeats", "rows": [{name,
    method, variant, setting, ratio, model_dir, parameters, num_layers, seconds,
    tokens_per_s, relative_time, relative_throughput}], "decode": null | {settings...,
    "prompt_text", "rows": [{name, method, variant, setting, ratio, weights_mb,
    prefill_ms, batch1, batched, relative_decode_time, speculative}]}, "device",
    "threads", "provenance", "created"}``.

    Raises:
        ValueError: bad ``decode`` settings, or ``prompts > 0`` without ``prompt_text``
            (before any model is loaded).
    """
    dec = decode_settings(decode)
    prompts = None
    if dec["prompts"]:
        if prompt_text is None:
            raise ValueError("inference.decode.prompts > 0 needs a prompt text")
        prompts = default_prompts(prompt_text, dec["prompts"])
    loaded_models, meta = {}, {}
    models: dict[str, Any] = {}  # transformers models (LoadedModel types them nn.Module)
    for name, path in inputs.items():
        loaded = loaded_models[name] = load_compressed(path, dtype=dtype, device=device)
        models[name] = loaded.model
        meta[name] = {**_parse_name(name), "model_dir": str(path),
                      "parameters": count_parameters(loaded.model),
                      "num_layers": int(models[name].config.num_hidden_layers)}
    rows = measure_inference(models, batch, seq_len, repeats, warmup)
    decoded = None
    if prompts is not None:
        decoded = {**dec, "prompt_text": str(prompt_text),
                   "rows": _decode_rows(loaded_models, prompts, dec, meta)}
    out = {"schema": 1, "model": model or Path(out_json).parent.name, "batch": batch,
           "seq_len": seq_len, "repeats": repeats, "dtype": dtype,
           "rows": [{**meta[r["name"]], **r} for r in rows], "decode": decoded,
           "device": str(devices.model_device(next(iter(models.values())))),
           "threads": torch.get_num_threads(), "provenance": provenance(),
           "created": datetime.now(UTC).isoformat(timespec="seconds")}
    atomic_write_text(out_json, json.dumps(out, indent=2) + "\n")
    return out
