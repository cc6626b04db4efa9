"""Learning-rate selection on the tuning split: one trained model per trial, keep the best.

A *trial* is one recovery run of a model at one point of its recipe's tuning grid (``lr``,
and ``gamma_lr`` for the ``flexigpt`` recipe). The DAG's ``train_trial`` rule
(``workflow/scripts/train.py``) trains it and writes ``trial.json`` (:func:`trial_record`,
:func:`diverged_record`) into its directory: the trial's point, its tuning-split perplexity before and
after training (``final_ppl`` of the trainer, whose ``validation`` text is the tuning split)
or ``diverged``. :func:`select_trial` keeps the trial with the lowest finite tuning
perplexity (ties: the earlier trial), links its files into the run's ``trained/`` directory
and adds ``selection.json`` listing every trial. The perplexity test text is never read here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

from flexigpt.artifacts import atomic_directory, atomic_write_text

log = logging.getLogger(__name__)

TRIAL_FILE = "trial.json"
SELECTION_FILE = "selection.json"
SCHEMA = 1


def trial_record(manifest: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    """The ``trial.json`` of a finished trial, from the trained model's manifest."""
    entry = manifest["history"][-1]
    plan = entry["plan"]
    budget = entry["trainable"].get("budget")
    return {"schema": SCHEMA, "point": point, "diverged": False,
            "lr": plan["lr"], "gamma_lr": plan["gamma_lr"] if plan["recipe"] == "flexigpt"
            else None, "tune_ppl": entry["final_ppl"], "tune_ppl_before": entry["ppl_before"],
            "trainable_params": entry["trainable"]["trainable_parameters"],
            "tokens": entry["tokens"], "recipe": plan["recipe"], "loss": entry.get("loss", "lm"),
            "budget": budget}


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
    scored = [(r["tune_ppl"], i) for i, r in enumerate(records)
              if not r["diverged"] and isinstance(r.get("tune_ppl"), (int, float))
              and math.isfinite(r["tune_ppl"])]
    if not scored:
        raise ValueError(f"no trial of {len(records)} finished with a finite tuning perplexity")
    return min(scored)[1]


def select_trial(trial_dirs: list[str | os.PathLike], out_dir: str | os.PathLike,
                 meta: dict[str, Any]) -> dict[str, Any]:
    """Keep the best trial as ``out_dir`` (hard links where possible) + ``selection.json``.

    ``meta`` is copied into the selection record (run name, tuning text and windows).
    Returns the selection record.
    """
    records = [read_trial(d) for d in trial_dirs]
    best = best_trial(records)
    chosen = Path(trial_dirs[best])
    selection = {"schema": SCHEMA, **meta, "metric": "tune_ppl", "chosen_trial": best,
                 "chosen": {"lr": records[best]["lr"], "gamma_lr": records[best]["gamma_lr"]},
                 "trials": [{k: r.get(k) for k in ("lr", "gamma_lr", "tune_ppl",
                                                   "tune_ppl_before", "trainable_params",
                                                   "tokens", "diverged", "budget")}
                            for r in records]}
    with atomic_directory(out_dir) as staged:
        staged.rmdir()
        shutil.copytree(chosen, staged, copy_function=_link_or_copy)
        (staged / TRIAL_FILE).unlink()
        atomic_write_text(staged / SELECTION_FILE, json.dumps(selection, indent=2) + "\n")
    log.info("chose trial %d of %d (lr %s, gamma_lr %s, tune ppl %.4f)", best, len(records),
             selection["chosen"]["lr"], selection["chosen"]["gamma_lr"],
             records[best]["tune_ppl"])
    return selection


def chosen_rates(trained_dir: str | os.PathLike) -> dict[str, float | None]:
    """The ``lr`` / ``gamma_lr`` another run chose (its ``selection.json``)."""
    path = Path(trained_dir) / SELECTION_FILE
    try:
        chosen = json.loads(path.read_text())["chosen"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"{path}: no learning-rate selection ({err})") from None
    return {"lr": chosen["lr"], "gamma_lr": chosen["gamma_lr"]}


def budget_of(compressed_dir: str | os.PathLike) -> int:
    """Trainable count a like-for-like baseline is matched to: the ``info.recovery
    .trainable_params`` that FlexiGPT pruning/extension records in its manifest."""
    path = Path(compressed_dir) / "manifest.json"
    try:
        value = json.loads(path.read_text())["info"]["recovery"]["trainable_params"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: no info.recovery.trainable_params to match ({err})") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: info.recovery.trainable_params must be a positive integer")
    return value


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
