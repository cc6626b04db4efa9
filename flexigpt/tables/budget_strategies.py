"""Every replacement strategy on the budget ladder: ``budget_strategies_<model>_r<ratio>``
(.md/.csv) and its figure.

Each strategy recovered on the ladder (every method with a result of table ``budget``, at
its recovered variant; the Table 1 run is its point at ``training.tokens``) is compared
with the comparator (ShortGPT + LoRA*, :data:`flexigpt.storage.registry.ROLES`) at every budget
both were measured: the paired difference in log-PPL (nats) and in the five-task average
(points), all budgets of one strategy resampled jointly, seeds resampled where a point has
several and a one-seed side given the seed spread measured nearest
(:func:`flexigpt.tables.ladder.metric_trend`; a strategy never run with seeds borrows the
spread pooled over the strategies that were, at the nearest budget). Per strategy and metric
the line Δ = a + b·log10(tokens) is fitted (undecided when the slope's interval holds 0),
and a verdict row says whether its initialisation advantage at the smallest budget
**persists** (still better at the largest), **vanishes** (interval holds 0) or **reverses**
(worse) at the largest budget.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flexigpt.core import stats
from flexigpt.storage.registry import ROLES
from flexigpt.tables.collect import TASKS
from flexigpt.tables.labels import method_label, slug
from flexigpt.tables.ladder import METRICS, MetricTrend, Point, metric_trend
from flexigpt.tables.render import Block, Table, si
from flexigpt.tables.row_intervals import RecordStore, setting_key
from flexigpt.tables.rows import optional_float, table_of
from flexigpt.tables.trend import trend_decided

log = logging.getLogger(__name__)
#: lower is better for log-PPL, higher for the average.
_BETTER = {"log_ppl": -1.0, "avg": 1.0}


@dataclass(frozen=True)
class Strategy:
    """One strategy's ladder: its label, its rows per budget (aggregated over seeds), and
    per metric its trend against the comparator (None: the comparator itself, or fewer
    than one common budget)."""

    method: str
    variant: str
    rows: dict[float, pd.Series]
    trends: dict[str, MetricTrend | None]

    @property
    def label(self) -> str:
        return method_label(self.method, self.variant) + "*"


def _final_trained(agg: pd.DataFrame, model: str, ratio: float) -> pd.DataFrame:
    keep = (agg["model"].eq(model) & agg["stage"].eq("final") & agg["tokens"].notna()
            & (agg["ratio"] - ratio).abs().lt(1e-6) & table_of(agg).isin(["main", "budget"]))
    if "trained" in agg:
        keep &= agg["trained"].fillna(False).astype(bool)
    return agg[keep]


def strategy_rows(agg: pd.DataFrame, model: str, ratio: float,
                  ) -> dict[tuple[str, str], dict[float, pd.Series]]:
    """(method, recovered variant) → tokens → its aggregated row, for every strategy with a
    ladder point (table ``budget``) at ``ratio``; the Table 1 row of that variant is its
    point at its own tokens."""
    rows = _final_trained(agg, model, ratio)
    ladder = rows[table_of(rows).eq("budget")]
    out: dict[tuple[str, str], dict[float, pd.Series]] = {}
    for method, base in dict.fromkeys(zip(ladder["method"], ladder["budget_variant"],
                                          strict=True)):
        mine = rows[rows["method"].eq(method)
                    & ((table_of(rows).eq("budget") & rows["budget_variant"].eq(base))
                       | (table_of(rows).eq("main") & rows["variant"].eq(base)))]
        out[(method, base)] = {float(r["tokens"]): r for _, r in mine.iterrows()}
    return out


def pooled_spreads(ladders: Mapping[tuple[str, str], Mapping[float, pd.Series]],
                   store: RecordStore, metric: str) -> dict[float, float]:
    """tokens → the seed variance of ``metric`` averaged over the strategies measured with
    several seeds at that budget (in the table's units: nats, points)."""
    scale = 1.0 if metric == "log_ppl" else 100.0
    tasks = None if metric == "log_ppl" else list(TASKS)
    found: dict[float, list[float]] = {}
    for points in ladders.values():
        for tokens, row in points.items():
            runs = store.runs(setting_key(row))
            if runs is None or len(runs) < 2:
                continue
            try:
                var = stats.seed_variance(runs, metric, tasks, scale)
            except (stats.PairingError, KeyError):
                continue
            if var is not None:
                found.setdefault(tokens, []).append(var)
    return {t: float(np.mean(v)) for t, v in sorted(found.items())}


def strategies(agg: pd.DataFrame, store: RecordStore, model: str, ratio: float, *,
               n_boot: int = stats.N_BOOT) -> list[Strategy]:
    """Every ladder strategy of ``model`` at ``ratio``, the comparator first, each other
    with its trends against it (empty without the comparator on the ladder)."""
    ladders = strategy_rows(agg, model, ratio)
    ref_key = next((k for k in ladders if k[0] == ROLES.comparator), None)
    if ref_key is None:
        return []
    ref = ladders[ref_key]
    fallback = {m: pooled_spreads(ladders, store, m) for m in METRICS}
    out = [Strategy(*ref_key, ref, {m: None for m in METRICS})]
    for key, points in ladders.items():
        if key == ref_key:
            continue
        common = [Point(t, optional_float(points[t].get("params_dense")), points[t], ref[t])
                  for t in sorted(set(points) & set(ref))]
        trends = {m: metric_trend(common, store, m, n_boot=n_boot, fallback=fallback[m])
                  if common else None for m in METRICS}
        out.append(Strategy(*key, points, trends))
    return out


def _state(mt: MetricTrend, j: int) -> tuple[str, str]:
    """``("better" | "worse" | "undecided", "+0.123 [+0.1, +0.2]")`` of point j."""
    iv = mt.replicates.interval(j)
    d = METRICS[mt.metric][2]
    text = f"{iv.estimate:+.{d}f} [{iv.low:+.{d}f}, {iv.high:+.{d}f}]"
    sign = _BETTER[mt.metric]
    if sign * iv.low > 0 and sign * iv.high > 0:
        return "better", text
    if sign * iv.low < 0 and sign * iv.high < 0:
        return "worse", text
    return "undecided", text


def advantage_verdict(mt: MetricTrend) -> dict[str, str] | None:
    """Whether the strategy's advantage over the comparator at the smallest budget
    persists, vanishes or reverses at the largest (None with fewer than two budgets)."""
    if len(mt.points) < 2:
        return None
    first, first_text = _state(mt, 0)
    last, last_text = _state(mt, len(mt.points) - 1)
    if first != "better":
        verdict = f"no advantage to keep ({first} at the smallest budget)"
    else:
        verdict = {"better": "persists", "undecided": "vanishes (interval holds 0)",
                   "worse": "reverses"}[last]
    return {"Smallest": f"{si(mt.points[0].tokens)}: {first} {first_text}",
            "Largest": f"{si(mt.points[-1].tokens)}: {last} {last_text}",
            "Verdict": verdict}


def _budget_frame(found: list[Strategy]) -> pd.DataFrame:
    rows = []
    for s in found:
        for tokens, row in sorted(s.rows.items()):
            entry = {"Strategy": s.label, "Tokens": tokens,
                     "PPL": optional_float(row.get("ppl")), "Avg": optional_float(row.get("avg"))}
            for metric, (name, _, d) in METRICS.items():
                mt = s.trends.get(metric)
                iv = mt.interval(tokens) if mt is not None else None
                entry[f"{name} [95% CI]"] = (None if iv is None else
                                             f"{iv.estimate:+.{d}f} [{iv.low:+.{d}f}, "
                                             f"{iv.high:+.{d}f}]")
            mt = s.trends.get("log_ppl")
            entry["Seeds (PPL)"] = (mt.seeds_text(tokens) if mt is not None
                                    else f"{int(row.get('n_seeds') or 1)} (comparator)")
            rows.append(entry)
    return pd.DataFrame(rows)


def _trend_frame(found: list[Strategy]) -> pd.DataFrame:
    rows = []
    for s in found:
        for metric, mt in s.trends.items():
            if mt is None or mt.fit is None:
                continue
            fit, (name, unit, d) = mt.fit, METRICS[metric]
            rows.append({"Strategy": s.label, "Metric": name,
                         "Slope per decade [95% CI]": f"{fit.slope:+.{d + 1}f} "
                         f"[{fit.slope_low:+.{d + 1}f}, {fit.slope_high:+.{d + 1}f}] {unit}",
                         "Trend": (("gains" if _BETTER[metric] * fit.slope > 0 else "loses")
                                   + f" ground on {found[0].label} with tokens")
                         if trend_decided(fit) else "undecided (interval holds 0)"})
    return pd.DataFrame(rows)


def _verdict_frame(found: list[Strategy]) -> pd.DataFrame:
    rows = []
    for s in found:
        for metric, mt in s.trends.items():
            verdict = None if mt is None else advantage_verdict(mt)
            if verdict is not None:
                rows.append({"Strategy": s.label, "Metric": METRICS[metric][0], **verdict})
    return pd.DataFrame(rows)


def _csv(model: str, ratio: float, found: list[Strategy]) -> pd.DataFrame:
    head = {"model": model, "ratio": ratio}
    rows = []
    for s in found:
        for tokens, row in sorted(s.rows.items()):
            entry = {**head, "kind": "budget", "method": s.method, "variant": s.variant,
                     "tokens": tokens, "ppl": optional_float(row.get("ppl")),
                     "avg": optional_float(row.get("avg")), "n_seeds": row.get("n_seeds")}
            for metric, mt in s.trends.items():
                iv = mt.interval(tokens) if mt is not None else None
                entry.update({f"{metric}_diff": iv and iv.estimate,
                              f"{metric}_low": iv and iv.low, f"{metric}_high": iv and iv.high,
                              f"{metric}_seeds": mt.seeds_text(tokens) if mt else None})
            rows.append(entry)
        for metric, mt in s.trends.items():
            if mt is None or mt.fit is None:
                continue
            verdict = advantage_verdict(mt) or {}
            rows.append({**head, "kind": "trend", "method": s.method, "variant": s.variant,
                         "metric": metric, "slope": mt.fit.slope, "slope_low": mt.fit.slope_low,
                         "slope_high": mt.fit.slope_high,
                         "trend_decided": trend_decided(mt.fit),
                         "verdict": verdict.get("Verdict")})
    return pd.DataFrame(rows)


def strategies_table(model: str, ratio: float, found: list[Strategy],
                     display: str | None = None) -> Table:
    """``budget_strategies_<model>_r<ratio>``: per budget, each strategy's PPL / Avg and
    its difference to the comparator; per strategy the trend and the verdict."""
    ref = found[0].label
    notes = [f"Δ = strategy − {ref} at the same ratio and recovery tokens, paired over the "
             "same test documents, every budget of a strategy resampled jointly; seeds "
             "resampled where run (two-level), a one-seed side adding the seed variance "
             "measured nearest (its own method's, else pooled over the seeded strategies: "
             "Seeds column). Log-PPL in nats (lower is better), Avg in points.",
             "Every strategy is recovered under the fairness contract (matched compression "
             "and trainable count, the same tokens, learning rates chosen on the tuning "
             "split at the smallest budget and reused above)."]
    blocks = [Block(f"Ours: {display or model}, {100 * ratio:.0f}%: each strategy against "
                    f"{ref}", _budget_frame(found),
                    {"Tokens": "si", "PPL": "ppl", "Avg": "num"}, notes=notes)]
    trends = _trend_frame(found)
    if not trends.empty:
        blocks.append(Block("Trend: Δ = a + b·log10(tokens)", trends,
                            notes=["Undecided: the slope's 95% interval holds 0 (seed and "
                                   "document variance included); no crossover is read off "
                                   "an undecided line."]))
    verdicts = _verdict_frame(found)
    if not verdicts.empty:
        blocks.append(Block("Does the initialisation advantage survive more tokens?", verdicts,
                            notes=["Better / worse: the 95% interval of Δ excludes 0 on "
                                   "that side. Persists: better at the smallest and at the "
                                   "largest budget; vanishes: the largest budget's interval "
                                   "holds 0; reverses: worse at the largest."]))
    return Table(f"budget_strategies_{slug(model)}_r{ratio:g}",
                 f"Every replacement strategy against {ref} over the recovery budget, "
                 f"{display or model}, ratio {100 * ratio:.0f}%", blocks,
                 _csv(model, ratio, found))


def strategies_figure(model: str, ratio: float, found: list[Strategy], store: RecordStore,
                      out_dir: str | os.PathLike, display: str | None = None) -> list[Path]:
    """``fig_budget_strategies_<model>_r<ratio>``: test PPL (log) and Avg against tokens,
    one curve per strategy, each point with its run's 95 % interval (seeds and documents)."""
    from matplotlib.figure import Figure

    from flexigpt.tables.plots import save_figure

    fig = Figure(figsize=(12, 4.6))
    axes = fig.subplots(1, 2)
    for s in found:
        for ax, metric in zip(axes, ("log_ppl", "avg"), strict=True):
            xs, ys, lo, hi = [], [], [], []
            for tokens, row in sorted(s.rows.items()):
                runs = store.runs(setting_key(row))
                if runs is None:
                    continue
                try:
                    iv = stats.run_intervals(runs, tasks=list(TASKS) if metric == "avg" else [])
                except (stats.PairingError, KeyError):
                    continue
                got = iv["log_ppl"] if metric == "log_ppl" else iv["average"]
                if got is None:
                    continue
                f = np.exp if metric == "log_ppl" else (lambda v: 100.0 * v)
                xs.append(tokens)
                ys.append(float(f(got.estimate)))
                lo.append(float(f(got.low)))
                hi.append(float(f(got.high)))
            if xs:
                ax.errorbar(xs, ys, yerr=[np.subtract(ys, lo), np.subtract(hi, ys)],
                            marker="o", capsize=3, label=s.label)
    for ax, (name, scale) in zip(axes, (("test perplexity", "log"), ("average accuracy (%)",
                                                                        "linear")), strict=True):
        ax.set_xscale("log")
        ax.set_yscale(scale)
        ax.set(xlabel="recovery tokens (log)", ylabel=name)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"{display or model}, ratio {100 * ratio:.0f}%: every replacement strategy "
                 "against the recovery budget (95% intervals)", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, out_dir, f"fig_budget_strategies_{slug(model)}_r{ratio:g}")
