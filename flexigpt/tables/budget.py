"""The verdict as a function of the recovery budget: ``budget_<model>_r<ratio>.md/.csv`` and
``fig_budget_<model>_r<ratio>.png``.

A *ladder* is one Table 1 run pair recovered again at several token budgets (the DAG's
``budget:`` section, :func:`flexigpt.workflow.dag.budget_runs`): result rows of table ``budget``
(variant ``tok<n>``, labels ``budget_tokens`` / ``budget_variant``), one pair per budget
(:func:`flexigpt.tables.trend.budget_pairs`; the Table 1 pair is the point at
``training.tokens``). At each budget the like-for-like pair (:data:`PAIR`: FlexiGPT* and
ShortGPT + LoRA* at matched compression and trainable count) gives the paired difference
FlexiGPT − ShortGPT + LoRA in log-PPL (nats) and in the five-task average (points), on the
same test documents.

All budgets of one metric are resampled jointly (:func:`flexigpt.core.stats.paired_replicates`:
one document draw per replicate for every budget), so the per-budget intervals and the
fitted line Δ = a + b·log10(tokens) (:func:`flexigpt.tables.trend_fit.fit_trend`, percentile
intervals over the replicates' fits) keep the budgets' covariance. The fit is extrapolated
(dashed) to the paper's recovery budget, 0.15 tokens per dense parameter
(:data:`flexigpt.tables.trend.PAPER_TOKENS_PER_PARAM`). Nothing is written for results
without a ladder.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from flexigpt.core import stats
from flexigpt.tables import trend
from flexigpt.tables.budget_strategies import (
    Strategy,
    strategies,
    strategies_figure,
    strategies_table,
)
from flexigpt.tables.build import aggregate
from flexigpt.tables.collect import collect_results
from flexigpt.tables.labels import METHOD_LABELS
from flexigpt.tables.ladder import (
    METRICS,
    PAIR,
    MetricTrend,
    Point,
    ladders,
    metric_trend,
    point_epochs,
    read_epochs,
    stem,
)
from flexigpt.tables.ladder_figure import ladder_figure
from flexigpt.tables.render import Block, Table, sci, write_table
from flexigpt.tables.row_intervals import RecordStore, run_key
from flexigpt.tables.rows import optional_float, table_of

log = logging.getLogger(__name__)


def _diff_text(mt: MetricTrend | None, tokens: float) -> str | None:
    """``+0.216 [+0.178, +0.248]`` at ``tokens`` (None: not measured)."""
    if mt is None:
        return None
    iv = mt.interval(tokens)
    if iv is None:
        return None
    d = METRICS[mt.metric][2]
    return f"{iv.estimate:+.{d}f} [{iv.low:+.{d}f}, {iv.high:+.{d}f}]"


def _seeds_text(mt: MetricTrend | None, tokens: float) -> str | None:
    """``3+3 (measured)``: training seeds per side and where the seed component of the
    interval comes from (None: not measured)."""
    return None if mt is None else mt.seeds_text(tokens)


def _lr_text(row: pd.Series, search: Mapping[tuple, str]) -> str | None:
    """The run's learning rate (+ γ's), ``reused`` when it took another run's choice, and
    where that choice sits in its search (``bracketed`` / ``edge``; :func:`flexigpt.tables.
    sweep.choice_status`) when the run's sweep record is known."""
    lr = optional_float(row.get("lr"))
    if lr is None:
        return None
    gamma = optional_float(row.get("gamma_lr"))
    source = row.get("lr_source")
    reused = isinstance(source, str) and source.startswith("chosen by")
    where = search.get(run_key(row))
    return (sci(lr) + (f" (γ {sci(gamma)})" if gamma is not None else "")
            + (" reused" if reused else " swept") + (f", {where}" if where else ""))


def ladder_frame(points: list[Point], trends: dict[str, MetricTrend | None],
                 epochs: Mapping[str, float],
                 search: Mapping[tuple, str] | None = None) -> pd.DataFrame:
    """One display row per budget: tokens (and per dense parameter, passes over the
    training text), each method's PPL and Avg, the paired differences with their 95 %
    intervals, and the learning rates each run used (with where each choice sits in its
    search, ``search``: :func:`flexigpt.tables.row_intervals.run_key` → ``bracketed`` /
    ``edge``, when given)."""
    search = search or {}
    la, lb = (METHOD_LABELS[m] + "*" for m in PAIR)
    rows = []
    for p in points:
        tpp = p.tokens_per_param
        rows.append({
            "Tokens": p.tokens, "Tokens / param": None if tpp is None else f"{tpp:.2g}",
            "Epochs": point_epochs(p, epochs),
            f"{la} PPL": optional_float(p.a.get("ppl")),
            f"{lb} PPL": optional_float(p.b.get("ppl")),
            "Seeds (PPL)": _seeds_text(trends.get("log_ppl"), p.tokens),
            "Δ log-PPL [95% CI]": _diff_text(trends.get("log_ppl"), p.tokens),
            f"{la} Avg": optional_float(p.a.get("avg")),
            f"{lb} Avg": optional_float(p.b.get("avg")),
            "Δ Avg [95% CI]": _diff_text(trends.get("avg"), p.tokens),
            f"LR {la}": _lr_text(p.a, search), f"LR {lb}": _lr_text(p.b, search)})
    frame = pd.DataFrame(rows)
    return frame.drop(columns=[c for c in frame if frame[c].isna().all()])


