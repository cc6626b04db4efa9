"""``evaluate_model``: perplexity + zero-shot tasks of one saved model → one result JSON.

Schema 1 (``flexigpt/tables`` reads it)::

    {"schema": 1, "model_dir", "method" ("dense" without manifest), "manifest_hash"|null,
     "num_layers", "parameters": {"dense", "compressed", "achieved_ratio"},
     "trained_tokens" (recovery / continued-training tokens in the manifest history),
     "blocks_pruned" (blocks removed or replaced; null for width methods and dense),
     "recovery": null | {"recipe", "loss", "lr", "gamma_lr", "trainable_params", "tokens",
                         "budget" (null | {"target", "achieved", "rank", "rel_error"}),
                         "lr_source" ("tuning sweep of N trials" | "config" | ...)},
     "perplexity": {"value", "text", "text_sha256", "seq_len", "n_windows", "n_tokens",
                    "seconds"} | null,
     "tasks": {<task>: {"metric", "value" (0–1), "stderr", "metrics", "n_docs", "limit",
                        "version", "source", "split", "data_sha256", "seconds", ...}},
     "lm_eval": {"version", "num_fewshot": 0, "batch_size", "backend", "config"},
     "records": {"tasks": <file>|null, "perplexity": <file>|null} (optional; older results
                 lack it; file names relative to the result JSON's folder),
     "provenance", "created", "labels"}

Per-document records (written atomically beside ``<stem>.json``, before it; read them with
:func:`load_records`; ``flexigpt.core.stats`` pairs and bootstraps them):

* ``<stem>.samples.jsonl.gz`` (gzip, mtime 0): one JSON object per evaluated document, tasks
  in result order, docs by ``doc_id``: ``task``, ``data_sha256`` (= ``tasks.<t>.data_sha256``;
  null for hub data), ``split``, ``metric`` (the headline metric), ``doc_id``, ``target``,
  ``gold`` (choice index), ``loglikelihoods`` / ``is_greedy`` (one per request, in choice
  order), ``filtered_resps`` (lm-eval's ``[[ll, is_greedy], ...]``), ``filter``, ``metrics``,
  ``doc_hash``, ``prompt_hash``, ``target_hash`` and each metric's per-doc value (``acc``,
  ``acc_norm`` where lm-eval computes it). lm-eval's ``doc``, ``arguments`` and ``resps``
  are left out (``doc_hash`` identifies the doc).
* ``<stem>.windows.json``: ``{"text", "text_sha256", "seq_len", "n_windows", "nll": [per
  window summed NLL], "tokens": [per window predicted tokens], "total_nll", "n_tokens"}``.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flexigpt.core import devices, faults
from flexigpt.core.fileio import atomic_write_bytes, atomic_write_text, sha256_file
from flexigpt.core.params import count_parameters
from flexigpt.core.precision import dtype_name, resolve_autocast
from flexigpt.core.provenance import provenance
from flexigpt.methods.calibration import token_windows
from flexigpt.methods.perplexity import window_nlls
from flexigpt.runtime.evaluation.tasks import PAPER_TASKS, task_specs
from flexigpt.runtime.evaluation.zeroshot import BACKENDS, lm_config, make_lm, run_tasks
from flexigpt.runtime.training.recipe_table import uses_own_lr
from flexigpt.storage import artifacts
from flexigpt.storage.manifest import manifest_hash
from flexigpt.storage.registry import ROLES

if TYPE_CHECKING:
    from flexigpt.storage.manifest import Manifest

log = logging.getLogger(__name__)
SCHEMA = 1


@dataclass
class EvalConfig:
    """Validated options of :func:`evaluate_model` (see there)."""

    tasks: list[str] = field(default_factory=lambda: list(PAPER_TASKS))
    limit: int | None = None
    source: str = "local"
    tasks_dir: str | None = "resources/tasks"
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
        resolve_autocast(self.autocast_dtype, "cpu")  # raises on an unknown spelling
        if self.autocast_dtype not in (None, "none") and self.backend != "fast":
            raise ValueError(f"autocast_dtype {self.autocast_dtype!r} needs backend 'fast' "
                             f"(stock lm-eval scores in the model's dtype)")
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
            (``local``|``hub``), ``tasks_dir``, ``ppl_text`` (None = no perplexity),
            ``ppl_seq_len``, ``ppl_windows`` (None = every full window), ``batch_size``,
            ``backend`` (``fast``|``hf``), ``dtype``, ``device``, ``add_bos_token``,
            ``autocast_dtype`` (fast backend: None = fp32, ``auto`` = bf16 where the device
            runs it natively (:mod:`flexigpt.core.precision`), ``bfloat16``, ``float16``; used for
            perplexity and tasks alike, the resolved dtype is recorded), ``labels`` (free
            dict copied to the JSON).

    Returns:
        The result dict that was written.
    """
    cfg = EvalConfig(**options)
    specs = task_specs(cfg.tasks, cfg.source, cfg.tasks_dir) if cfg.tasks else []
    loaded = artifacts.load_compressed(model_dir_or_spec, dtype=cfg.dtype, device=cfg.device)
    model, tokenizer, manifest = loaded.model, loaded.tokenizer, loaded.manifest
    device = devices.model_device(model)
    autocast = resolve_autocast(cfg.autocast_dtype, device)
    result = _result_head(model_dir_or_spec, model, manifest, device, cfg)
    windows: dict[str, Any] = {}
    if cfg.ppl_text is not None:
        with torch.autocast(device.type, dtype=autocast or torch.float32,
                            enabled=autocast is not None):
            result["perplexity"] = perplexity_block(model, tokenizer, cfg, windows_out=windows)
        result["perplexity"]["autocast"] = dtype_name(autocast)
        faults.point("eval:ppl")
    doc_records: list[dict[str, Any]] = []
    if specs:
        lm = make_lm(model, tokenizer, backend=cfg.backend, batch_size=cfg.batch_size,
                     add_bos_token=cfg.add_bos_token, autocast_dtype=autocast)
        result["tasks"] = run_tasks(lm, specs, cfg.limit, records=doc_records)
        result["lm_eval"]["config"] = lm_config(lm)
    result.update(provenance=provenance(),
                  created=datetime.now(UTC).isoformat(timespec="seconds"),
                  labels=dict(cfg.labels))
    validate_result(result)
    result["records"] = write_records(out_json, doc_records if specs else None,
                                      windows or None)
    atomic_write_text(out_json, json.dumps(result, indent=2, sort_keys=True) + "\n")
    log.info("wrote %s", out_json)
    return result


