"""What another run reads from a finished one: the learning rates its sweep chose (or the
next-best ones: the sensitivity rows) and the trainable count a like-for-like LoRA is sized
to. Read by the DAG's ``train`` script (``workflow/scripts/train.py``) for runs with
``lr_from`` and ``budget``; the sweep itself is :mod:`flexigpt.runtime.training.tuning`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from flexigpt.core.fileio import CheckpointError
from flexigpt.core.lr_search import AXES, axis_neighbours
from flexigpt.runtime.training.trials import SELECTION_FILE, score_of
from flexigpt.storage.artifacts import read_manifest


def chosen_rates(trained_dir: str | os.PathLike,
                 next_best: bool = False) -> dict[str, float | None]:
    """The ``lr`` / ``gamma_lr`` another run chose (its ``selection.json``); ``next_best``:
    those of the best-scoring neighbour of its choice instead (the nearest trial below or
    above on each learning-rate axis it searched; without one, the best other trial).

    Raises:
        ValueError: no selection, or (``next_best``) no other trial with a finite score.
    """
    path = Path(trained_dir) / SELECTION_FILE
    try:
        selection = json.loads(path.read_text())
        chosen = selection["chosen"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"{path}: no learning-rate selection ({err})") from None
    if not next_best:
        return {"lr": chosen["lr"], "gamma_lr": chosen["gamma_lr"]}
    trials = selection.get("trials") or []
    best = int(selection.get("chosen_trial") or 0)
    axes = [a for a in AXES if any(t.get(a) is not None for t in trials)]
    points = [{a: t[a] for a in axes if t.get(a) is not None} for t in trials]
    scores = [score_of(t) for t in trials]
    scored = [i for i, score in enumerate(scores) if score is not None and i != best]
    near = [i for i in axis_neighbours(points, best, axes) if i in scored]
    pool = near or scored
    if not pool:
        raise ValueError(f"{path}: no next-best learning rate (every other trial diverged)")
    other = trials[min(pool, key=lambda i: (scores[i], i))]
    return {"lr": other["lr"], "gamma_lr": other.get("gamma_lr")}


def budget_of(compressed_dir: str | os.PathLike) -> int:
    """Trainable count a like-for-like baseline is matched to: the ``info.recovery
    .trainable_params`` that FlexiGPT pruning/extension records in its manifest."""
    path = Path(compressed_dir) / "manifest.json"
    try:
        value = read_manifest(compressed_dir).info["recovery"]["trainable_params"]
    except (CheckpointError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: no info.recovery.trainable_params to match ({err})") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: info.recovery.trainable_params must be a positive integer")
    return value
