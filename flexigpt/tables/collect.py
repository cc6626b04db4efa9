"""Read evaluation / timing JSONs, training logs and manifests into pandas frames.

Every reader validates its input with :mod:`flexigpt.tables.schema` and raises
:class:`~flexigpt.tables.schema.ResultFileError` (a ``ValueError``) naming the offending file
and key; a listed file that does not exist raises ``FileNotFoundError`` naming it.
Discovery (:func:`discover`) walks a results tree and classifies JSON files by content, so
the DAG's file naming is not hard-coded here.

Result files may carry the comparison fields of the matched-protocol DAG (all optional, so
older files still read): ``labels.table`` (which table the row belongs to, one of
:data:`TABLES`), ``labels.loss`` / ``labels.protocol``, top-level ``blocks_pruned`` and
``recovery`` (recipe, loss, lr, gamma_lr, trainable_params, tokens, budget, lr_source).
Without ``labels.table`` a row is classified by :func:`classify` (today's method/variant
rules). A budget-ladder point (table ``budget``) also carries ``labels.budget_tokens`` (its
token budget) and ``labels.budget_variant`` (the Table 1 variant it recovers again).
LR-sweep records (``selection.json``) are found here and read by
:func:`flexigpt.tables.selections.read_selection`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.schema import (
    NUMBER,
    ResultFileError,
    need,
    need_choice,
    need_count,
    need_lr,
    need_optional,
    read_json,
    read_schema1,
)

log = logging.getLogger(__name__)

#: The paper's five zero-shot tasks, in its column order.
TASKS: tuple[str, ...] = ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag")
STAGES = ("start", "final")
#: Keys of one result row that identify a setting (seed excluded).
SETTING_KEYS = ("model", "method", "variant", "ratio", "stage")
TRAIN_LOG_COLUMNS = ("step", "tokens", "loss", "lr", "ppl")
#: Values of ``labels.table``: which table a result row belongs to.
TABLES = ("main", "paper_protocol", "kd", "ablation", "extension", "dense", "budget",
          "sensitivity")
LOSSES = ("lm", "kd")
PROTOCOLS = ("matched", "paper")
#: FlexiGPT variants that are ablations when a file has no ``labels.table``.
_ABLATION_VARIANTS = ("no_lowrank", "no_outnorm", "no_svdinit", "frobenius")
#: Per-row columns from the optional comparison fields (NaN / None when absent).
RECOVERY_COLUMNS = ("table", "labels_table", "loss", "protocol", "blocks_pruned", "recipe",
                    "lr", "gamma_lr", "trainable_params", "tokens", "lr_source",
                    "budget_target", "budget_achieved", "budget_rel_error", "budget_source",
                    "budget_tokens", "budget_variant")
_NUMERIC_RECOVERY = ("blocks_pruned", "lr", "gamma_lr", "trainable_params", "tokens",
                     "budget_target", "budget_achieved", "budget_rel_error", "budget_tokens")
#: HF / tooling JSON names under a results tree that are never results.
_SKIP_NAMES = {"config.json", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
               "model.safetensors.index.json", "vocab.json", "manifest.json"}
_MAX_JSON_BYTES = 20 << 20


@dataclass
class Inputs:
    """Files the table/plot builders read (any list may be empty)."""

    results: list[Path] = field(default_factory=list)
    timings: list[Path] = field(default_factory=list)
    train_logs: list[Path] = field(default_factory=list)
    manifests: list[Path] = field(default_factory=list)
    selections: list[Path] = field(default_factory=list)


def discover(results_dir: str | os.PathLike) -> Inputs:
    """Find result/timing JSONs, ``train_log.csv`` files, FlexiGPT manifests and LR sweeps.

    JSONs are classified by content: ``schema`` and ``labels`` → evaluation result (other
    JSONs with task scores, e.g. benchmark-script outputs, are not results); ``rows`` with
    ``schema`` or ``batch`` → timing; ``schema``, ``trials`` and ``chosen`` → LR-sweep
    selection record. Hidden directories, HF checkpoint files and files over
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
            elif {"schema", "trials", "chosen"} <= data.keys():
                found.selections.append(path)
            elif "rows" in data and ("schema" in data or "batch" in data):
                found.timings.append(path)
    log.info("found %d result, %d timing, %d train-log, %d manifest and %d selection files "
             "under %s", len(found.results), len(found.timings), len(found.train_logs),
             len(found.manifests), len(found.selections), root)
    return found


