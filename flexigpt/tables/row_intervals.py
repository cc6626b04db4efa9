"""95 % bootstrap intervals of result rows from their per-document records.

:class:`RecordStore` loads each result file's records once (``None`` for files written
before records existed: those rows keep their point values only). :func:`add_intervals`
adds ``<metric>_lo`` / ``<metric>_hi`` columns (:data:`CI_COLUMNS`, accuracies in %, PPL =
exp of the log-PPL interval) to the seed-aggregated frame, using
:func:`flexigpt.core.stats.run_intervals` over all seeds of a setting (hierarchical when there
are several). :func:`with_errors` puts the half-widths on a rendered block (``41.00 ±9.6``).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt.core import stats
from flexigpt.tables.collect import TASKS
from flexigpt.tables.schema import read_json

log = logging.getLogger(__name__)

CI_METRICS = ("ppl", *TASKS, "avg")
CI_COLUMNS = tuple(f"{m}_{s}" for m in CI_METRICS for s in ("lo", "hi"))
CI_NOTE = ("± = half-width of the 95% bootstrap interval over documents (PPL: over "
           "evaluation windows, log-PPL bootstrap mapped through exp, so the CSV's ppl_lo/"
           "ppl_hi bounds are asymmetric; seeds resampled too where a row has several); "
           "values without ± come from result files without per-document records.")
N_BOOT = stats.N_BOOT
SEED = 0


def run_key(row: Mapping[str, Any]) -> tuple:
    """A hashable (model, method, variant, ratio) of a result row or an LR-sweep record, so
    the two are matched; NaN ratio → None, else rounded."""
    ratio = row["ratio"]
    ratio = None if ratio is None or pd.isna(ratio) else round(float(ratio), 6)
    return (row["model"], row["method"], row["variant"], ratio)


def setting_key(row: Mapping[str, Any]) -> tuple:
    """A hashable (model, method, variant, ratio, stage): :func:`run_key` and the stage."""
    return (*run_key(row), row["stage"])


class RecordStore:
    """Per-document records of result files, each loaded once.

    ``runs(key)`` returns the records of every seed of a setting, or None when any of
    them has none (older result files)."""

    def __init__(self, df: pd.DataFrame | None = None) -> None:
        self._cache: dict[str, dict[str, Any] | None] = {}
        self.files: dict[tuple, list[str]] = {}
        if df is not None and not df.empty:
            for _, row in df.iterrows():
                self.files.setdefault(setting_key(row), []).append(str(row["file"]))

    def records(self, path: str | os.PathLike) -> dict[str, Any] | None:
        """The records of one result JSON, or None when it names none / they are gone."""
        key = str(path)
        if key not in self._cache:
            self._cache[key] = self._load(Path(path))
        return self._cache[key]

    @staticmethod
    def _load(path: Path) -> dict[str, Any] | None:
        from flexigpt.runtime.evaluation.results import load_records

        if not read_json(path).get("records"):
            return None
        try:
            return load_records(path)
        except FileNotFoundError as err:
            log.warning("%s: records missing (%s); point values only", path, err)
            return None

    def runs(self, key: tuple) -> list[dict[str, Any]] | None:
        files = self.files.get(key)
        if not files:
            return None
        recs = [self.records(f) for f in files]
        kept = [r for r in recs if r is not None]
        return kept if len(kept) == len(recs) else None


def _pct(iv: stats.Interval) -> tuple[float, float]:
    return 100.0 * iv.low, 100.0 * iv.high


def run_bounds(runs: list[dict[str, Any]], n_boot: int = N_BOOT,
               seed: int = SEED) -> dict[str, float]:
    """``{<metric>_lo/_hi}`` of one setting's runs (only the metrics the records allow)."""
    have = [set(r.get("tasks") or {}) for r in runs]
    tasks = [t for t in TASKS if all(t in h for h in have)]
    out: dict[str, float] = {}
    try:
        res = stats.run_intervals(runs, tasks=tasks, n_boot=n_boot, seed=seed)
    except stats.PairingError as err:
        log.warning("intervals skipped: seeds of one setting do not pair (%s)", err)
        return out
    for task, iv in res["tasks"].items():
        out[f"{task}_lo"], out[f"{task}_hi"] = _pct(iv)
    if res["average"] is not None and len(tasks) == len(TASKS):
        out["avg_lo"], out["avg_hi"] = _pct(res["average"])
    if res["log_ppl"] is not None:
        out["ppl_lo"] = math.exp(res["log_ppl"].low)
        out["ppl_hi"] = math.exp(res["log_ppl"].high)
    return out


def add_intervals(agg: pd.DataFrame, store: RecordStore, n_boot: int = N_BOOT,
                  seed: int = SEED) -> pd.DataFrame:
    """``agg`` plus :data:`CI_COLUMNS` (NaN where a setting has no records)."""
    agg = agg.copy()
    for col in CI_COLUMNS:
        agg[col] = float("nan")
    for i, row in agg.iterrows():
        runs = store.runs(setting_key(row))
        if runs is None:
            continue
        for col, value in run_bounds(runs, n_boot, seed).items():
            agg.at[i, col] = value
    return agg


def half_widths(rows: pd.DataFrame, metric: str) -> list[float | None]:
    """(hi − lo) / 2 of ``metric`` per row (None where unknown)."""
    lo, hi = f"{metric}_lo", f"{metric}_hi"
    if lo not in rows or hi not in rows:
        return [None] * len(rows)
    return [None if pd.isna(a) or pd.isna(b) else (float(b) - float(a)) / 2
            for a, b in zip(rows[lo], rows[hi])]


def with_errors(block: Any, rows: pd.DataFrame, headers: Mapping[str, str]) -> Any:
    """Attach half-widths (metric → displayed column ``headers[metric]``) to ``block``
    (rows in block order); adds :data:`CI_NOTE` when any is shown. Returns ``block``."""
    for metric, col in headers.items():
        hw = half_widths(rows.reset_index(drop=True), metric)
        if col in block.frame and any(h is not None for h in hw):
            block.errors[col] = hw
    if block.errors and CI_NOTE not in block.notes:
        block.notes.append(CI_NOTE)
    return block
