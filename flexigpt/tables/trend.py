"""How FlexiGPT's gap to its like-for-like baseline moves with the recovery token budget.

The like-for-like pair is FlexiGPT* vs ShortGPT + LoRA* at the same ratio, variant and
recovery token budget (:func:`like_for_like`). At each budget t_j the paired difference
Δ_j = FlexiGPT − ShortGPT + LoRA (log-PPL in nats, or the five-task average in accuracy
points) is measured on the same test documents, and a line

    Δ(t) = a + b · log10(t)

is fitted by ordinary least squares through the B points (:func:`fit_trend`); b is the
change of the gap per decade of tokens.

Intervals. Every budget is evaluated on the SAME documents (windows), so the Δ_j are
correlated through the documents. The replicates come from
:func:`flexigpt.core.stats.paired_replicates` with all budgets as contrasts of one call: each
bootstrap replicate draws one document multiset and applies it to every run of every budget
(``boot [n_boot, B]``, one row = one joint draw). The same line is fitted to each row, and
the percentile intervals of a, b, the crossover and the fitted Δ at a chosen budget are
taken over those fits. Resampling each budget on its own (independent seeds) would treat
the shared documents as fresh samples and misstate the slope's interval (wider where the
document effects are shared, as here); reusing one seed per budget without sharing the draw
would correlate them by accident instead of by the data. Seeds, where a budget has several
runs, are resampled per run list. A single-seed budget's interval covers documents only.

Crossover. The budget where the fitted line reaches Δ = 0 after the smallest measured budget
t_min: t_c = 10^(−a/b) when the line moves toward zero as tokens grow (Δ(t_min) · b < 0);
otherwise (moving away, or b = 0) there is no crossover and t_c = inf. ``crossover_fraction``
is the share of replicates with a finite t_c; the crossover interval is the percentile
interval over all replicates (inf included, so an upper bound of inf means "may never
cross"). ``crossover_extrapolated``: t_c lies beyond the largest measured budget.

Public API::

    like_for_like(agg, model, ratio=None)        -> [BudgetPair] sorted by (ratio, tokens)
    budget_pairs(agg, model, ratio)              -> [BudgetPair], one per budget
    fit_trend(tokens, estimates, replicates, *, level, at_tokens, metric, unit) -> TrendFit
                                                 (from flexigpt.tables.trend_fit)
    trend_frame(fit) -> DataFrame;  render_markdown(fit, title=None) -> str

The ladders themselves (points, joint replicates with the seed component, fits) are
:mod:`flexigpt.tables.ladder`; their tables :mod:`flexigpt.tables.budget`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.render import si
from flexigpt.tables.row_intervals import setting_key
from flexigpt.tables.rows import optional_float, table_of
from flexigpt.tables.trend_fit import TrendFit, fit_trend

__all__ = ["PAPER_TOKENS_PER_PARAM", "BudgetPair", "TrendFit", "budget_pairs", "fit_trend",
           "like_for_like", "render_markdown", "trend_decided", "trend_frame"]

log = logging.getLogger(__name__)

#: the paper's recovery budget: 1B tokens for Llama-2-7B (6.74B parameters) ≈ 0.15 / param.
PAPER_TOKENS_PER_PARAM = 0.15
#: metrics of a trend and their units (log-PPL in nats, the task average in points).
UNITS = {"log_ppl": "nats", "avg": "points"}
#: tables whose rows are never the like-for-like pair (the others, "main" included, are).
_OTHER_TABLES = ("paper_protocol", "kd", "ablation", "extension", "dense")


@dataclass(frozen=True)
class BudgetPair:
    """FlexiGPT* (``key_a``) and ShortGPT + LoRA* (``key_b``) at one ratio, variant and
    recovery token budget ``tokens``; ``params`` = the dense model's parameter count (None
    when unknown)."""

    ratio: float
    variant: str
    tokens: float | None
    params: float | None
    key_a: tuple
    key_b: tuple

    @property
    def tokens_per_param(self) -> float | None:
        """Recovery tokens per dense parameter (None when either is unknown)."""
        return self.tokens / self.params if self.tokens is not None and self.params else None

    def budget_text(self) -> str:
        """``32.8K tokens (0.00024 / param)`` or ``–``."""
        if self.tokens is None:
            return "–"
        per = ("" if self.tokens_per_param is None
               else f" ({self.tokens_per_param:.2g} / param)")
        return f"{si(self.tokens)} tokens{per}"


def _candidates(agg: pd.DataFrame, model: str) -> pd.DataFrame:
    """Final-stage, trained FlexiGPT and ShortGPT + LoRA rows of ``model`` outside the
    paper-protocol, KD, ablation, extension and dense tables."""
    if agg.empty:
        return agg
    keep = (agg["model"].eq(model) & agg["stage"].eq("final")
            & agg["method"].isin([ROLES.subject, ROLES.comparator])
            & ~table_of(agg).isin(_OTHER_TABLES) & agg["ratio"].notna())
    if "trained" in agg:
        keep &= agg["trained"].fillna(False).astype(bool)
    return agg[keep]


def like_for_like(agg: pd.DataFrame, model: str,
                  ratio: float | None = None) -> list[BudgetPair]:
    """The like-for-like pairs of ``model`` (at ``ratio`` only, when given): a FlexiGPT row
    and a ShortGPT + LoRA row with the same ratio, variant and ``tokens`` (missing tokens
    match missing tokens), keyed by :func:`setting_key` of the rows themselves (so a result
    schema that tells budgets apart in its keys gives one pair per budget). Sorted by ratio,
    then tokens."""
    rows = _candidates(agg, model)
    if ratio is not None and not rows.empty:
        rows = rows[(rows["ratio"] - ratio).abs().lt(1e-6)]
    out = []
    flex = rows[rows["method"].eq(ROLES.subject)]
    base = rows[rows["method"].eq(ROLES.comparator)]
    for _, a in flex.iterrows():
        t = optional_float(a.get("tokens"))
        for _, b in base.iterrows():
            tb = optional_float(b.get("tokens"))
            if (b["variant"] != a["variant"] or abs(b["ratio"] - a["ratio"]) > 1e-6
                    or (t is None) != (tb is None) or (t is not None and t != tb)):
                continue
            out.append(BudgetPair(round(float(a["ratio"]), 6), a["variant"], t,
                                  optional_float(a.get("params_dense")), setting_key(a),
                                  setting_key(b)))
    return sorted(out, key=lambda p: (p.ratio, -1 if p.tokens is None else p.tokens,
                                      p.variant != "default", p.variant))


def budget_pairs(agg: pd.DataFrame, model: str, ratio: float) -> list[BudgetPair]:
    """One like-for-like pair per recovery token budget at ``ratio``, sorted by tokens: of
    several pairs with the same budget, the ``default`` variant's (else the first). Serves
    both ways a results schema can tell budgets apart: in the setting key (one variant at
    several budgets) or by variant (one variant per budget)."""
    out: dict[float | None, BudgetPair] = {}
    for pair in like_for_like(agg, model, ratio):  # default variant first per budget
        out.setdefault(pair.tokens, pair)
    return sorted(out.values(), key=lambda p: -1 if p.tokens is None else p.tokens)


def _fmt(v: float, digits: int) -> str:
    return "∞" if math.isinf(v) else f"{v:+.{digits}f}"


def _tokens_text(v: float) -> str:
    return "∞" if math.isinf(v) else si(v)


def trend_decided(fit: TrendFit) -> bool:
    """The slope's interval excludes 0: the difference moves with tokens (which way: the
    slope's sign). Crossover and extrapolation are reported only then."""
    return fit.slope_low > 0 or fit.slope_high < 0


