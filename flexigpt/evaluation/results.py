"""``evaluate_model``: perplexity + zero-shot tasks of one saved model → one result JSON.

Schema 1 (``flexigpt/tables`` reads it)::

    {"schema": 1, "model_dir", "method" ("dense" without manifest), "manifest_hash"|null,
     "num_layers", "parameters": {"dense", "compressed", "achieved_ratio"},
     "trained_tokens" (recovery / continued-training tokens in the manifest history),
     "perplexity": {"value", "text", "text_sha256", "seq_len", "n_windows", "n_tokens",
                    "seconds"} | null,
     "tasks": {<task>: {"metric", "value" (0–1), "stderr", "metrics", "n_docs", "limit",
                        "version", "source", "split", "data_sha256", "seconds", ...}},
     "lm_eval": {"version", "num_fewshot": 0, "batch_size", "backend", "config"},
     "provenance", "created", "labels"}
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flexigpt.evaluation.tasks import PAPER_TASKS, task_specs
from flexigpt.evaluation.zeroshot import BACKENDS, lm_config, make_lm, run_tasks

log = logging.getLogger(__name__)
SCHEMA = 1


@dataclass
class EvalConfig:
    """Validated options of :func:`evaluate_model` (see there)."""

    tasks: list[str] = field(default_factory=lambda: list(PAPER_TASKS))
    limit: int | None = None
    source: str = "local"
    benchmarks_dir: str | None = "resources/benchmarks"
    ppl_text: str | None = "resources/text/wiki/validation.txt"
    ppl_seq_len: int = 2048
    ppl_windows: int | None = None
    ppl_batch_tokens: int = 4096
    batch_size: int = 16
    backend: str = "fast"
    dtype: str = "float32"
    device: str = "cpu"
    add_bos_token: bool = False
    autocast_dtype: str | None = None
    labels: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.tasks, str):
            self.tasks = [t for t in self.tasks.split(",") if t]
        self.tasks = list(self.tasks or [])
        if self.limit is not None and (isinstance(self.limit, bool)
                                       or not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"limit must be a positive int or None, got {self.limit!r}")
        for name in ("ppl_seq_len", "batch_size", "ppl_batch_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.ppl_seq_len < 2:
            raise ValueError(f"ppl_seq_len must be at least 2, got {self.ppl_seq_len}")
        if self.ppl_windows is not None and (not isinstance(self.ppl_windows, int)
                                             or self.ppl_windows < 1):
            raise ValueError(f"ppl_windows must be a positive int or None, got "
                             f"{self.ppl_windows!r}")
        if self.source not in ("local", "hub"):
            raise ValueError(f"source must be 'local' or 'hub', got {self.source!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.labels, dict) or not all(isinstance(k, str) for k in self.labels):
            raise ValueError(f"labels must be a dict with str keys, got {self.labels!r}")
        if not self.tasks and self.ppl_text is None:
            raise ValueError("nothing to evaluate: no tasks and no perplexity text")
        if self.ppl_text is not None and not Path(self.ppl_text).is_file():
            raise FileNotFoundError(f"perplexity text {self.ppl_text!r} does not exist")


def evaluate_model(model_dir_or_spec: str | os.PathLike, out_json: str | os.PathLike,
                   **options: Any) -> dict[str, Any]:
    """Evaluate one model and write the schema-1 result JSON atomically.

    Args:
        model_dir_or_spec: any method's output dir, a plain HF checkpoint dir or a hub id
            (loaded with :func:`flexigpt.load_compressed`).
        out_json: where the result goes (written only if everything succeeded).
        **options: fields of :class:`EvalConfig`: ``tasks`` (list; empty = perplexity
            only), ``limit`` (first N docs per task, None = full split), ``source``
            (``local``|``hub``), ``benchmarks_dir``, ``ppl_text`` (None = no perplexity),
            ``ppl_seq_len``, ``ppl_windows`` (None = every full window), ``batch_size``,
            ``backend`` (``fast``|``hf``), ``dtype``, ``device``, ``add_bos_token``,
            ``autocast_dtype`` (fast backend), ``labels`` (free dict copied to the JSON).

    Returns:
        The result dict that was written.
    """
    from flexigpt.artifacts import atomic_write_text, load_compressed, manifest_hash
    from flexigpt.params import count_parameters
    from flexigpt.provenance import provenance

    cfg = EvalConfig(**options)
    specs = task_specs(cfg.tasks, cfg.source, cfg.benchmarks_dir) if cfg.tasks else []
    loaded = load_compressed(model_dir_or_spec, dtype=cfg.dtype, device=cfg.device)
    model, tokenizer, manifest = loaded.model, loaded.tokenizer, loaded.manifest
    compressed = count_parameters(model)
    if manifest is None:
        params = {"dense": compressed, "compressed": compressed, "achieved_ratio": 0.0}
    else:
        stored = manifest.get("parameters") or {}
        params = {"dense": stored.get("dense"), "compressed": compressed,
                  "achieved_ratio": stored.get("achieved_ratio")}
        if stored.get("compressed") not in (None, compressed):
            log.warning("manifest says %s parameters, the loaded model has %d",
                        stored.get("compressed"), compressed)
    result: dict[str, Any] = {
        "schema": SCHEMA, "model_dir": str(model_dir_or_spec),
        "method": manifest["method"] if manifest else "dense",
        "manifest_hash": manifest_hash(manifest) if manifest else None,
        "num_layers": int(model.config.num_hidden_layers), "parameters": params,
        "trained_tokens": sum(int(h.get("tokens") or 0) for h in (manifest or {}).get(
            "history", []) if h.get("stage") == "train"),
        "perplexity": None, "tasks": {},
        "lm_eval": {"version": importlib.metadata.version("lm_eval"), "num_fewshot": 0,
                    "batch_size": cfg.batch_size, "backend": cfg.backend, "config": {}},
    }
    if cfg.ppl_text is not None:
        result["perplexity"] = perplexity_block(model, tokenizer, cfg)
    if specs:
        lm = make_lm(model, tokenizer, backend=cfg.backend, batch_size=cfg.batch_size,
                     add_bos_token=cfg.add_bos_token, autocast_dtype=cfg.autocast_dtype)
        result["tasks"] = run_tasks(lm, specs, cfg.limit)
        result["lm_eval"]["config"] = lm_config(lm)
    result.update(provenance=provenance(),
                  created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  labels=dict(cfg.labels))
    validate_result(result)
    atomic_write_text(out_json, json.dumps(result, indent=2, sort_keys=True) + "\n")
    log.info("wrote %s", out_json)
    return result


def perplexity_block(model: Any, tokenizer: Any, cfg: EvalConfig) -> dict[str, Any]:
    """Perplexity of ``cfg.ppl_text`` by the harness's one protocol (flexigpt.perplexity)."""
    from flexigpt.artifacts import sha256_file
    from flexigpt.calibration import token_windows
    from flexigpt.perplexity import perplexity

    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and cfg.ppl_seq_len > max_pos:
        raise ValueError(f"ppl_seq_len {cfg.ppl_seq_len} exceeds the model's "
                         f"max_position_embeddings {max_pos}")
    start = time.perf_counter()
    windows = token_windows(cfg.ppl_text, tokenizer, cfg.ppl_seq_len, cfg.ppl_windows)
    value = perplexity(model, windows, batch_size=max(1, cfg.ppl_batch_tokens // cfg.ppl_seq_len),
                       progress=True)
    seconds = time.perf_counter() - start
    log.info("perplexity %.4f over %d × %d tokens (%.1f s)", value, *windows.shape, seconds)
    return {"value": value, "text": str(cfg.ppl_text), "text_sha256": sha256_file(cfg.ppl_text),
            "seq_len": cfg.ppl_seq_len, "n_windows": int(windows.shape[0]),
            "n_tokens": int(windows[:, 1:].numel()), "seconds": round(seconds, 3)}


def validate_result(data: dict[str, Any]) -> None:
    """Check the schema-1 fields other code relies on.

    Raises:
        ValueError: naming the first missing or malformed field.
    """
    def need(obj: Any, key: str, types: type | tuple[type, ...], where: str = "") -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise ValueError(f"result lacks {where}{key!r}")
        if not isinstance(obj[key], types) or isinstance(obj[key], bool) and bool not in (
                types if isinstance(types, tuple) else (types,)):
            raise ValueError(f"result field {where}{key} = {obj[key]!r} is not {types}")
        return obj[key]

    if need(data, "schema", int) != SCHEMA:
        raise ValueError(f"unsupported result schema {data['schema']!r}")
    for key in ("model_dir", "method", "created"):
        need(data, key, str)
    need(data, "num_layers", int)
    need(data, "labels", dict)
    need(data, "provenance", dict)
    need(data, "lm_eval", dict)
    need(need(data, "parameters", dict), "compressed", int, "parameters.")
    ppl = need(data, "perplexity", (dict, type(None)))
    if ppl is not None and not math.isfinite(need(ppl, "value", (int, float), "perplexity.")):
        raise ValueError(f"perplexity.value is not finite: {ppl['value']!r}")
    for task, entry in need(data, "tasks", dict).items():
        value = need(entry, "value", (int, float), f"tasks.{task}.")
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"tasks.{task}.value must be in [0, 1], got {value!r}")
        need(entry, "metric", str, f"tasks.{task}.")
        need(entry, "n_docs", int, f"tasks.{task}.")


def load_result(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a result JSON."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"result file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"result file {str(path)!r} is not valid JSON: {err}") from None
    validate_result(data)
    return data
