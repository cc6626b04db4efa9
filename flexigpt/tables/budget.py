"""The verdict as a function of the recovery budget: ``budget_<model>_r<ratio>.md/.csv`` and
``fig_budget_<model>_r<ratio>.png``.

A *ladder* is one Table 1 run pair recovered again at several token budgets (the DAG's
``budget:`` section, :func:`flexigpt.dag.budget_runs`): result rows of table ``budget``
(variant ``tok<n>``, labels ``budget_tokens`` / ``budget_variant``), one pair per budget
(:func:`flexigpt.tables.trend.budget_pairs`; the Table 1 pair is the point at
``training.tokens``). At each budget the like-for-like pair (:data:`PAIR`: FlexiGPT* and
ShortGPT + LoRA* at matched compression and trainable count) gives the paired difference
FlexiGPT − ShortGPT + LoRA in log-PPL (nats) and in the five-task average (points), on the
same test documents.

All budgets of one metric are resampled jointly (:func:`flexigpt.stats.paired_replicates`:
one document draw per replicate for every budget), so the per-budget intervals and the
fitted line Δ = a + b·log10(tokens) (:func:`flexigpt.tables.trend.fit_trend`, percentile
intervals over the replicates' fits) keep the budgets' covariance. The fit is extrapolated
(dashed) to the paper's recovery budget, 0.15 tokens per dense parameter
(:data:`flexigpt.tables.trend.PAPER_TOKENS_PER_PARAM`). Nothing is written for results
without a ladder.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from flexigpt import stats
from flexigpt.tables import trend
from flexigpt.tables.build import METHOD_LABELS, aggregate, slug, table_of
from flexigpt.tables.collect import TASKS, collect_results
from flexigpt.tables.intervals import RecordStore, setting_key
from flexigpt.tables.render import Block, Table, sci, si, write_table

log = logging.getLogger(__name__)

#: Table 1's like-for-like pair (ShortGPT + LoRA's ``match`` and ``budget`` name FlexiGPT).
PAIR = ("flexigpt", "shortgpt_lora")
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


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


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
                  for p in trend.budget_pairs(agg, model, ratio) if p.tokens]
        if points:
            out[ratio] = points
    return out


@dataclass(frozen=True)
class MetricTrend:
    """One metric of a ladder: the points measured, their joint replicates, and the fitted
    trend (None with fewer than two budgets)."""

    metric: str
    points: tuple[Point, ...]
    replicates: stats.Replicates
    fit: trend.TrendFit | None

    def interval(self, tokens: float) -> stats.Interval | None:
        """The per-budget interval at ``tokens`` (None: not measured)."""
        for j, p in enumerate(self.points):
            if p.tokens == tokens:
                return self.replicates.interval(j)
        return None


def metric_trend(points: list[Point], store: RecordStore, metric: str,
                 n_boot: int = stats.N_BOOT, seed: int = 0) -> MetricTrend | None:
    """Jointly resampled differences of ``metric`` at every point that has it (and
    per-document records), fitted when two or more budgets remain; None when none does or
    the runs did not score the same documents (logged)."""
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
    reps = reps if metric == "log_ppl" else reps.scaled(100.0)
    fit = None
    if len({p.tokens for p in used}) >= 2:
        params = used[0].params
        fit = trend.fit_trend(
            [p.tokens for p in used], reps.estimate, reps.boot, metric=metric,
            unit=METRICS[metric][1], tokens_per_param=[p.tokens_per_param for p in used],
            at_tokens=trend.PAPER_TOKENS_PER_PARAM * params if params else None,
            seeds=reps.seeds)
    return MetricTrend(metric, tuple(used), reps, fit)


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


def _diff_text(mt: MetricTrend | None, tokens: float) -> str | None:
    """``+0.216 [+0.178, +0.248]`` at ``tokens`` (None: not measured)."""
    iv = mt.interval(tokens) if mt is not None else None
    if iv is None:
        return None
    d = METRICS[mt.metric][2]
    return f"{iv.estimate:+.{d}f} [{iv.low:+.{d}f}, {iv.high:+.{d}f}]"


def _lr_text(row: pd.Series) -> str | None:
    """The run's learning rate (+ γ's), and ``reused`` when it took another run's choice."""
    lr = _num(row.get("lr"))
    if lr is None:
        return None
    gamma = _num(row.get("gamma_lr"))
    source = row.get("lr_source")
    reused = isinstance(source, str) and source.startswith("chosen by")
    return (sci(lr) + (f" (γ {sci(gamma)})" if gamma is not None else "")
            + (" reused" if reused else " swept"))


