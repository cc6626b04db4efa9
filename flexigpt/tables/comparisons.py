"""Paired comparisons of result rows (``comparisons.md/.csv``) via
:func:`stats.paired_replicates` (the engine of :func:`stats.compare_runs`: same numbers).

A :class:`Comparator` gives the paired A − B difference of one metric between two
settings (keys of :func:`~flexigpt.tables.row_intervals.setting_key`): accuracy per task and
the task average in points (%), log-PPL in nats. Each cell is a :class:`Diff` (its 95 %
interval and its bootstrap replicates, for multiplicity-controlled verdicts) whose
``status`` says why there is no interval: ``not run`` (a setting is not in the results),
``no records`` (a result file predates per-document records, or the metric was not
evaluated), ``unpaired`` (the runs scored different documents / windows:
:class:`stats.PairingError`). Results are cached per (A, B, metric).

The table pairs, per model: every Table 1 row with the dense model, every FlexiGPT row of
Table 1 with its like-for-like baseline (ShortGPT + LoRA at the same ratio), the
paper-protocol FlexiGPT with the paper-protocol ShortGPT + LoRA, and every KD row with the
same method's LM-loss recovery.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from flexigpt.core import stats
from flexigpt.storage.registry import ROLES
from flexigpt.tables.collect import TASKS
from flexigpt.tables.labels import METHOD_LABELS, TASK_HEADERS, lm_variant, row_label
from flexigpt.tables.render import Block, Table
from flexigpt.tables.row_intervals import RecordStore, setting_key
from flexigpt.tables.rows import main_rows, table_rows

log = logging.getLogger(__name__)

#: metrics of a comparison, in column order (log_ppl: nats, the others: points).
METRICS = ("log_ppl", *TASKS, "avg")
HEADERS = {"log_ppl": "Δ log-PPL", **{t: f"Δ {h}" for t, h in TASK_HEADERS.items()},
           "avg": "Δ Avg"}
OK, NOT_RUN, NO_RECORDS, UNPAIRED = "ok", "not run", "no records", "unpaired"


@dataclass(frozen=True, eq=False)
class Diff:
    """One paired difference A − B: ``interval`` and its bootstrap ``replicates``
    (``[n_boot]``, the same units) when ``status == "ok"``; ``seed_source``: where a
    one-seed side's seed component came from when it was borrowed from another budget of a
    ladder ("A from 131K, B from 131K", :func:`flexigpt.tables.ladder.seed_components`), ""
    when the interval covers only what was run."""

    status: str
    interval: stats.Interval | None = None
    note: str = ""
    replicates: np.ndarray | None = None
    seed_source: str = ""

    @property
    def seeds(self) -> tuple[int, ...]:
        """Runs resampled per side, ``(S_a, S_b)``; ``()`` without an interval."""
        return tuple(self.interval.seeds) if self.interval is not None else ()

    def text(self, digits: int = 1) -> str:
        """``+2.0 [−1.1, 5.0]`` or the status."""
        if self.interval is None:
            return self.status
        iv = self.interval
        return f"{iv.estimate:+.{digits}f} [{iv.low:+.{digits}f}, {iv.high:+.{digits}f}]"


def _tasks_view(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"tasks": r.get("tasks") or {}, "perplexity": None} for r in runs]


def _ppl_view(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"tasks": {}, "perplexity": r.get("perplexity")} for r in runs]


class Comparator:
    """Paired differences between settings of one records store (cached)."""

    def __init__(self, store: RecordStore, n_boot: int = stats.N_BOOT, seed: int = 0) -> None:
        self.store, self.n_boot, self.seed = store, n_boot, seed
        self._cache: dict[tuple, Diff] = {}

    def has(self, key: tuple | None) -> bool:
        return key is not None and key in self.store.files

    def diff(self, a: tuple | None, b: tuple | None, metric: str) -> Diff:
        """A − B of ``metric`` (one of :data:`METRICS`)."""
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        if a is None or b is None or not (self.has(a) and self.has(b)):
            return Diff(NOT_RUN)
        key = (a, b, metric)
        if key not in self._cache:
            self._cache[key] = self._compute(a, b, metric)
        return self._cache[key]

    def _compute(self, a: tuple, b: tuple, metric: str) -> Diff:
        ra, rb = self.store.runs(a), self.store.runs(b)
        if ra is None or rb is None:
            return Diff(NO_RECORDS)
        kw: dict[str, Any] = {"n_boot": self.n_boot, "seed": self.seed}
        try:
            if metric == "log_ppl":
                if not all(r.get("perplexity") for r in ra + rb):
                    return Diff(NO_RECORDS)
                reps = stats.paired_replicates([(_ppl_view(ra), _ppl_view(rb))], metric, **kw)
            else:
                tasks = list(TASKS) if metric == "avg" else [metric]
                if any(t not in (r.get("tasks") or {}) for r in ra + rb for t in tasks):
                    return Diff(NO_RECORDS)
                reps = stats.paired_replicates([(_tasks_view(ra), _tasks_view(rb))], metric,
                                               tasks=tasks, **kw)
        except stats.PairingError as err:
            log.info("unpaired %s vs %s (%s): %s", a, b, metric, err)
            return Diff(UNPAIRED, note=str(err))
        k = 1.0 if metric == "log_ppl" else 100.0  # nats; accuracy in points
        return Diff(OK, reps.interval(0).scaled(k), replicates=k * reps.boot[:, 0])


def key_of(agg: pd.DataFrame, model: str, method: str, variant: str, ratio: float | None,
           stage: str = "final") -> tuple:
    """The setting key of a (possibly absent) setting."""
    return setting_key({"model": model, "method": method, "variant": variant,
                        "ratio": ratio, "stage": stage})


def pairs(agg: pd.DataFrame, model: str) -> list[tuple[str, pd.Series, tuple]]:
    """(what, row A, key B): each Table 1 row vs dense and each FlexiGPT row vs ShortGPT +
    LoRA at the same ratio; the paper-protocol FlexiGPT vs the paper-protocol ShortGPT +
    LoRA; each KD row vs the same method's LM-loss row (same LM variant and ratio)."""
    rows = main_rows(agg, model)
    dense = key_of(agg, model, ROLES.reference, "default", 0.0)
    like = f"vs {METHOD_LABELS[ROLES.comparator]}*"
    out = []
    for _, row in rows.sort_values(["ratio", "method", "variant"]).iterrows():
        if row["method"] == ROLES.reference:
            continue
        out.append(("vs Dense", row, dense))
        if row["method"] == ROLES.subject:
            out.append((like, row,
                        key_of(agg, model, ROLES.comparator, "default", row["ratio"])))
    protocol = table_rows(agg, model, "paper_protocol", dense=False)
    subject = protocol[protocol["method"].eq(ROLES.subject)]
    for _, row in subject.sort_values("ratio").iterrows():
        out.append((f"{like} (paper protocol)", row,
                    key_of(agg, model, ROLES.comparator, row["variant"], row["ratio"])))
    kd = table_rows(agg, model, "kd", dense=False)
    for _, row in kd.sort_values(["ratio", "method", "variant"]).iterrows():
        out.append(("KD vs LM loss", row,
                    key_of(agg, model, row["method"], lm_variant(row["variant"]), row["ratio"])))
    return out