def classify(method: str, variant: str) -> str:
    """The table of a row without ``labels.table`` (the rules before that label existed)."""
    if method == ROLES.reference:
        return "dense" if variant == "default" else "extension"
    if method == ROLES.extension:
        return "extension"
    if method == ROLES.subject and variant in _ABLATION_VARIANTS:
        return "ablation"
    if variant == "paper" or variant.endswith("_paper"):
        return "paper_protocol"
    if variant == "kd" or variant.endswith("_kd"):
        return "kd"
    return "main"


def parse_recovery(path: str | os.PathLike, rec: Any) -> dict[str, Any]:
    """A result file's ``recovery`` object → flat columns (see :data:`RECOVERY_COLUMNS`).

    ``loss`` is required (``lm`` | ``kd``); the other fields may be null or absent (shown
    as –) but are type-checked when present: ``recipe``/``lr_source`` str, ``lr``/
    ``gamma_lr`` > 0, ``trainable_params``/``tokens`` ints >= 0, ``budget`` null or an
    object with ``target``, ``achieved`` (ints), ``rel_error`` (number) and optionally
    ``source`` (str).
    """
    path, where = Path(path), "recovery."
    if not isinstance(rec, dict):
        raise ResultFileError(path, f"'recovery' must be an object or null, got {rec!r}")
    loss = need(path, rec, "loss", str, where)
    if loss not in LOSSES:
        raise ResultFileError(path, f"recovery.loss must be one of {LOSSES}, got {loss!r}")
    out: dict[str, Any] = {
        "recipe": need_optional(path, rec, "recipe", str, where), "loss": loss,
        "lr": need_lr(path, rec, "lr", where, nullable=True) if "lr" in rec else None,
        "gamma_lr": need_lr(path, rec, "gamma_lr", where, nullable=True) if "gamma_lr" in rec
        else None,
        "trainable_params": need_count(path, rec, "trainable_params", where, nullable=True)
        if "trainable_params" in rec else None,
        "tokens": need_count(path, rec, "tokens", where, nullable=True) if "tokens" in rec
        else None,
        "lr_source": need_optional(path, rec, "lr_source", str, where),
        "budget_target": None, "budget_achieved": None, "budget_rel_error": None,
        "budget_source": None}
    budget = need_optional(path, rec, "budget", dict, where)
    if budget is not None:
        bw = "recovery.budget."
        out.update(budget_target=need_count(path, budget, "target", bw),
                   budget_achieved=need_count(path, budget, "achieved", bw),
                   budget_rel_error=float(need(path, budget, "rel_error", NUMBER, bw)),
                   budget_source=need_optional(path, budget, "source", str, bw))
    return out


def parse_result(path: str | os.PathLike) -> dict[str, Any]:
    """One evaluation JSON → a flat row (task values in %, ratio None→0 for dense).

    Row keys: file, model, method, variant, ratio, stage, seed, trained, num_layers, params_dense,
    params_compressed, achieved_ratio, ppl, ppl_text, ppl_seq_len, one column per task
    (accuracy in %), ``metric:<task>``, ``n_docs:<task>``, ``limit:<task>``, and
    :data:`RECOVERY_COLUMNS`: ``table`` (``labels.table``, else :func:`classify`),
    ``labels_table`` (the label as written, None when absent), ``loss`` (labels or
    recovery), ``protocol``, ``blocks_pruned``, ``tokens`` (``recovery.tokens``, else the
    older ``trained_tokens`` when > 0) and the other ``recovery`` fields. ``trained`` is
    ``recovery is not None`` when the file has ``recovery``.
    """
    path = Path(path)
    data = read_schema1(path)
    need(path, data, "method", str)
    labels = need(path, data, "labels", dict)
    params = need(path, data, "parameters", dict)
    row: dict[str, Any] = {
        "file": str(path),
        "model": need(path, labels, "model", str, "labels."),
        "method": need(path, labels, "method", str, "labels."),
        "variant": need(path, labels, "variant", str, "labels."),
        "ratio": need(path, labels, "ratio", NUMBER, "labels.", nullable=True),
        "stage": need(path, labels, "stage", str, "labels."),
        "seed": need(path, labels, "seed", int, "labels."),
        "num_layers": need(path, data, "num_layers", int),
        "params_dense": need(path, params, "dense", int, "parameters.", nullable=True),
        "params_compressed": need(path, params, "compressed", int, "parameters."),
        "achieved_ratio": need(path, params, "achieved_ratio", NUMBER, "parameters.",
                                nullable=True),
    }
    trained = data.get("trained_tokens")  # absent in older files: the DAG's directory layout
    row["trained"] = (bool(need(path, data, "trained_tokens", int)) if trained is not None
                      else Path(str(data.get("model_dir", ""))).name == "trained")
    if row["stage"] not in STAGES:
        raise ResultFileError(path, f"labels.stage must be one of {STAGES}, got {row['stage']!r}")
    row.update(_comparison_fields(path, data, labels, row))
    if row["method"] == ROLES.reference:  # the uncompressed model: ratio 0 by definition
        row["ratio"] = 0.0 if row["ratio"] is None else row["ratio"]
        row["achieved_ratio"] = 0.0 if row["achieved_ratio"] is None else row["achieved_ratio"]
    ppl = need(path, data, "perplexity", dict, nullable=True)
    row["ppl"] = None if ppl is None else float(need(path, ppl, "value", NUMBER, "perplexity."))
    row["ppl_text"] = None if ppl is None else "/".join(Path(str(ppl.get("text", ""))).parts[-2:])
    row["ppl_seq_len"] = None if ppl is None else ppl.get("seq_len")
    for task, entry in need(path, data, "tasks", dict).items():
        where = f"tasks.{task}."
        value = need(path, entry, "value", NUMBER, where)
        if not 0.0 <= value <= 1.0:
            raise ResultFileError(path, f"{where}value must be a fraction in [0, 1], got {value!r}")
        row[task] = 100.0 * value
        row[f"metric:{task}"] = need(path, entry, "metric", str, where)
        row[f"n_docs:{task}"] = entry.get("n_docs")
        row[f"limit:{task}"] = entry.get("limit")
    return row


