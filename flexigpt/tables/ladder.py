"""Budget ladders: one Table 1 pair (:data:`PAIR`) recovered again at several token budgets,
its points per budget, the jointly resampled differences per metric with their fitted trend
(:func:`metric_trend`), and the passes over the training text of each run.

The tables are :mod:`flexigpt.tables.budget`, the figure :mod:`flexigpt.tables.ladder_figure`.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from flexigpt.core import stats
from flexigpt.storage.registry import ROLES
from flexigpt.tables.collect import TASKS
from flexigpt.tables.comparisons import OK, Diff
from flexigpt.tables.labels import slug
from flexigpt.tables.render import si
from flexigpt.tables.row_intervals import RecordStore, setting_key
from flexigpt.tables.rows import table_of
from flexigpt.tables.trend import PAPER_TOKENS_PER_PARAM, budget_pairs
from flexigpt.tables.trend_fit import TrendFit, fit_trend

log = logging.getLogger(__name__)
#: Table 1's like-for-like pair (ShortGPT + LoRA's ``match`` and ``budget`` name FlexiGPT).
PAIR = (ROLES.subject, ROLES.comparator)
#: the two differences of a ladder: metric → (display name, unit, digits).
METRICS = {"log_ppl": ("Δ log-PPL", "nats", 3), "avg": ("Δ Avg", "points", 1)}


@dataclass(frozen=True)
class Point:
    """One budget of a ladder: the pair's aggregated result rows (``a`` = FlexiGPT,
    ``b`` = ShortGPT + LoRA), their setting keys, recovery ``tokens`` and the dense
    parameter count ``params`` (None when unknown)."""

    tokens: float
    params: float | None
    a: pd.Series
    b: pd.Series

    @property
    def keys(self) -> tuple[tuple, tuple]:
        return setting_key(self.a), setting_key(self.b)

    @property
    def tokens_per_param(self) -> float | None:
        return self.tokens / self.params if self.params else None

    def has(self, metric: str) -> bool:
        """Both rows hold the metric (``avg``: every task scored)."""
        col = "ppl" if metric == "log_ppl" else "avg"
        return bool(pd.notna(self.a.get(col)) and pd.notna(self.b.get(col)))


def _has_ladder(agg: pd.DataFrame, model: str, ratio: float) -> bool:
    """``model`` has a result of table ``budget`` of a :data:`PAIR` method at ``ratio``."""
    return bool((agg["model"].eq(model) & agg["method"].isin(PAIR)
                 & table_of(agg).eq("budget") & (agg["ratio"] - ratio).abs().lt(1e-6)).any())


def ladders(agg: pd.DataFrame, model: str) -> dict[float, list[Point]]:
    """Ratio → the ladder's points, by tokens: the like-for-like pairs of
    :func:`flexigpt.tables.trend.budget_pairs` (one per recovery budget, matched by ratio,
    variant and tokens; Table 1's pair is the point at ``training.tokens``) at every ratio
    where a budget-ladder result exists (none: no ladder, e.g. a config without
    ``budget:``)."""
    if agg.empty:
        return {}
    ours = agg[agg["model"].eq(model)]
    rows = {setting_key(r): r for _, r in ours.iterrows()}
    out: dict[float, list[Point]] = {}
    for ratio in sorted({round(float(r), 6) for r in ours["ratio"].dropna()}):
        if not _has_ladder(agg, model, ratio):
            continue
        points = [Point(float(p.tokens), p.params, rows[p.key_a], rows[p.key_b])
                  for p in budget_pairs(agg, model, ratio) if p.tokens]
        if points:
            out[ratio] = points
    return out


#: a side's measured seed spread per point: variance across seeds, None with one seed.
Spread = tuple[float | None, float | None]


def seed_components(tokens: Sequence[float], measured: Sequence[Spread],
                    fallback: Mapping[float, float] | None = None,
                    ) -> tuple[list[float], list[str]]:
    """Per point j: the seed variance its contrast A − B lacks, and how it was obtained.

    A side measured with several seeds at j is resampled by the bootstrap already (0 added).
    A one-seed side borrows the variance of the same side at the nearest budget (in
    log-tokens; the smaller on a tie) where it was measured; where that side never was, the
    nearest budget of ``fallback`` (tokens → a variance pooled over other methods); else
    nothing ("documents only"). Returns ``(variances [B], labels [B])``: a label names
    each borrowing side (A, B) and the budget it borrows from ("A from 131K, B from 131K";
    "pooled": from other methods), or "measured"."""
    x = [math.log10(t) for t in tokens]

    def nearest(j: int, have: list[tuple[float, float]]) -> tuple[float, float] | None:
        return min(have, key=lambda tv: (abs(math.log10(tv[0]) - x[j]), tv[0]), default=None)

    variances, labels = [], []
    for j, _ in enumerate(tokens):
        total, sources = 0.0, []
        for side in (0, 1):
            if measured[j][side] is not None:
                continue
            own = [(tokens[k], v) for k, m in enumerate(measured)
                   if (v := m[side]) is not None]
            pooled = list((fallback or {}).items())
            found = nearest(j, own) or nearest(j, pooled)
            name = "AB"[side]
            if found is None:
                sources.append(f"{name}: documents only")
                continue
            total += found[1]
            sources.append(f"{name} from {si(found[0])}" + ("" if own else " pooled"))
        variances.append(total)
        unmeasured = all(src.endswith("documents only") for src in sources)
        labels.append("measured" if not sources else
                      "documents only: no seed spread measured" if unmeasured else
                      ", ".join(sources))
    return variances, labels


def _seed_counts(reps: stats.Replicates, j: int) -> str:
    return "+".join(str(s) for s in reps.seeds[j])


@dataclass(frozen=True)
class MetricTrend:
    """One metric of a ladder: the points measured, their joint replicates (with each
    one-seed contrast's borrowed seed component, :func:`seed_components`), how each point's
    seed component was obtained (``seed_labels``), and the fitted trend (None with fewer
    than two budgets)."""

    metric: str
    points: tuple[Point, ...]
    replicates: stats.Replicates
    fit: TrendFit | None
    seed_labels: tuple[str, ...] = ()

    def seeds_text(self, tokens: float) -> str | None:
        """``3+3 (measured)`` / ``1+1 (A from 131K, B from 131K)`` at ``tokens`` (None: not
        measured)."""
        for j, p in enumerate(self.points):
            if p.tokens == tokens:
                label = self.seed_labels[j] if self.seed_labels else "documents only"
                return f"{_seed_counts(self.replicates, j)} ({label})"
        return None

    def interval(self, tokens: float) -> stats.Interval | None:
        """The per-budget interval at ``tokens`` (None: not measured)."""
        for j, p in enumerate(self.points):
            if p.tokens == tokens:
                return self.replicates.interval(j)
        return None


def ladder_diff(trend: MetricTrend | None, keys: tuple[tuple, tuple]) -> Diff | None:
    """The difference at the ladder point whose setting keys are ``keys`` (FlexiGPT*,
    ShortGPT + LoRA*), taken from the ladder's joint replicates with any borrowed seed
    component: the interval the budget table shows at that budget, so that a verdict on the
    same comparison quotes the same interval. None: ``keys`` is no point of ``trend``."""
    if trend is None:
        return None
    for j, point in enumerate(trend.points):
        if point.keys == keys:
            label = trend.seed_labels[j] if trend.seed_labels else ""
            borrowed = label not in ("", "measured") and not label.startswith("documents only")
            return Diff(OK, trend.replicates.interval(j), replicates=trend.replicates.boot[:, j],
                        seed_source=label if borrowed else "")
    return None


def metric_trend(points: list[Point], store: RecordStore, metric: str,
                 n_boot: int = stats.N_BOOT, seed: int = 0,
                 fallback: Mapping[float, float] | None = None) -> MetricTrend | None:
    """Jointly resampled differences of ``metric`` at every point that has it (and
    per-document records): seeds and documents (two-level), a one-seed side with the seed
    spread it borrows (:func:`seed_components`; ``fallback``: tokens → variance pooled over
    other methods), fitted when two or more budgets remain; None when none does or the runs
    did not score the same documents (logged)."""
    used, pairs = [], []
    for p in points:
        ra, rb = (store.runs(k) for k in p.keys)
        if p.has(metric) and ra is not None and rb is not None:
            used.append(p)
            pairs.append((ra, rb))
    if not used:
        return None
    try:
        reps = stats.paired_replicates(pairs, metric, n_boot=n_boot, seed=seed,
                                       tasks=None if metric == "log_ppl" else list(TASKS))
    except stats.PairingError as err:
        log.info("budget trend (%s) skipped: %s", metric, err)
        return None
    scale = 1.0 if metric == "log_ppl" else 100.0
    reps = reps.scaled(scale) if scale != 1.0 else reps
    task_names = None if metric == "log_ppl" else list(TASKS)
    measured = [tuple(stats.seed_variance(runs, metric, task_names, scale) for runs in pair)
                for pair in pairs]
    variances, labels = seed_components([p.tokens for p in used], measured,  # type: ignore[arg-type]
                                        fallback)
    if any(variances):
        reps = stats.add_seed_component(reps, variances, seed)
    fit = None
    if len({p.tokens for p in used}) >= 2:
        params = used[0].params
        fit = fit_trend(
            [p.tokens for p in used], reps.estimate, reps.boot, metric=metric,
            unit=METRICS[metric][1], tokens_per_param=[p.tokens_per_param for p in used],
            at_tokens=PAPER_TOKENS_PER_PARAM * params if params else None,
            seeds=reps.seeds)
    return MetricTrend(metric, tuple(used), reps, fit, tuple(labels))


def read_epochs(train_logs: list[str | os.PathLike]) -> dict[str, float]:
    """Run (``<model>/<method>/<variant>/<setting>``, from the DAG layout of each
    ``.../trained/train_log.csv``) → passes over the training text of its last training
    (``epochs`` of the trained manifest beside the log); runs whose manifest lacks it are
    left out."""
    out: dict[str, float] = {}
    for path in map(Path, train_logs):
        manifest = path.parent / "manifest.json"
        try:
            history = json.loads(manifest.read_text()).get("history") or []
        except (OSError, json.JSONDecodeError):
            continue
        trains = [h for h in history if isinstance(h, dict) and h.get("stage") == "train"]
        if trains and isinstance(trains[-1].get("epochs"), (int, float)):
            out["/".join(path.parent.parent.parts[-4:])] = float(trains[-1]["epochs"])
    return out


def point_epochs(point: Point, epochs: Mapping[str, float]) -> float | None:
    """The larger number of passes over the training text of the point's two runs."""
    found = [epochs.get(f"{r['model']}/{r['method']}/{r['variant']}/r{r['ratio']:g}")
             for r in (point.a, point.b)]
    known = [e for e in found if e is not None]
    return max(known) if known else None


def stem(model: str, ratio: float) -> str:
    """``budget_<model>_r<ratio>``."""
    return f"budget_{slug(model)}_r{ratio:g}"