def parameters_block(model: nn.Module, manifest: Manifest | None) -> dict[str, Any]:
    """The result's ``parameters``: the loaded model's count, and the manifest's dense count
    and achieved ratio (a model without manifest counts as dense); warns when the manifest's
    compressed count differs from the loaded model's."""
    compressed = count_parameters(model)
    if manifest is None:
        return {"dense": compressed, "compressed": compressed, "achieved_ratio": 0.0}
    stored = manifest.parameters
    if stored.compressed != compressed:
        log.warning("manifest says %s parameters, the loaded model has %d",
                    stored.compressed, compressed)
    return {"dense": stored.dense, "compressed": compressed,
            "achieved_ratio": stored.achieved_ratio}


def _result_head(model_dir: str | os.PathLike, model: Any, manifest: Manifest | None,
                 device: torch.device, cfg: EvalConfig) -> dict[str, Any]:
    """The result's fields that describe the model and the run, before any score
    (``perplexity`` None and ``tasks`` empty, filled by :func:`evaluate_model`)."""
    return {
        "schema": SCHEMA, "model_dir": str(model_dir),
        "method": manifest.method if manifest else ROLES.reference,
        "manifest_hash": manifest_hash(manifest) if manifest else None,
        "num_layers": int(model.config.num_hidden_layers),
        "parameters": parameters_block(model, manifest),
        "device": str(device),
        "trained_tokens": sum(int(h.get("tokens") or 0)
                              for h in (manifest.trainings() if manifest else [])),
        "blocks_pruned": blocks_pruned(manifest), "recovery": recovery_summary(
            manifest, model_dir),
        "perplexity": None, "tasks": {},
        "lm_eval": {"version": importlib.metadata.version("lm_eval"), "num_fewshot": 0,
                    "batch_size": cfg.batch_size, "backend": cfg.backend, "config": {}},
    }


def blocks_pruned(manifest: Manifest | None) -> int | None:
    """Blocks a block-removal method took out or replaced (its ``info.k``), else None."""
    k = manifest.info.get("k") if manifest else None
    return int(k) if isinstance(k, int) and not isinstance(k, bool) else None


def recovery_summary(manifest: Manifest | None,
                     model_dir: str | os.PathLike) -> dict[str, Any] | None:
    """What the last training of the model spent and chose (None: never trained)."""
    trains = manifest.trainings() if manifest else []
    if not trains:
        return None
    last = trains[-1]
    plan = last.get("plan") or {}
    trainable = last.get("trainable") or {}
    selection = Path(model_dir) / "selection.json"
    if selection.is_file():
        record = json.loads(selection.read_text())
        reused = [g["lr_from"] for g in record.get("grid", []) if "lr_from" in g]
        lr_source = (f"chosen by {reused[0]}" if reused
                     else f"tuning sweep of {len(record.get('trials', []))} trial(s)")
    else:
        lr_source = (plan.get("sources") or {}).get("lr", "unknown")
    return {"recipe": last.get("recipe"), "loss": last.get("loss", "lm"), "lr": plan.get("lr"),
            "gamma_lr": (plan.get("gamma_lr") if uses_own_lr(last.get("recipe"), "gamma_lr")
                         else None),
            "trainable_params": trainable.get("trainable_parameters"),
            "tokens": last.get("tokens"), "budget": trainable.get("budget"),
            "lr_source": lr_source}