def _comparison_fields(path: Path, data: dict, labels: dict, row: dict) -> dict[str, Any]:
    """The optional table / protocol / recovery fields of one result file (validated)."""
    out: dict[str, Any] = dict.fromkeys(RECOVERY_COLUMNS)
    out["labels_table"] = need_choice(path, labels, "table", TABLES, "labels.")
    out["table"] = out["labels_table"] or classify(row["method"], row["variant"])
    out["protocol"] = need_choice(path, labels, "protocol", PROTOCOLS, "labels.")
    out["budget_tokens"] = need_optional(path, labels, "budget_tokens", int, "labels.")
    out["budget_variant"] = need_optional(path, labels, "budget_variant", str, "labels.")
    if "blocks_pruned" in data:
        out["blocks_pruned"] = need_count(path, data, "blocks_pruned", "", nullable=True)
    if "recovery" in data:
        rec = data["recovery"]
        if rec is not None:
            out.update(parse_recovery(path, rec))
        row["trained"] = rec is not None
    elif row["trained"] and isinstance(data.get("trained_tokens"), int):
        out["tokens"] = data["trained_tokens"]
    label_loss = need_choice(path, labels, "loss", LOSSES, "labels.")
    if label_loss is not None and out["loss"] is not None and label_loss != out["loss"]:
        raise ResultFileError(path, f"labels.loss {label_loss!r} disagrees with recovery.loss "
                                    f"{out['loss']!r}")
    out["loss"] = label_loss or out["loss"]
    return out


def collect_results(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """Validated rows of all result files; duplicate (setting, seed) pairs are an error."""
    rows = [parse_result(p) for p in paths]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for task in TASKS:
        if task not in df:
            df[task] = float("nan")
    df["ratio"] = df["ratio"].astype(float)
    for col in _NUMERIC_RECOVERY:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
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
    if need(path, data, "schema", int) != 1:
        raise ResultFileError(path, f"unsupported schema {data['schema']!r} (expected 1)")
    head = {"file": str(path), "model": need(path, data, "model", str),
            "batch": need(path, data, "batch", int), "seq_len": need(path, data, "seq_len", int)}
    rows = []
    for i, entry in enumerate(need(path, data, "rows", list)):
        where = f"rows[{i}]."
        rows.append({**head, "method": need(path, entry, "method", str, where),
                     "variant": need(path, entry, "variant", str, where),
                     "ratio": need(path, entry, "ratio", NUMBER, where, nullable=True),
                     **{k: float(need(path, entry, k, NUMBER, where)) for k in
                        ("seconds", "tokens_per_s", "relative_time", "relative_throughput")}})
    if not rows:
        raise ResultFileError(path, "'rows' is empty")
    return pd.DataFrame(rows)


def collect_timings(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
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
    if (not isinstance(info, dict) or data.get("method") != ROLES.subject
            or "block_influence" not in info):
        return None  # ShortGPT records BI too, but has no replacements to plot
    scores = need(path, info, "block_influence", list, "info.")
    pruned = need(path, info, "pruned_blocks", list, "info.")
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


