"""Read evaluation / timing JSONs, training logs and manifests into pandas frames.

Every reader validates its input and raises :class:`ResultFileError` (a ``ValueError``)
naming the offending file and key; a listed file that does not exist raises
``FileNotFoundError`` naming it. Discovery (:func:`discover`) walks a results tree and
classifies JSON files by content, so the DAG's file naming is not hard-coded here.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)

#: The paper's five zero-shot tasks, in its column order.
TASKS: tuple[str, ...] = ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")
STAGES = ("start", "final")
#: Keys of one result row that identify a setting (seed excluded).
SETTING_KEYS = ("model", "method", "variant", "ratio", "stage")
TRAIN_LOG_COLUMNS = ("step", "tokens", "loss", "lr", "ppl")
#: HF / tooling JSON names under a results tree that are never results.
_SKIP_NAMES = {"config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "model.safetensors.index.json", "vocab.json", "manifest.json"}
_MAX_JSON_BYTES = 20 << 20


class ResultFileError(ValueError):
    """An input file is unreadable or does not follow its schema; the message names it."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)


@dataclass
class Inputs:
    """Files the table/plot builders read (any list may be empty)."""

    results: list[Path] = field(default_factory=list)
    timings: list[Path] = field(default_factory=list)
    train_logs: list[Path] = field(default_factory=list)
    manifests: list[Path] = field(default_factory=list)


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; missing → FileNotFoundError, bad JSON → ResultFileError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"result file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultFileError(path, f"not valid JSON ({err})") from None


def discover(results_dir: str | os.PathLike) -> Inputs:
    """Find result/timing JSONs, ``train_log.csv`` files and FlexiGPT manifests.

    JSONs are classified by content: ``schema`` and ``labels`` → evaluation result (other
    JSONs with task scores, e.g. benchmark-script outputs, are not results); ``rows`` with
    ``schema`` or ``batch`` → timing. Hidden directories, HF checkpoint files and files over
    20 MiB are skipped. A JSON that does not parse is an error (it names the file).
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory not found: {root}")
    found = Inputs()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        if path.name == "train_log.csv":
            found.train_logs.append(path)
        elif path.name == "manifest.json":
            found.manifests.append(path)
        elif (path.suffix == ".json" and path.name not in _SKIP_NAMES
              and path.stat().st_size <= _MAX_JSON_BYTES):
            data = read_json(path)
            if not isinstance(data, dict):
                continue
            if {"schema", "labels"} <= data.keys():
                found.results.append(path)  # validated strictly later (schema included)
            elif "rows" in data and ("schema" in data or "batch" in data):
                found.timings.append(path)
    log.info("found %d result, %d timing, %d train-log and %d manifest files under %s",
             len(found.results), len(found.timings), len(found.train_logs),
             len(found.manifests), root)
    return found


def _need(path: Path, obj: Any, key: str, types: type | tuple[type, ...], where: str = "",
          nullable: bool = False) -> Any:
    """``obj[key]`` checked against ``types`` (bool is never a number)."""
    name = f"{where}{key}"
    if not isinstance(obj, dict) or key not in obj:
        raise ResultFileError(path, f"missing required key {name!r}")
    value = obj[key]
    if value is None and nullable:
        return None
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ResultFileError(path, f"{name!r} must be {types}, got {value!r}")
    if not isinstance(value, types):
        raise ResultFileError(path, f"{name!r} must be {types}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ResultFileError(path, f"{name!r} is not finite: {value!r}")
    return value


_NUM = (int, float)


def parse_result(path: str | os.PathLike) -> dict[str, Any]:
    """One evaluation JSON → a flat row (task values in %, ratio None→0 for dense).

    Row keys: file, model, method, variant, ratio, stage, seed, trained, num_layers, params_dense,
    params_compressed, achieved_ratio, ppl, ppl_text, ppl_seq_len, one column per task
    (accuracy in %), ``metric:<task>``, ``n_docs:<task>``, ``limit:<task>``.
    """
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ResultFileError(path, "top level must be a JSON object")
    if _need(path, data, "schema", int) != 1:
        raise ResultFileError(path, f"unsupported schema {data['schema']!r} (expected 1)")
    _need(path, data, "method", str)
    labels = _need(path, data, "labels", dict)
    params = _need(path, data, "parameters", dict)
    row: dict[str, Any] = {
        "file": str(path),
        "model": _need(path, labels, "model", str, "labels."),
        "method": _need(path, labels, "method", str, "labels."),
        "variant": _need(path, labels, "variant", str, "labels."),
        "ratio": _need(path, labels, "ratio", _NUM, "labels.", nullable=True),
        "stage": _need(path, labels, "stage", str, "labels."),
        "seed": _need(path, labels, "seed", int, "labels."),
        "num_layers": _need(path, data, "num_layers", int),
        "params_dense": _need(path, params, "dense", int, "parameters.", nullable=True),
        "params_compressed": _need(path, params, "compressed", int, "parameters."),
        "achieved_ratio": _need(path, params, "achieved_ratio", _NUM, "parameters.",
                                nullable=True),
    }
    trained = data.get("trained_tokens")  # absent in older files: the DAG's directory layout
    row["trained"] = (bool(_need(path, data, "trained_tokens", int)) if trained is not None
                      else Path(str(data.get("model_dir", ""))).name == "trained")
    if row["stage"] not in STAGES:
        raise ResultFileError(path, f"labels.stage must be one of {STAGES}, got {row['stage']!r}")
    if row["method"] == "dense":  # the uncompressed model: ratio 0 by definition
        row["ratio"] = 0.0 if row["ratio"] is None else row["ratio"]
        row["achieved_ratio"] = 0.0 if row["achieved_ratio"] is None else row["achieved_ratio"]
    ppl = _need(path, data, "perplexity", dict, nullable=True)
    row["ppl"] = None if ppl is None else float(_need(path, ppl, "value", _NUM, "perplexity."))
    row["ppl_text"] = None if ppl is None else "/".join(Path(str(ppl.get("text", ""))).parts[-2:])
    row["ppl_seq_len"] = None if ppl is None else ppl.get("seq_len")
    for task, entry in _need(path, data, "tasks", dict).items():
        where = f"tasks.{task}."
        value = _need(path, entry, "value", _NUM, where)
        if not 0.0 <= value <= 1.0:
            raise ResultFileError(path, f"{where}value must be a fraction in [0, 1], got {value!r}")
        row[task] = 100.0 * value
        row[f"metric:{task}"] = _need(path, entry, "metric", str, where)
        row[f"n_docs:{task}"] = entry.get("n_docs")
        row[f"limit:{task}"] = entry.get("limit")
    return row


def collect_results(paths: list[str | os.PathLike]) -> pd.DataFrame:
    """Validated rows of all result files; duplicate (setting, seed) pairs are an error."""
    rows = [parse_result(p) for p in paths]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for task in TASKS:
        if task not in df:
            df[task] = float("nan")
    df["ratio"] = df["ratio"].astype(float)
    key = [*SETTING_KEYS, "seed"]
    for setting, group in df.groupby(key, dropna=False, sort=False):
        if len(group) > 1:
            files = group["file"].tolist()
            raise ResultFileError(files[0], f"duplicate result for {dict(zip(key, setting))}: "
                                            f"also in {files[1:]}")
    return df


def parse_timing(path: str | os.PathLike) -> pd.DataFrame:
    """One inference-timing JSON → rows (model, batch, seq_len, method, variant, ratio,
    seconds, tokens_per_s, relative_time, relative_throughput; relative_* are fractions
    of the reference model, 1.0 = same)."""
    path = Path(path)
    data = read_json(path)
    if _need(path, data, "schema", int) != 1:
        raise ResultFileError(path, f"unsupported schema {data['schema']!r} (expected 1)")
    head = {"file": str(path), "model": _need(path, data, "model", str),
            "batch": _need(path, data, "batch", int), "seq_len": _need(path, data, "seq_len", int)}
    rows = []
    for i, entry in enumerate(_need(path, data, "rows", list)):
        where = f"rows[{i}]."
        rows.append({**head, "method": _need(path, entry, "method", str, where),
                     "variant": _need(path, entry, "variant", str, where),
                     "ratio": _need(path, entry, "ratio", _NUM, where, nullable=True),
                     **{k: float(_need(path, entry, k, _NUM, where)) for k in
                        ("seconds", "tokens_per_s", "relative_time", "relative_throughput")}})
    if not rows:
        raise ResultFileError(path, "'rows' is empty")
    return pd.DataFrame(rows)


def collect_timings(paths: list[str | os.PathLike]) -> pd.DataFrame:
    """All timing rows of all files (empty frame for no files)."""
    frames = [parse_timing(p) for p in paths]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def read_train_log(path: str | os.PathLike) -> pd.DataFrame:
    """A ``train_log.csv`` (columns step, tokens, loss, lr, ppl) with numeric columns."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training log not found: {path}")
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ResultFileError(path, f"not a readable CSV ({err})") from None
    missing = [c for c in TRAIN_LOG_COLUMNS if c not in df.columns]
    if missing:
        raise ResultFileError(path, f"missing column(s) {missing}; has {list(df.columns)}")
    for col in TRAIN_LOG_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    if df["loss"].notna().sum() == 0:
        raise ResultFileError(path, "no numeric 'loss' values")
    return df


