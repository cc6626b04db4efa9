"""``fig_budget_<model>_r<ratio>``: a ladder's differences against the recovery budget, one
panel per metric, with the fitted line and the paper's budget marked."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from flexigpt.tables.ladder import METRICS, MetricTrend, Point, stem
from flexigpt.tables.trend import PAPER_TOKENS_PER_PARAM
from flexigpt.tables.trend_fit import TrendFit


def _draw_fit(ax: Any, fit: TrendFit, x_max: float, color: str) -> None:
    """The fitted line: solid over the measured budgets, dashed beyond the largest (an
    extrapolation), and its value at the paper's budget with its interval (open marker)."""
    lo, hi = math.log10(min(fit.tokens)), math.log10(max(fit.tokens))
    inside = np.logspace(lo, hi, 50)
    ax.plot(inside, fit.intercept + fit.slope * np.log10(inside), color=color, lw=1.5,
            label=f"fit: {fit.slope:+.3g} {fit.unit} per decade "
                  f"[{fit.slope_low:+.3g}, {fit.slope_high:+.3g}]")
    if x_max > max(fit.tokens):
        beyond = np.logspace(hi, math.log10(x_max), 50)
        ax.plot(beyond, fit.intercept + fit.slope * np.log10(beyond), color=color, lw=1.5,
                ls="--", label="fit, extrapolated beyond the largest budget")
    if (fit.at_tokens is not None and fit.at_estimate is not None and fit.at_low is not None
            and fit.at_high is not None):  # set together by fit_trend's at_tokens
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
                   label=f"paper: {PAPER_TOKENS_PER_PARAM:g} tokens / parameter")
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
    paper = PAPER_TOKENS_PER_PARAM * params if params else None
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
