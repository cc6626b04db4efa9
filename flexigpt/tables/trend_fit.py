"""The line Δ = a + b · log10(tokens) through B recovery budgets, with percentile intervals
over jointly resampled bootstrap replicates (:func:`fit_trend`).

Every definition (slope per decade, crossover, its interval and fraction, extrapolation
flags) is in :mod:`flexigpt.tables.trend`, which measures the differences this fits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from flexigpt.core import stats


@dataclass(frozen=True)
class TrendFit:
    """A fitted line Δ = a + b · log10(tokens) through B budgets, with percentile intervals
    over jointly resampled replicates (see the module doc for every definition).

    Per budget (tuples of length B, sorted by tokens): ``tokens``, ``estimates`` (Δ on the
    full data), ``lows`` / ``highs`` (its interval). Fit: ``intercept`` (Δ at 1 token) and
    ``slope`` (per decade of tokens) with ``*_low`` / ``*_high``; ``crossover`` (tokens,
    inf: none), its interval and ``crossover_fraction``; ``crossover_extrapolated`` (None
    without a crossover); ``at_tokens`` with ``at_estimate`` / ``at_low`` / ``at_high``
    and ``at_extrapolated`` (outside the measured budgets), all None when not asked.
    """

    metric: str
    unit: str
    level: float
    n_boot: int
    tokens: tuple[float, ...]
    estimates: tuple[float, ...]
    lows: tuple[float, ...]
    highs: tuple[float, ...]
    intercept: float
    intercept_low: float
    intercept_high: float
    slope: float
    slope_low: float
    slope_high: float
    crossover: float
    crossover_low: float
    crossover_high: float
    crossover_fraction: float
    crossover_extrapolated: bool | None
    at_tokens: float | None = None
    at_estimate: float | None = None
    at_low: float | None = None
    at_high: float | None = None
    at_extrapolated: bool | None = None
    tokens_per_param: tuple[float | None, ...] | None = None
    seeds: tuple[tuple[int, int], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tuples as lists, inf as the string ``"inf"``."""
        def clean(v: Any) -> Any:
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            if isinstance(v, float) and math.isinf(v):
                return "inf" if v > 0 else "-inf"
            return v
        return {k: clean(v) for k, v in asdict(self).items()}


def _check_inputs(tokens: Any, estimates: Any, replicates: Any,
                  level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = np.asarray(tokens, dtype=np.float64)
    e = np.asarray(estimates, dtype=np.float64)
    r = np.asarray(replicates, dtype=np.float64)
    if t.ndim != 1 or t.size < 2 or not np.isfinite(t).all() or (t <= 0).any():
        raise ValueError(f"tokens must be >= 2 positive finite budgets, got {tokens!r}")
    if np.unique(t).size < 2:
        raise ValueError("tokens need at least two distinct budgets to fit a slope")
    if e.shape != t.shape or not np.isfinite(e).all():
        raise ValueError(f"estimates must be {t.shape} finite values, got shape {e.shape}")
    if r.ndim != 2 or r.shape[1] != t.size or r.shape[0] < 10 or not np.isfinite(r).all():
        raise ValueError(f"replicates must be a finite [n_boot >= 10, {t.size}] array, got "
                         f"shape {r.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return t, e, r


def _lines(x: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OLS ``(a [R], b [R])`` of each row of ``ys [R, B]`` on ``x [B]``."""
    design = np.stack([np.ones_like(x), x], axis=1)
    coef = np.linalg.pinv(design) @ ys.T  # [2, R]
    return coef[0], coef[1]


def _crossovers(a: np.ndarray, b: np.ndarray, x_min: float) -> np.ndarray:
    """Tokens where each line reaches 0 after ``10**x_min`` (inf: it does not)."""
    at_min = a + b * x_min
    crosses = (b != 0) & (at_min * b <= 0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.power(10.0, np.where(crosses, -a / np.where(b == 0, 1.0, b), np.inf))
    return np.where(crosses, np.maximum(out, 10.0 ** x_min), np.inf)


def _pct(values: np.ndarray, level: float,
         method: Literal["linear", "inverted_cdf"] = "linear") -> tuple[float, float]:
    alpha = 1 - level
    lo, hi = np.quantile(values, [alpha / 2, 1 - alpha / 2], method=method)
    return float(lo), float(hi)


def _at(a0: float, b0: float, a: np.ndarray, b: np.ndarray, at_tokens: float | None,
        level: float, t: np.ndarray) -> dict[str, Any]:
    if at_tokens is None:
        return {}
    if not (math.isfinite(at_tokens) and at_tokens > 0):
        raise ValueError(f"at_tokens must be a positive number, got {at_tokens!r}")
    x = math.log10(at_tokens)
    lo, hi = _pct(a + b * x, level)
    return {"at_tokens": float(at_tokens), "at_estimate": float(a0 + b0 * x), "at_low": lo,
            "at_high": hi, "at_extrapolated": bool(at_tokens < t.min() or at_tokens > t.max())}


def fit_trend(tokens: Sequence[float], estimates: Sequence[float] | np.ndarray, replicates: Any, *,
              level: float = stats.LEVEL, at_tokens: float | None = None, metric: str = "",
              unit: str = "", tokens_per_param: Sequence[float | None] | None = None,
              seeds: Sequence[tuple[int, int]] | None = None) -> TrendFit:
    """Fit Δ = a + b·log10(tokens) to ``estimates [B]`` and to each row of ``replicates
    [n_boot, B]`` (joint bootstrap replicates of the B differences, e.g.
    :attr:`stats.Replicates.boot`), B ≥ 2 distinct positive budgets ``tokens [B]``.
    ``at_tokens``: also report the fitted Δ there (flagged when outside the budgets).
    Raises ValueError on malformed input."""
    t, e, r = _check_inputs(tokens, estimates, replicates, level)
    order = np.argsort(t, kind="stable")
    t, e, r = t[order], e[order], r[:, order]
    x = np.log10(t)
    (a0,), (b0,) = _lines(x, e[None])
    a, b = _lines(x, r)
    cross0 = float(_crossovers(np.array([a0]), np.array([b0]), x.min())[0])
    cross = _crossovers(a, b, x.min())
    lows, highs = zip(*(_pct(r[:, j], level) for j in range(t.size)), strict=True)
    tpp = None if tokens_per_param is None else tuple(
        None if tokens_per_param[i] is None else float(tokens_per_param[i]) for i in order)
    return TrendFit(
        metric=metric, unit=unit, level=level, n_boot=int(r.shape[0]),
        tokens=tuple(map(float, t)), estimates=tuple(map(float, e)), lows=tuple(lows),
        highs=tuple(highs), intercept=float(a0), intercept_low=_pct(a, level)[0],
        intercept_high=_pct(a, level)[1], slope=float(b0), slope_low=_pct(b, level)[0],
        slope_high=_pct(b, level)[1], crossover=cross0,
        crossover_low=_pct(cross, level, "inverted_cdf")[0],
        crossover_high=_pct(cross, level, "inverted_cdf")[1],
        crossover_fraction=float(np.isfinite(cross).mean()),
        crossover_extrapolated=None if math.isinf(cross0) else bool(cross0 > t.max()),
        tokens_per_param=tpp,
        seeds=None if seeds is None else tuple(tuple(seeds[i]) for i in order),
        **_at(float(a0), float(b0), a, b, at_tokens, level, t))
