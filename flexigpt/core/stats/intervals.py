"""Bootstrap intervals and jointly drawn replicates of arrays of per-document values
(accuracy per doc, NLL and tokens per perplexity window): :class:`Interval`,
:class:`Replicates` and the array-level API (``mean_interval`` ... ``logppl_diff_replicates``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from flexigpt.core.stats.bootstrap import (
    LEVEL,
    N_BOOT,
    _Arm,
    _as_group,
    _check_args,
    _Group,
    _replicates,
)
from flexigpt.core.stats.decisions import verdict


@dataclass(frozen=True)
class Interval:
    """A bootstrap interval.

    Attributes:
        estimate: the statistic on the full data (not the bootstrap mean).
        low, high: percentile interval at ``level``.
        se: standard deviation of the bootstrap replicates.
        n: documents (windows) per run; for an average, the smallest task's.
        seeds: runs per method that were resampled (``(S_a, S_b)`` for a difference).
    """

    estimate: float
    low: float
    high: float
    se: float
    level: float
    n: int
    n_boot: int
    seeds: tuple[int, ...] = (1,)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def verdict(self, direction: str, margin: float = 0.0) -> str:
        """:func:`verdict` of this interval."""
        return verdict(self.low, self.high, direction, margin)

    def scaled(self, k: float) -> Interval:
        """The same interval in other units (``k`` × estimate, bounds and se; e.g. 100 for
        points)."""
        return replace(self, estimate=k * self.estimate, low=k * self.low, high=k * self.high,
                       se=k * self.se)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["seeds"] = list(self.seeds)
        return out


def _interval(estimate: float, boot: np.ndarray, level: float, n: int,
              seeds: tuple[int, ...]) -> Interval:
    """The percentile interval of replicates ``boot [n_boot]`` around ``estimate``."""
    alpha = 1 - level
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return Interval(estimate=float(estimate), low=float(low), high=float(high),
                    se=float(boot.std(ddof=1)), level=level, n=n, n_boot=len(boot),
                    seeds=seeds)


def _bootstrap(sides: list[list[_Group]], paired: bool, n_boot: int, seed: int,
               level: float) -> Interval:
    """Interval of ``stat(side 0) − stat(side 1)`` (or ``stat(side 0)`` with one side), where
    a side's statistic is the mean over its groups (tasks) of the seed-mean per-seed
    statistic. Groups of the same index across sides are paired when ``paired``."""
    _check_args(n_boot, level)
    arms = [_Arm(side, 0, sign) for side, sign in zip(sides, (1.0, -1.0))]
    estimate, boot = _replicates(arms, 1, paired, n_boot, seed)
    n = min(g.n for side in sides for g in side)
    return _interval(estimate[0], boot[:, 0], level, n, tuple(side[0].seeds for side in sides))


@dataclass(frozen=True, eq=False)
class Replicates:
    """Jointly drawn bootstrap replicates of B paired differences (contrasts).

    Attributes:
        estimate: ``[B]`` each difference on the full data.
        boot: ``[n_boot, B]``; row r is replicate r of every contrast, all computed on the
            same resampled documents (windows), so the columns' covariance is kept.
        n: documents (windows) per run; for an average, the smallest task's.
        seeds: per contrast ``(S_a, S_b)``, the runs resampled per side.
    """

    estimate: np.ndarray
    boot: np.ndarray
    n: int
    seeds: tuple[tuple[int, int], ...]

    @property
    def n_boot(self) -> int:
        return int(self.boot.shape[0])

    def interval(self, j: int = 0, level: float = LEVEL) -> Interval:
        """The percentile :class:`Interval` of contrast ``j``."""
        _check_args(self.n_boot, level)
        return _interval(float(self.estimate[j]), self.boot[:, j], level, self.n,
                         self.seeds[j])

    def scaled(self, k: float) -> Replicates:
        """The same replicates in other units (``k`` × every value, e.g. 100 for points)."""
        return Replicates(k * self.estimate, k * self.boot, self.n, self.seeds)


def _contrast_replicates(contrasts: list[tuple[list[_Group], list[_Group]]], paired: bool,
                         n_boot: int, seed: int) -> Replicates:
    _check_args(n_boot, LEVEL)
    if not contrasts:
        raise ValueError("need at least one contrast")
    arms = [_Arm(side, j, sign) for j, (a, b) in enumerate(contrasts)
            for side, sign in ((a, 1.0), (b, -1.0))]
    estimate, boot = _replicates(arms, len(contrasts), paired, n_boot, seed)
    n = min(g.n for arm in arms for g in arm.groups)
    return Replicates(estimate, boot, n, tuple((a[0].seeds, b[0].seeds) for a, b in contrasts))


# ---- array-level API ----------------------------------------------------------------------
def mean_interval(x: Any, *, n_boot: int = N_BOOT, seed: int = 0,
                  level: float = LEVEL) -> Interval:
    """Interval of the mean of per-document values ``x [n]`` (one run) or ``[S, n]`` (S
    seeds of one method on the same documents: hierarchical)."""
    return _bootstrap([[_as_group(x)]], True, n_boot, seed, level)


def diff_interval(a: Any, b: Any, *, paired: bool = True, n_boot: int = N_BOOT,
                  seed: int = 0, level: float = LEVEL) -> Interval:
    """Interval of ``mean(a) − mean(b)``; ``a``/``b`` ``[n]`` or ``[S, n]`` on the same
    documents in the same order (``paired=False``: resampled independently)."""
    return _bootstrap([[_as_group(a, what="a")], [_as_group(b, what="b")]], paired, n_boot,
                      seed, level)


def average_interval(values: Mapping[str, Any], *, n_boot: int = N_BOOT, seed: int = 0,
                     level: float = LEVEL) -> Interval:
    """Interval of the equal-weight mean over tasks of per-task means (``{task: x}``)."""
    names = sorted(values)
    return _bootstrap([[_as_group(values[t], what=t) for t in names]], True, n_boot, seed,
                      level)


def average_diff_interval(pairs: Mapping[str, tuple[Any, Any]], *, paired: bool = True,
                          n_boot: int = N_BOOT, seed: int = 0,
                          level: float = LEVEL) -> Interval:
    """Interval of ``avg_t mean(a_t) − avg_t mean(b_t)`` (``{task: (a_t, b_t)}``;
    documents resampled per task independently, paired within a task)."""
    names = sorted(pairs)
    return _bootstrap([[_as_group(pairs[t][0], what=t) for t in names],
                       [_as_group(pairs[t][1], what=t) for t in names]], paired, n_boot,
                      seed, level)


def logppl_interval(nll: Any, tokens: Any, *, n_boot: int = N_BOOT, seed: int = 0,
                    level: float = LEVEL) -> Interval:
    """Interval of log-PPL = Σnll/Σtokens over windows (``[n]`` or ``[S, n]``)."""
    return _bootstrap([[_as_group(nll, tokens, "nll")]], True, n_boot, seed, level)


def logppl_diff_interval(nll_a: Any, tokens_a: Any, nll_b: Any, tokens_b: Any, *,
                         paired: bool = True, n_boot: int = N_BOOT, seed: int = 0,
                         level: float = LEVEL) -> Interval:
    """Interval of ``logPPL(a) − logPPL(b)`` (= log of the PPL ratio) over the same windows."""
    return _bootstrap([[_as_group(nll_a, tokens_a, "nll_a")],
                       [_as_group(nll_b, tokens_b, "nll_b")]], paired, n_boot, seed, level)


def average_diff_replicates(contrasts: Sequence[Mapping[str, tuple[Any, Any]]], *,
                            paired: bool = True, n_boot: int = N_BOOT,
                            seed: int = 0) -> Replicates:
    """Joint replicates of B differences of task averages: contrast j is
    ``{task: (a_t, b_t)}`` (each ``[n_t]`` or ``[S, n_t]``), every contrast with the same
    tasks and the same documents per task (same order). Each replicate draws one document
    multiset per task shared by every run of every contrast (``paired``), so the columns
    of ``boot [n_boot, B]`` are as correlated as the estimates are (e.g. one comparison at
    B token budgets, all scored on the same test documents). One contrast with one task
    gives the replicates behind :func:`diff_interval` (same seed: same numbers)."""
    if not contrasts:
        raise ValueError("need at least one contrast")
    names = sorted(contrasts[0])
    if not names or any(sorted(c) != names for c in contrasts):
        raise ValueError("every contrast needs the same, non-empty set of tasks")
    return _contrast_replicates(
        [([_as_group(c[t][0], what=t) for t in names], [_as_group(c[t][1], what=t)
                                                        for t in names]) for c in contrasts],
        paired, n_boot, seed)


def logppl_diff_replicates(contrasts: Sequence[tuple[Any, Any, Any, Any]], *,
                           paired: bool = True, n_boot: int = N_BOOT,
                           seed: int = 0) -> Replicates:
    """Joint replicates of B log-PPL differences: contrast j is ``(nll_a, tokens_a, nll_b,
    tokens_b)`` (each ``[n]`` or ``[S, n]``) over the same n windows; windows are drawn
    once per replicate for all contrasts (``paired``). One contrast: the replicates behind
    :func:`logppl_diff_interval`."""
    return _contrast_replicates(
        [([_as_group(na, ta, "nll_a")], [_as_group(nb, tb, "nll_b")])
         for na, ta, nb, tb in contrasts], paired, n_boot, seed)