def _notes(frame: pd.DataFrame) -> list[str]:
    """What the ladder's columns mean, and whether any budget saw its text more than once."""
    la, lb = (METHOD_LABELS[m] for m in PAIR)
    notes = [f"Each row: {la}* and {lb}* (matched compression and trainable count, as in "
             "Table 1) recovered for exactly that many tokens, each run with its own warm-up "
             "+ cosine schedule ending at its budget (never a checkpoint of a longer run). "
             f"Δ = {la} − {lb}, paired over the same test documents / windows, all budgets "
             "of one metric resampled jointly (flexigpt.core.stats.paired_replicates); 95% "
             "percentile intervals. Log-PPL in nats, Avg in points; – = not evaluated at "
             "that budget (e.g. tasks only at the largest).",
             "Seeds: training runs per side (A+B). Several seeds are resampled (seeds, then "
             "documents); a one-seed side adds the seed variance measured for the same method "
             "at the nearest budget (flexigpt.tables.ladder.seed_components); 'documents only' "
             "where no spread was measured: that interval is too narrow by the seed spread.",
             "Tokens / param = recovery tokens per dense parameter (the paper: 1B tokens for "
             f"LLaMA-2 7B ≈ {trend.PAPER_TOKENS_PER_PARAM:g}). LR: swept = chosen on the "
             "tuning split by the run's own sweep; reused = the choice of the ladder's "
             "smallest budget (budget.lr: smallest); bracketed / edge = where that choice sits "
             "in its search (edge: unbracketed, the LR-sweep table says why)."]
    if "Epochs" in frame and (frame["Epochs"].dropna() > 1.0 + 1e-9).any():
        notes.append("Epochs > 1: the training text was seen more than once at that budget "
                     "(a reshuffled pass per epoch), so later tokens are repeats, not new text.")
    return notes


def _fit_block(mt: MetricTrend) -> Block | None:
    """The fitted line of one metric (slope per decade, intercept, crossover, Δ at the
    paper's tokens per parameter) as a block of its own."""
    if mt.fit is None:
        return None
    frame = trend.trend_frame(mt.fit).iloc[len(mt.fit.tokens):].reset_index(drop=True)
    name, unit, _ = METRICS[mt.metric]
    return Block(f"Fit: {name} = a + b·log10(tokens) ({unit})",
                 frame[["Budget", "Δ [95% CI]"]].rename(columns={"Budget": "Quantity"}),
                 notes=[trend.NOTE])


def _csv(model: str, ratio: float, points: list[Point],
         trends: dict[str, MetricTrend | None], epochs: Mapping[str, float]) -> pd.DataFrame:
    """Machine-readable ladder: ``kind`` ``budget`` rows (per budget: each method's PPL /
    Avg / LR, each difference with its interval) and ``fit`` rows (per metric: the line's
    coefficients, crossover and Δ at the paper's budget, with intervals)."""
    head = {"model": model, "ratio": ratio}
    rows = []
    for p in points:
        row = {**head, "kind": "budget", "tokens": p.tokens,
               "tokens_per_param": p.tokens_per_param, "epochs": point_epochs(p, epochs)}
        for side, r in zip(("a", "b"), (p.a, p.b)):
            row.update({f"method_{side}": r["method"], f"variant_{side}": r["variant"],
                        f"ppl_{side}": optional_float(r.get("ppl")),
                        f"avg_{side}": optional_float(r.get("avg")),
                        f"lr_{side}": optional_float(r.get("lr")),
                        f"gamma_lr_{side}": optional_float(r.get("gamma_lr")),
                        f"lr_source_{side}": r.get("lr_source")})
        for metric, mt in trends.items():
            iv = mt.interval(p.tokens) if mt is not None else None
            row.update({f"{metric}_diff": iv and iv.estimate, f"{metric}_low": iv and iv.low,
                        f"{metric}_high": iv and iv.high,
                        f"{metric}_seeds": _seeds_text(mt, p.tokens)})
        rows.append(row)
    skip = ("tokens", "estimates", "lows", "highs", "tokens_per_param", "seeds")
    for metric, mt in trends.items():
        if mt is not None and mt.fit is not None:
            fit = {k: v for k, v in mt.fit.to_dict().items() if k not in skip}
            rows.append({**head, "kind": "fit", **fit, "metric": metric})
    return pd.DataFrame(rows)