def _fit_rows(fit: TrendFit, d: int) -> list[dict[str, str]]:
    """The fit's rows of :func:`trend_frame`: slope and intercept; then, only when the
    slope's interval excludes 0 (:func:`trend_decided`), the crossover (none when the line
    moves away from 0; "not supported" when fewer than ``level`` of the replicates cross)
    and the Δ at ``at_tokens``;
    otherwise one "trend undecided" row."""
    u = fit.unit
    rows = [{"Budget": "fit: slope b per decade", "Tokens / param": "",
             "Δ [95% CI]": f"{_fmt(fit.slope, d)} [{_fmt(fit.slope_low, d)}, "
                           f"{_fmt(fit.slope_high, d)}] {u}"},
            {"Budget": "fit: intercept a (Δ at 1 token)", "Tokens / param": "",
             "Δ [95% CI]": f"{_fmt(fit.intercept, d)} [{_fmt(fit.intercept_low, d)}, "
                           f"{_fmt(fit.intercept_high, d)}] {u}"}]
    if not trend_decided(fit):
        rows.append({"Budget": "trend", "Tokens / param": "",
                     "Δ [95% CI]": "undecided: the slope's interval contains 0, so no "
                                   "crossover or extrapolation is supported"})
        return rows
    if not math.isinf(fit.crossover) and fit.crossover_fraction < fit.level:
        rows.append({"Budget": "fit: crossover (Δ = 0)", "Tokens / param": "",
                     "Δ [95% CI]": f"not supported: {100 * fit.crossover_fraction:.0f}% of "
                                   f"replicates cross (< {100 * fit.level:.0f}%)"})
        return rows + _at_rows(fit, d)
    where = ("none: the line moves away from 0" if math.isinf(fit.crossover) else
             f"{_tokens_text(fit.crossover)} tokens" + (
                 " (extrapolated: beyond the largest budget)" if fit.crossover_extrapolated
                 else " (within the measured budgets)"))
    rows.append({"Budget": "fit: crossover (Δ = 0)", "Tokens / param": "",
                 "Δ [95% CI]": f"{where}; interval [{_tokens_text(fit.crossover_low)}, "
                               f"{_tokens_text(fit.crossover_high)}]; "
                               f"{100 * fit.crossover_fraction:.0f}% of replicates cross"})
    return rows + _at_rows(fit, d)