def ladder_frame(points: list[Point], trends: dict[str, MetricTrend | None],
                 epochs: Mapping[str, float]) -> pd.DataFrame:
    """One display row per budget: tokens (and per dense parameter, passes over the
    training text), each method's PPL and Avg, the paired differences with their 95 %
    intervals, and the learning rates each run used."""
    la, lb = (METHOD_LABELS[m] + "*" for m in PAIR)
    rows = []
    for p in points:
        tpp = p.tokens_per_param
        rows.append({
            "Tokens": p.tokens, "Tokens / param": None if tpp is None else f"{tpp:.2g}",
            "Epochs": point_epochs(p, epochs),
            f"{la} PPL": _num(p.a.get("ppl")), f"{lb} PPL": _num(p.b.get("ppl")),
            "Δ log-PPL [95% CI]": _diff_text(trends.get("log_ppl"), p.tokens),
            f"{la} Avg": _num(p.a.get("avg")), f"{lb} Avg": _num(p.b.get("avg")),
            "Δ Avg [95% CI]": _diff_text(trends.get("avg"), p.tokens),
            f"LR {la}": _lr_text(p.a), f"LR {lb}": _lr_text(p.b)})
    frame = pd.DataFrame(rows)
    return frame.drop(columns=[c for c in frame if frame[c].isna().all()])


def _notes(frame: pd.DataFrame) -> list[str]:
    """What the ladder's columns mean, and whether any budget saw its text more than once."""
    la, lb = (METHOD_LABELS[m] for m in PAIR)
    notes = [f"Each row: {la}* and {lb}* (matched compression and trainable count, as in "
             "Table 1) recovered for exactly that many tokens, each run with its own warm-up "
             "+ cosine schedule ending at its budget (never a checkpoint of a longer run). "
             f"Δ = {la} − {lb}, paired over the same test documents / windows, all budgets "
             "of one metric resampled jointly (flexigpt.stats.paired_replicates); 95% "
             "percentile intervals. Log-PPL in nats, Avg in points; – = not evaluated at "
             "that budget (e.g. tasks only at the largest).",
             "Tokens / param = recovery tokens per dense parameter (the paper: 1B tokens for "
             f"LLaMA-2 7B ≈ {trend.PAPER_TOKENS_PER_PARAM:g}). LR: swept = chosen on the "
             "tuning split by the run's own sweep; reused = the choice of the ladder's "
             "smallest budget (budget.lr: smallest)."]
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
                        f"ppl_{side}": _num(r.get("ppl")), f"avg_{side}": _num(r.get("avg")),
                        f"lr_{side}": _num(r.get("lr")),
                        f"gamma_lr_{side}": _num(r.get("gamma_lr")),
                        f"lr_source_{side}": r.get("lr_source")})
        for metric, mt in trends.items():
            iv = mt.interval(p.tokens) if mt is not None else None
            row.update({f"{metric}_diff": iv and iv.estimate, f"{metric}_low": iv and iv.low,
                        f"{metric}_high": iv and iv.high})
        rows.append(row)
    skip = ("tokens", "estimates", "lows", "highs", "tokens_per_param", "seeds")
    for metric, mt in trends.items():
        if mt is not None and mt.fit is not None:
            fit = {k: v for k, v in mt.fit.to_dict().items() if k not in skip}
            rows.append({**head, "kind": "fit", **fit, "metric": metric})
    return pd.DataFrame(rows)


def ladder_table(model: str, ratio: float, points: list[Point],
                 trends: dict[str, MetricTrend | None], epochs: Mapping[str, float],
                 display: str | None = None) -> Table:
    """``budget_<model>_r<ratio>``: the ladder's rows, then one fit block per metric with
    two or more budgets."""
    frame = ladder_frame(points, trends, epochs)
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


def stem(model: str, ratio: float) -> str:
    """``budget_<model>_r<ratio>``."""
    return f"budget_{slug(model)}_r{ratio:g}"


def _draw_fit(ax: Any, fit: trend.TrendFit, x_max: float, color: str) -> None:
    """The fitted line: solid over the measured budgets, dashed beyond the largest (an
    extrapolation), and its value at the paper's budget with its interval (open marker)."""
    import numpy as np

    lo, hi = math.log10(min(fit.tokens)), math.log10(max(fit.tokens))
    inside = np.logspace(lo, hi, 50)
    ax.plot(inside, fit.intercept + fit.slope * np.log10(inside), color=color, lw=1.5,
            label=f"fit: {fit.slope:+.3g} {fit.unit} per decade "
                  f"[{fit.slope_low:+.3g}, {fit.slope_high:+.3g}]")
    if x_max > max(fit.tokens):
        beyond = np.logspace(hi, math.log10(x_max), 50)
        ax.plot(beyond, fit.intercept + fit.slope * np.log10(beyond), color=color, lw=1.5,
                ls="--", label="fit, extrapolated beyond the largest budget")
    if fit.at_tokens is not None:
        ax.errorbar([fit.at_tokens], [fit.at_estimate],
                    yerr=[[fit.at_estimate - fit.at_low], [fit.at_high - fit.at_estimate]],
                    marker="o", mfc="white", color=color, capsize=3, ls="none",
                    label="fit at the paper's budget" + (" (extrapolated)"
                                                          if fit.at_extrapolated else ""))