def ladder_table(model: str, ratio: float, points: list[Point],
                 trends: dict[str, MetricTrend | None], epochs: Mapping[str, float],
                 display: str | None = None, search: Mapping[tuple, str] | None = None) -> Table:
    """``budget_<model>_r<ratio>``: the ladder's rows, then one fit block per metric with
    two or more budgets (``search``: :func:`ladder_frame`)."""
    frame = ladder_frame(points, trends, epochs, search)
    kinds = {"Tokens": "si", "Epochs": "num", **{c: "ppl" for c in frame if c.endswith(" PPL")},
             **{c: "num" for c in frame if c.endswith(" Avg")}}
    blocks = [Block(f"Ours: {display or model}, {100 * ratio:.0f}%", frame, kinds,
                    notes=_notes(frame))]
    fits = [b for mt in trends.values() if mt is not None if (b := _fit_block(mt)) is not None]
    for later in fits[1:]:
        later.notes = ["Fit and intervals as above."]
    blocks += fits
    la, lb = (METHOD_LABELS[m] for m in PAIR)
    return Table(stem(model, ratio), f"{la} − {lb} against the recovery budget, "
                 f"{display or model}, ratio {100 * ratio:.0f}%", blocks,
                 _csv(model, ratio, points, trends, epochs))


@dataclass
class Ladder:
    """One ladder of the results: its table (``budget_<model>_r<ratio>``), what its figure
    needs, and, where strategies beyond the like-for-like pair are on it, their table
    (``budget_strategies_<model>_r<ratio>``, :mod:`flexigpt.tables.budget_strategies`)."""

    model: str
    ratio: float
    points: list[Point]
    trends: dict[str, MetricTrend | None]
    display: str | None
    table: Table
    strategies: list[Strategy] = field(default_factory=list)
    store: RecordStore | None = None

    @property
    def tables(self) -> list[Table]:
        """The ladder's table, then the strategies' table when there is one."""
        if len(self.strategies) <= 2:  # the like-for-like pair alone
            return [self.table]
        return [self.table, strategies_table(self.model, self.ratio, self.strategies,
                                             self.display)]

    def figures(self, out_dir: str | os.PathLike) -> list[tuple[str, list[Path]]]:
        """``fig_budget_<model>_r<ratio>.png`` (and the strategies' figure): the files
        written, each with the name of the table whose numbers it plots."""
        tables = self.tables
        drawn = [(tables[0].name, ladder_figure(self.model, self.ratio, self.points,
                                                self.trends, out_dir, self.display))]
        if len(tables) > 1 and self.store is not None:
            drawn.append((tables[1].name, strategies_figure(
                self.model, self.ratio, self.strategies, self.store, out_dir, self.display)))
        return drawn

    def figure(self, out_dir: str | os.PathLike) -> list[Path]:
        """The files of :meth:`figures`."""
        return [p for _, files in self.figures(out_dir) for p in files]


def _load(results: Sequence[str | os.PathLike]) -> tuple[pd.DataFrame, RecordStore] | None:
    """The aggregated rows and the per-document records of ``results``; None without a
    ladder (no result of table ``budget``)."""
    df = collect_results(list(results))
    if df.empty or not table_of(df).eq("budget").any():
        log.info("no budget ladder in the results: budget tables skipped")
        return None
    return aggregate(df), RecordStore(df)


def find_ladders(results: Sequence[str | os.PathLike], *,
                 train_logs: Sequence[str | os.PathLike] | None = None,
                 model_names: Mapping[str, str] | None = None,
                 n_boot: int = stats.N_BOOT,
                 search: Mapping[tuple, str] | None = None) -> list[Ladder]:
    """Every ladder of the ``results`` (evaluation JSONs), with its fitted trends;
    ``train_logs`` locate the trained manifests whose ``epochs`` say whether a budget saw
    its text more than once; ``search`` (:func:`flexigpt.tables.row_intervals.run_key` →
    ``bracketed`` / ``edge``,
    :func:`flexigpt.tables.sweep.choice_status`) marks where each run's learning rates sit.
    Empty without a ladder (no result of table ``budget``)."""
    loaded = _load(results)
    if loaded is None:
        return []
    agg, store = loaded
    epochs = read_epochs(list(train_logs or []))
    found: list[Ladder] = []
    for model in dict.fromkeys(agg["model"]):
        display = (model_names or {}).get(model)
        for ratio, points in ladders(agg, model).items():
            trends = {m: metric_trend(points, store, m, n_boot=n_boot) for m in METRICS}
            found.append(Ladder(model, ratio, points, trends, display,
                                ladder_table(model, ratio, points, trends, epochs, display,
                                             search),
                                strategies(agg, store, model, ratio, n_boot=n_boot), store))
    return found


def build_budget(results: list[str | os.PathLike], out_dir: str | os.PathLike, *,
                 train_logs: list[str | os.PathLike] | None = None,
                 model_names: Mapping[str, str] | None = None,
                 formats: tuple[str, ...] = ("md", "csv"), make_plots: bool = True,
                 n_boot: int = stats.N_BOOT) -> list[Path]:
    """Write every ladder's tables (in ``formats``) and figures (:func:`find_ladders`);
    returns the files written (none without a ladder)."""
    written: list[Path] = []
    for ladder in find_ladders(results, train_logs=train_logs, model_names=model_names,
                               n_boot=n_boot):
        for table in ladder.tables:
            written += write_table(table, out_dir, formats)
        if make_plots:
            written += ladder.figure(out_dir)
    return written
