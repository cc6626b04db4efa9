"""The record formats of a learning-rate sweep: one trial's record (``trial.json``, and the
rung and final records :mod:`flexigpt.runtime.training.tuning` caches), the selection a
sweep publishes (``selection.json``), and how a record is scored (the lowest finite tuning
perplexity wins; a diverged trial has no score).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flexigpt.runtime.training.recipe_table import uses_own_lr

if TYPE_CHECKING:
    from flexigpt.storage.manifest import Manifest

TRIAL_FILE = "trial.json"
SELECTION_FILE = "selection.json"
SCHEMA = 1
#: trial fields a selection lists only where a sweep recorded them (the rung check: a trial
#: that diverged after the rung while continued beside the chosen one)
OPTIONAL_TRIAL_KEYS = ("final_diverged",)


def trial_record(manifest: Manifest, point: dict[str, Any]) -> dict[str, Any]:
    """The ``trial.json`` of a finished trial, from the trained model's manifest."""
    entry = manifest.history[-1]
    return {**scored_record(point, entry["plan"], entry["trainable"], entry["final_ppl"],
                      entry["ppl_before"], entry["tokens"]),
            "loss": entry.get("loss", "lm")}


def scored_record(point: dict[str, Any], plan: dict[str, Any], trainable: dict[str, Any],
            tune_ppl: float | None, tune_ppl_before: float | None,
            tokens: int) -> dict[str, Any]:
    """The fields every scored trial record has (its learning rates from the resolved
    ``plan``, counts from the trainable report)."""
    return {"schema": SCHEMA, "point": point, "diverged": False, "lr": plan["lr"],
            "gamma_lr": plan["gamma_lr"] if uses_own_lr(plan["recipe"], "gamma_lr") else None,
            "tune_ppl": tune_ppl, "tune_ppl_before": tune_ppl_before,
            "trainable_params": trainable["trainable_parameters"], "tokens": tokens,
            "recipe": plan["recipe"], "budget": trainable.get("budget")}


def diverged_record(point: dict[str, Any], lr: float | None, gamma_lr: float | None,
                    error: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "point": point, "diverged": True, "lr": lr, "gamma_lr": gamma_lr,
            "tune_ppl": None, "tune_ppl_before": None, "error": error}


def read_trial(trial_dir: str | os.PathLike) -> dict[str, Any]:
    """``trial.json`` of one trial directory (ValueError naming it when absent/malformed)."""
    path = Path(trial_dir) / TRIAL_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a trial record ({err})") from None
    if record.get("schema") != SCHEMA or "diverged" not in record:
        raise ValueError(f"{path}: not a schema-{SCHEMA} trial record")
    return record


def best_trial(records: list[dict[str, Any]]) -> int:
    """Index of the record with the lowest finite ``tune_ppl`` (ties: the first).

    Raises:
        ValueError: every trial diverged or has no finite tuning perplexity.
    """
    scored = [(r["tune_ppl"], i) for i, r in enumerate(records) if finite_score(r)]
    if not scored:
        raise ValueError(f"no trial of {len(records)} finished with a finite tuning perplexity")
    return min(scored)[1]


def selection_record(meta: dict[str, Any], records: list[dict[str, Any]], best: int) -> dict[str, Any]:
    """The ``selection.json`` of a sweep: ``meta``, every trial's fields, the chosen one."""
    keys = ("lr", "gamma_lr", "tune_ppl", "tune_ppl_before", "tune_ppl_final",
            "stopped_at_step", "trainable_params", "tokens", "diverged", "budget")
    return {"schema": SCHEMA, **meta, "metric": "tune_ppl", "chosen_trial": best,
            "chosen": {"lr": records[best]["lr"], "gamma_lr": records[best]["gamma_lr"]},
            "trials": [{**{k: r.get(k) for k in keys},
                        **{k: r[k] for k in OPTIONAL_TRIAL_KEYS if k in r}}
                       for r in records]}


def score_of(record: dict[str, Any]) -> float | None:
    """The score a search compares (None: diverged or not finite)."""
    return float(record["tune_ppl"]) if finite_score(record) else None


def finite_score(record: dict[str, Any]) -> bool:
    """Not diverged and a finite ``tune_ppl``: the records a sweep may choose from."""
    value = record.get("tune_ppl")
    return (not record.get("diverged") and isinstance(value, (int, float))
            and math.isfinite(value))