def _at_rows(fit: TrendFit, d: int) -> list[dict[str, str]]:
    """The fitted Δ at ``at_tokens`` (none when not asked)."""
    rows = []
    u = fit.unit
    if (fit.at_tokens is not None and fit.at_estimate is not None and fit.at_low is not None
            and fit.at_high is not None):  # set together by fit_trend's at_tokens
        flag = " (extrapolated)" if fit.at_extrapolated else ""
        rows.append({"Budget": f"fit: Δ at {si(fit.at_tokens)} tokens{flag}",
                     "Tokens / param": "",
                     "Δ [95% CI]": f"{_fmt(fit.at_estimate, d)} [{_fmt(fit.at_low, d)}, "
                                   f"{_fmt(fit.at_high, d)}] {u}"})
    return rows


def trend_frame(fit: TrendFit) -> pd.DataFrame:
    """Display rows: one per budget (``Budget``, ``Tokens / param``, ``Δ [95% CI]``), then
    the fit (slope per decade, intercept, crossover, Δ at ``at_tokens``)."""
    d = 3 if fit.metric == "log_ppl" else 1
    tpp = fit.tokens_per_param or (None,) * len(fit.tokens)
    rows = [{"Budget": f"{si(t)} tokens", "Tokens / param": "–" if p is None else f"{p:.2g}",
             "Δ [95% CI]": f"{e:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]"}
            for t, p, e, lo, hi in zip(fit.tokens, tpp, fit.estimates, fit.lows, fit.highs,
                                       strict=True)]
    return pd.DataFrame(rows + _fit_rows(fit, d))


def render_markdown(fit: TrendFit, title: str | None = None) -> str:
    """A Markdown table of :func:`trend_frame` (``title`` as a ``###`` heading)."""
    frame = trend_frame(fit)
    cols = list(frame.columns)
    lines = [f"### {title}", ""] if title else []
    lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for _, r in frame.iterrows()]
    return "\n".join(lines) + "\n"


NOTE = ("Δ = FlexiGPT* − ShortGPT + LoRA* at the same ratio and recovery token budget "
        "(log-PPL in nats, Avg in points), paired over the same test documents; every budget "
        "is resampled jointly (one document draw per replicate for all budgets), and the "
        "line Δ = a + b·log10(tokens) is fitted by least squares to the estimates and to each "
        "replicate: intervals are percentile intervals over those fits. Crossover: where the "
        "line reaches 0 after the smallest budget (∞: it moves away from 0). Tokens / param = "
        "recovery tokens over the dense model's parameters (the paper: 1B / 6.7B ≈ 0.15). "
        "Seeds: a side run with several training seeds is resampled by seed, then by "
        "document (two-level); a one-seed side borrows the seed spread measured at the "
        "nearest budget (the ladder's Seeds column). A slope whose interval contains 0 is "
        "reported as an undecided trend, without crossover or extrapolation; a crossover "
        "only when at least 95% of the replicates cross.")