def _panel(ax: Any, mt: MetricTrend | None, metric: str, paper_tokens: float | None,
           x_max: float) -> None:
    """One metric's differences per budget (95 % intervals), its fit and the markers."""
    name, unit, _ = METRICS[metric]
    ax.axhline(0.0, color="0.3", lw=0.8)
    if paper_tokens is not None:
        ax.axvline(paper_tokens, color="tab:red", ls=":", lw=1.2,
                   label=f"paper: {trend.PAPER_TOKENS_PER_PARAM:g} tokens / parameter")
    if mt is None:
        ax.text(0.5, 0.5, "no paired records", transform=ax.transAxes, ha="center")
    else:
        ivs = [mt.replicates.interval(j) for j in range(len(mt.points))]
        bars = ax.errorbar([p.tokens for p in mt.points], [iv.estimate for iv in ivs],
                           yerr=[[iv.estimate - iv.low for iv in ivs],
                                 [iv.high - iv.estimate for iv in ivs]],
                           marker="s", capsize=3, ls="none", label="measured (95% CI)")
        if mt.fit is not None:
            _draw_fit(ax, mt.fit, x_max, bars.lines[0].get_color())
    ax.set_xscale("log")
    ax.set_xlim(right=x_max)
    ax.set(xlabel="recovery tokens (log)", ylabel=f"{name} ({unit})",
           title=f"{name}: FlexiGPT* − ShortGPT + LoRA*")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def ladder_figure(model: str, ratio: float, points: list[Point],
                  trends: dict[str, MetricTrend | None], out_dir: str | os.PathLike,
                  display: str | None = None) -> list[Path]:
    """``fig_<stem>``: one panel per metric (Δ log-PPL, Δ Avg) against tokens on a log axis,
    tokens per dense parameter on the top axis, the fit dashed beyond the largest budget
    and a vertical marker at the paper's 0.15 tokens per parameter."""
    from matplotlib.figure import Figure

    from flexigpt.tables.plots import save_figure

    params = points[0].params
    paper = trend.PAPER_TOKENS_PER_PARAM * params if params else None
    x_max = 1.5 * max([p.tokens for p in points] + ([paper] if paper else []))
    fig = Figure(figsize=(12, 4.6))
    for ax, metric in zip(fig.subplots(1, 2), METRICS):
        _panel(ax, trends.get(metric), metric, paper, x_max)
        if params:
            top = ax.secondary_xaxis("top", functions=(lambda t: t / params,
                                                       lambda q: q * params))
            top.set_xlabel("recovery tokens per dense parameter", fontsize=8)
    fig.suptitle(f"{display or model}, ratio {100 * ratio:.0f}%: the like-for-like gap "
                 "against the recovery budget", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, out_dir, f"fig_{stem(model, ratio)}")


def build_budget(results: list[str | os.PathLike], out_dir: str | os.PathLike, *,
                 train_logs: list[str | os.PathLike] | None = None,
                 model_names: Mapping[str, str] | None = None,
                 formats: tuple[str, ...] = ("md", "csv"), make_plots: bool = True,
                 n_boot: int = stats.N_BOOT) -> list[Path]:
    """Every ladder of the ``results`` (evaluation JSONs): its table (``budget_*``, in
    ``formats``) and figure (``fig_budget_*``); ``train_logs`` locate the trained
    manifests whose ``epochs`` say whether a budget saw its text more than once. Returns the
    files written (none without a ladder: no result of table ``budget``)."""
    df = collect_results(list(results))
    if df.empty or not table_of(df).eq("budget").any():
        log.info("no budget ladder in the results: budget tables skipped")
        return []
    agg, store = aggregate(df), RecordStore(df)
    epochs = read_epochs(list(train_logs or []))
    written: list[Path] = []
    for model in dict.fromkeys(agg["model"]):
        display = (model_names or {}).get(model)
        for ratio, points in ladders(agg, model).items():
            trends = {m: metric_trend(points, store, m, n_boot=n_boot) for m in METRICS}
            written += write_table(ladder_table(model, ratio, points, trends, epochs, display),
                                   out_dir, formats)
            if make_plots:
                written += ladder_figure(model, ratio, points, trends, out_dir, display)
    return written
