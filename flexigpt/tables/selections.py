"""The recovery LR sweeps' records (``selection.json``): one row per trial.

:func:`read_selection` validates one record (schema 1) and :func:`collect_selections` joins
every record of a results tree; the table is :func:`flexigpt.tables.sweep.sweep_table`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.core.lr_search import AXES, NOT_SEARCHED, Bracketing, bracket_status, varied_axes
from flexigpt.tables.render import sci
from flexigpt.tables.schema import NUMBER, ResultFileError, need, need_count, need_lr, read_schema1

#: Columns of :func:`read_selection` / :func:`collect_selections` (one row per trial).
SELECTION_COLUMNS = ("file", "run", "model", "method", "variant", "setting", "ratio", "metric",
                     "tune_text", "tune_windows", "lr", "gamma_lr", "tune_ppl",
                     "tune_ppl_before", "tune_ppl_final", "rung_step", "steps",
                     "trainable_params", "tokens", "diverged", "chosen", "final_diverged",
                     "search_status", "search_neighbours", "search_trials", "searched",
                     "lr_from", "lr_reuse")


def _ppl(path: Path, obj: dict, key: str, where: str) -> float:
    """A tune PPL: a number; null, NaN and ±Infinity (a diverged trial) read as NaN / inf."""
    if not isinstance(obj, dict) or key not in obj:
        raise ResultFileError(path, f"missing required key {where + key!r}")
    value = obj[key]
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, NUMBER):
        raise ResultFileError(path, f"{where + key!r} must be a number or null, got {value!r}")
    return float(value)


def _same_lr(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def _ratio_of(setting: str) -> float | None:
    if setting.startswith("r"):
        try:
            return float(setting[1:])
        except ValueError:
            return None
    return None


def read_selection(path: str | os.PathLike) -> pd.DataFrame:
    """One LR-sweep record (``selection.json`` of a run's trained model) → one row per trial
    (:data:`SELECTION_COLUMNS`; ``chosen`` marks the selected trial).

    Schema 1: ``{"schema": 1, "run": "<model>/<method>/<variant>/<setting>", "metric",
    "tune_text", "tune_windows" (int | null), "chosen": {"lr", "gamma_lr"|null},
    "chosen_trial" (index, optional), "trials": [{"lr", "gamma_lr"|null, "tune_ppl",
    "tune_ppl_before", "trainable_params", "tokens", "diverged" (optional), "tune_ppl_final"
    (optional)}], "rung": {"step", "steps"} (optional: successive halving compared the
    trials' ``tune_ppl`` at that step)}`` (other keys, e.g. ``grid``, are ignored). A
    diverged trial may have null lr / PPL / counts; a tune PPL may be null, NaN or
    Infinity. The chosen trial (``chosen_trial``, else the first trial with the chosen
    rates) must exist, agree with ``chosen`` and not be diverged.
    """
    path = Path(path)
    data = read_schema1(path)
    head = _selection_head(path, data)
    chosen = need(path, data, "chosen", dict)
    pick = (need_lr(path, chosen, "lr", "chosen."),
            need_lr(path, chosen, "gamma_lr", "chosen.", nullable=True)
            if "gamma_lr" in chosen else None)
    trials = need(path, data, "trials", list)
    if not trials:
        raise ResultFileError(path, "'trials' is empty")
    rows = [_trial_row(path, head, i, trial) for i, trial in enumerate(trials)]
    best = _chosen_index(path, data, rows, pick)
    if rows[best]["diverged"]:
        raise ResultFileError(path, f"the chosen trial (trials[{best}]) diverged")
    rows[best]["chosen"] = True
    search = _search_columns(path, data, rows, best)
    for row in rows:
        row.update(search)
    df = pd.DataFrame(rows, columns=list(SELECTION_COLUMNS))
    for col in ("lr", "gamma_lr", "ratio", "trainable_params", "tokens", "tune_windows",
                "rung_step", "steps"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    return df


def _search_columns(path: Path, data: dict[str, Any], rows: list[dict[str, Any]],
                    best: int) -> dict[str, Any]:
    """The run's search columns: ``search_status`` (the record's own, else read from its
    trials: ``bracketed`` at spacing ≤ 2 on the axes the trials vary, or ``edge: <why>``;
    ``reuses <run>[: <reason>]`` for a run trained at another's choice), ``search_trials``,
    ``lr_from`` and ``lr_reuse`` (the config's stated reason, None if none)."""
    grid_value, search_value = data.get("grid"), data.get("search")
    grid: list[Any] = grid_value if isinstance(grid_value, list) else []
    recorded: dict[str, Any] = search_value if isinstance(search_value, dict) else {}
    lr_from = next((g["lr_from"] for g in grid if isinstance(g, dict) and "lr_from" in g), None)
    reuse = data.get("lr_reuse")
    out = {"search_trials": len(rows), "lr_from": lr_from,
           "searched": isinstance(recorded.get("rule"), dict),
           "lr_reuse": reuse if isinstance(reuse, str) else None}
    points = [{a: r[a] for a in AXES if r[a] is not None and not pd.isna(r[a])} for r in rows]
    varied = list(varied_axes(points))
    axes = [a for a in recorded.get("axes") or varied if a in AXES]
    scores = [None if r["diverged"] or not math.isfinite(r["tune_ppl"]) else r["tune_ppl"]
              for r in rows]
    found = bracket_status(points, scores, best, axes) if axes else None
    if lr_from is not None:
        status = f"reuses {lr_from}" + (f": {reuse}" if isinstance(reuse, str) else "")
    elif isinstance(recorded.get("status"), str):
        status = recorded["status"]
    else:  # a record of the fixed grid: its bracket read from the trials
        status = found["status"] if found else NOT_SEARCHED
        fixed = [a for a in AXES if a not in varied and any(a in p for p in points)]
        if found and fixed:  # an axis of the recipe the grid never moved
            status = ("edge: " if status == "bracketed" else status + "; ") + "; ".join(
                f"{a} not searched (one value)" for a in fixed)
    if isinstance(recorded.get("rule"), dict):
        try:
            Bracketing.from_dict(recorded["rule"])
        except (KeyError, TypeError, ValueError) as err:
            raise ResultFileError(path, f"'search.rule' is not a bracketing rule ({err})") from None
    out["search_neighbours"] = _neighbours_text(found) if found else ""
    return {**out, "search_status": status}


def _neighbours_text(found: dict[str, Any]) -> str:
    """``lr 2e-3: 350.1 / 8e-3: diverged`` per axis: the chosen trial's nearest trials below
    and above on each axis with their tune PPL (the score the choice was made by)."""
    parts = []
    for axis, sides in found["neighbours"].items():
        near = [f"{sci(v)}: " + ("diverged" if sc is None else f"{sc:.4g}")
                for v, sc in (sides[k] for k in ("below", "above") if sides[k] is not None)]
        if near:
            parts.append(f"{axis} " + " / ".join(near))
    return "; ".join(parts)


def _selection_head(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The columns every trial of one record shares: file, run and its four parts, ratio
    (from an ``r<ratio>`` setting), metric, tune text / windows and the successive-halving
    rung (``rung_step`` / ``steps``, None without one)."""
    run = need(path, data, "run", str)
    parts = run.split("/")
    if len(parts) != 4 or not all(parts):
        raise ResultFileError(path, f"'run' must be '<model>/<method>/<variant>/<setting>', "
                                    f"got {run!r}")
    head = {"file": str(path), "run": run, "model": parts[0], "method": parts[1],
            "variant": parts[2], "setting": parts[3], "ratio": _ratio_of(parts[3]),
            "metric": need(path, data, "metric", str),
            "tune_text": need(path, data, "tune_text", str),
            "tune_windows": need_count(path, data, "tune_windows", "", nullable=True)}
    rung = data.get("rung")
    if rung is not None:
        rung = need(path, data, "rung", dict)
        head.update(rung_step=need_count(path, rung, "step", "rung."),
                    steps=need_count(path, rung, "steps", "rung."))
    else:
        head.update(rung_step=None, steps=None)
    return head


def _trial_row(path: Path, head: dict[str, Any], i: int, trial: Any) -> dict[str, Any]:
    """Row of ``trials[i]``: ``head`` plus the trial's rates, tune PPLs, counts and
    ``diverged`` (``chosen`` False; a diverged trial may have a null lr)."""
    where = f"trials[{i}]."
    if not isinstance(trial, dict):
        raise ResultFileError(path, f"'trials[{i}]' must be an object, got {trial!r}")
    diverged = trial.get("diverged", False)
    if not isinstance(diverged, bool):
        raise ResultFileError(path, f"'{where}diverged' must be true/false, got {diverged!r}")
    return {**head, "lr": need_lr(path, trial, "lr", where, nullable=diverged),
            "gamma_lr": need_lr(path, trial, "gamma_lr", where, nullable=True)
            if "gamma_lr" in trial else None,
            "tune_ppl": _ppl(path, trial, "tune_ppl", where),
            "tune_ppl_before": _ppl(path, trial, "tune_ppl_before", where),
            "tune_ppl_final": _ppl(path, trial, "tune_ppl_final", where)
            if "tune_ppl_final" in trial else math.nan,
            "trainable_params": need_count(path, trial, "trainable_params", where,
                                           nullable=True),
            "tokens": need_count(path, trial, "tokens", where, nullable=True),
            "diverged": diverged, "chosen": False,
            "final_diverged": trial.get("final_diverged") is True}


def _chosen_index(path: Path, data: dict[str, Any], rows: list[dict[str, Any]],
                  pick: tuple[float | None, float | None]) -> int:
    """Index of the chosen trial: ``chosen_trial`` (which must carry the ``pick`` rates),
    else the first trial with the ``pick`` (lr, gamma_lr)."""
    if data.get("chosen_trial") is not None:
        best = need_count(path, data, "chosen_trial", "")
        if best >= len(rows):
            raise ResultFileError(path, f"'chosen_trial' {best} is out of range "
                                        f"({len(rows)} trials)")
        if not (_same_lr(rows[best]["lr"], pick[0])
                and _same_lr(rows[best]["gamma_lr"], pick[1])):
            raise ResultFileError(path, f"'chosen' (lr={pick[0]!r}, gamma_lr={pick[1]!r}) is not "
                                        f"trials[{best}] ('chosen_trial')")
        return best
    hits = [i for i, r in enumerate(rows)
            if _same_lr(r["lr"], pick[0]) and _same_lr(r["gamma_lr"], pick[1])]
    if not hits:
        raise ResultFileError(path, f"'chosen' (lr={pick[0]!r}, gamma_lr={pick[1]!r}) is not "
                                    "one of the trials")
    return hits[0]


def collect_selections(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """All trials of all selection records; the same run in two files is an error."""
    frames = [read_selection(p) for p in paths]
    if not frames:
        return pd.DataFrame(columns=list(SELECTION_COLUMNS))
    seen: dict[str, str] = {}
    for df in frames:
        run, file = df["run"].iloc[0], df["file"].iloc[0]
        if run in seen:
            raise ResultFileError(file, f"duplicate selection record for run {run!r}: also in "
                                        f"{seen[run]}")
        seen[run] = file
    return pd.concat(frames, ignore_index=True)