def perplexity_block(model: Any, tokenizer: Any, cfg: EvalConfig,
                     windows_out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Perplexity of ``cfg.ppl_text`` by the harness's one protocol (flexigpt.methods.perplexity).

    ``windows_out``: if given, filled with the per-window record (see the module docstring;
    the value is the same as :func:`flexigpt.methods.perplexity.perplexity`'s).
    """
    assert cfg.ppl_text is not None  # callers check that there is a perplexity text
    max_pos = getattr(model.config, "max_position_embeddings", None)
    if max_pos is not None and cfg.ppl_seq_len > max_pos:
        raise ValueError(f"ppl_seq_len {cfg.ppl_seq_len} exceeds the model's "
                         f"max_position_embeddings {max_pos}")
    start = time.perf_counter()
    windows = token_windows(cfg.ppl_text, tokenizer, cfg.ppl_seq_len, cfg.ppl_windows)
    per = window_nlls(model, windows, batch_size=max(1, cfg.ppl_batch_tokens // cfg.ppl_seq_len),
                      progress=True)
    value = per.perplexity()
    seconds = time.perf_counter() - start
    log.info("perplexity %.4f over %d × %d tokens (%.1f s)", value, *windows.shape, seconds)
    block = {"value": value, "text": str(cfg.ppl_text), "text_sha256": sha256_file(cfg.ppl_text),
             "seq_len": cfg.ppl_seq_len, "n_windows": int(windows.shape[0]),
             "n_tokens": int(windows[:, 1:].numel()), "seconds": round(seconds, 3)}
    if windows_out is not None:
        windows_out.update(text=block["text"], text_sha256=block["text_sha256"],
                           seq_len=block["seq_len"], n_windows=block["n_windows"],
                           nll=per.nll, tokens=per.tokens, total_nll=per.total,
                           n_tokens=per.count)
    return block


def records_paths(out_json: str | os.PathLike) -> dict[str, Path]:
    """Where the records of the result ``out_json`` go (a pure function of its path)."""
    out = Path(out_json)
    stem = out.name[:-5] if out.name.endswith(".json") else out.name
    return {"tasks": out.with_name(f"{stem}.samples.jsonl.gz"),
            "perplexity": out.with_name(f"{stem}.windows.json")}


def _json_default(obj: Any) -> Any:
    """numpy scalars / tuples in lm-eval's samples → JSON."""
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def write_records(out_json: str | os.PathLike, docs: list[dict[str, Any]] | None,
                  windows: dict[str, Any] | None) -> dict[str, str | None]:
    """Write the per-document / per-window records of ``out_json`` atomically (a stale file
    of a kind not written this time is removed); returns the result's ``records`` field."""
    paths = records_paths(out_json)
    field_: dict[str, str | None] = {"tasks": None, "perplexity": None}
    if docs is not None:
        lines = "".join(json.dumps(d, sort_keys=True, default=_json_default) + "\n"
                        for d in docs)
        atomic_write_bytes(paths["tasks"], gzip.compress(lines.encode("utf-8"), mtime=0))
        field_["tasks"] = paths["tasks"].name
    if windows is not None:
        atomic_write_text(paths["perplexity"], json.dumps(windows, sort_keys=True) + "\n")
        field_["perplexity"] = paths["perplexity"].name
    for kind, path in paths.items():
        if field_[kind] is None and path.exists():
            path.unlink()
    return field_


def load_records(result_json: str | os.PathLike) -> dict[str, Any]:
    """The records of a result JSON: ``{"tasks": {task: [doc record, ...]} | None,
    "perplexity": windows record | None}`` (see the module docstring).

    Raises:
        FileNotFoundError: the result names no records or a records file is missing.
    """
    result_json = Path(result_json)
    data = load_result(result_json)
    names = data.get("records")
    if not names:
        raise FileNotFoundError(f"result {str(result_json)!r} has no per-document records "
                                "(written before records existed; re-evaluate it)")
    out: dict[str, Any] = {"tasks": None, "perplexity": None}
    if names.get("tasks"):
        path = result_json.parent / names["tasks"]
        tasks: dict[str, list[dict[str, Any]]] = {}
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    tasks.setdefault(rec["task"], []).append(rec)
        out["tasks"] = tasks
    if names.get("perplexity"):
        path = result_json.parent / names["perplexity"]
        out["perplexity"] = json.loads(path.read_text(encoding="utf-8"))
    return out


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
    records = data.get("records")
    if records is not None:
        if not isinstance(records, dict):
            raise ValueError(f"result field records = {records!r} is not a dict")
        for kind in ("tasks", "perplexity"):
            need(records, kind, (str, type(None)), "records.")


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