def read_flexigpt_manifest(path: str | os.PathLike) -> dict[str, Any] | None:
    """The BI / base-selection record of a FlexiGPT manifest, or None for other methods.

    Returns ``{"file", "method", "model", "ratio", "block_influence" [L],
    "pruned_blocks" [k], "base_map" {pruned: base}, "distance_matrix" [L][L] | None}``.
    """
    path = Path(path)
    data = read_json(path)
    info = data.get("info") if isinstance(data, dict) else None
    if (not isinstance(info, dict) or data.get("method") != "flexigpt"
            or "block_influence" not in info):
        return None  # ShortGPT records BI too, but has no replacements to plot
    scores = _need(path, info, "block_influence", list, "info.")
    pruned = _need(path, info, "pruned_blocks", list, "info.")
    base_map = info.get("base_map") or {}
    if not isinstance(base_map, dict):
        raise ResultFileError(path, f"'info.base_map' must be an object, got {base_map!r}")
    matrix = info.get("distance_matrix")
    if matrix is not None and (len(matrix) != len(scores)
                               or any(len(r) != len(scores) for r in matrix)):
        raise ResultFileError(path, f"'info.distance_matrix' must be {len(scores)}x{len(scores)}")
    cfg = data.get("config") or {}
    return {"file": str(path), "method": data.get("method"),
            "model": Path(str(data.get("base_model", "?"))).name,
            "ratio": cfg.get("ratio"), "block_influence": [float(s) for s in scores],
            "pruned_blocks": [int(b) for b in pruned],
            "base_map": {int(k): int(v) for k, v in base_map.items()},
            "distance_matrix": matrix}