def comparison_table(agg: pd.DataFrame, comp: Comparator,
                     models: list[str]) -> Table | None:
    """``comparisons``: one block per model, one row per pair, cells ``Δ [95% CI]``."""
    blocks, csv_rows = [], []
    for model in models:
        frame_rows = []
        for what, row, base in pairs(agg, model):
            label = row_label(row["method"], row["variant"], bool(row["trained"]))
            cells = {m: comp.diff(setting_key(row), base, m) for m in METRICS}
            frame_rows.append({"Method": label, "Comparison": what,
                               "Ratio": 100 * row["ratio"],
                               **{HEADERS[m]: d.text(3 if m == "log_ppl" else 1)
                                  for m, d in cells.items()}})
            for m, d in cells.items():
                iv = d.interval
                csv_rows.append({"model": model, "method": row["method"],
                                 "variant": row["variant"], "ratio": row["ratio"],
                                 "comparison": what, "baseline": "/".join(map(str, base[1:3])),
                                 "metric": m, "status": d.status,
                                 "estimate": iv.estimate if iv else None,
                                 "ci_low": iv.low if iv else None,
                                 "ci_high": iv.high if iv else None,
                                 "n": iv.n if iv else None})
        if frame_rows:
            blocks.append(Block(f"{model}: paired differences (row − comparison)",
                                pd.DataFrame(frame_rows), {"Ratio": "pct0"}, group="Ratio",
                                notes=[NOTE]))
    if not blocks:
        return None
    return Table("comparisons", "Paired comparisons with 95% bootstrap intervals", blocks,
                 pd.DataFrame(csv_rows))


NOTE = ("Δ = row − comparison, paired over the same documents (log-PPL: the same "
        "evaluation windows), 95% percentile bootstrap interval in brackets "
        "(flexigpt.core.stats.compare_runs, 2000 replicates, seed 0). Accuracy in points; "
        "Δ log-PPL in nats (< 0: lower PPL; exp(Δ) is the PPL ratio). unpaired = the runs "
        "scored different documents; no records = a result file has no per-document "
        "records; not run = the comparison run is not in the results.")

