"""Decisions on claims from bootstrap intervals or replicates: :func:`verdict` with a
margin (minimum-effect / equivalence), :func:`tail_pvalues` dual to the percentile interval,
and Holm's step-down over a family of claims (:func:`holm`, :func:`holm_verdicts`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from flexigpt.core.stats.bootstrap import LEVEL

NO_DIFFERENCE = "no practical difference"
VERDICTS = ("supported", "contradicted", NO_DIFFERENCE, "undecided")
_DIRECTIONS = {"greater": 1, ">": 1, "higher": 1, "+": 1,
               "less": -1, "<": -1, "lower": -1, "-": -1}


def verdict(ci_low: float, ci_high: float, direction: str, margin: float = 0.0) -> str:
    """Verdict on a claim "the difference is ``direction`` than 0" from its interval.

    ``direction``: ``"greater"`` (or ``">"``, ``"higher"``) when the claim is A − B > 0,
    ``"less"`` (``"<"``, ``"lower"``) when it is A − B < 0 (e.g. a lower PPL). ``margin``
    m ≥ 0 is the smallest difference that matters. With the interval oriented so that the
    claim is Δ' > 0 (``[low', high']``):

    * ``supported`` iff low' > m (the whole interval beyond +m: a minimum-effect test);
    * ``contradicted`` iff high' < −m (the whole interval beyond −m, the other way);
    * ``no practical difference`` iff −m < low' and high' < m (the whole interval inside
      ±m: equivalence, TOST; only possible with m > 0);
    * ``undecided`` otherwise: the interval touches or covers ±m (e.g. it excludes 0 but
      reaches into (−m, m), or straddles a margin).

    With m = 0: supported / contradicted iff the interval excludes 0 on the claimed /
    other side.
    """
    sign = _oriented(direction)
    low, high = float(ci_low), float(ci_high)
    if math.isnan(low) or math.isnan(high) or low > high:
        raise ValueError(f"not an interval: [{ci_low}, {ci_high}]")
    m = _check_margin(margin)
    low, high = (low, high) if sign > 0 else (-high, -low)
    if low > m:
        return "supported"
    if high < -m:
        return "contradicted"
    if -m < low and high < m:
        return NO_DIFFERENCE
    return "undecided"


def _oriented(direction: str) -> int:
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(_DIRECTIONS)}, got {direction!r}")
    return _DIRECTIONS[direction]


def _check_margin(margin: float) -> float:
    m = float(margin)
    if not m >= 0 or math.isinf(m):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    return m


def tail_pvalues(boot: Any, direction: str, margin: float = 0.0) -> dict[str, float]:
    """One-sided percentile-bootstrap p-values of the three decided outcomes of a claim
    "Δ is ``direction``", from replicates ``boot [n_boot]`` of Δ; with Δ' = ±Δ oriented so
    that the claim is Δ' > 0 and m = ``margin``:

    * ``supported``: H0 Δ' ≤ m, p = (#{Δ'* ≤ m} + 1) / (n_boot + 1);
    * ``contradicted``: H0 Δ' ≥ −m, p = (#{Δ'* ≥ −m} + 1) / (n_boot + 1);
    * ``no practical difference`` (TOST): p = max of the two tails beyond ±m.

    Each is the p-value dual to the percentile interval: ``p ≤ (1 − level)/2`` iff the
    interval at ``level`` lies beyond +m (below −m, inside ±m), up to one replicate."""
    x = _oriented(direction) * np.asarray(boot, dtype=np.float64).ravel()
    m, n = _check_margin(margin), x.size
    if n < 10 or not np.isfinite(x).all():
        raise ValueError("boot must hold >= 10 finite replicates")
    tail = lambda k: (int(k) + 1) / (n + 1)  # noqa: E731
    return {"supported": tail((x <= m).sum()), "contradicted": tail((x >= -m).sum()),
            NO_DIFFERENCE: max(tail((x >= m).sum()), tail((x <= -m).sum()))}


def holm(pvalues: Sequence[float], alpha: float = 1 - LEVEL) -> list[bool]:
    """Holm's step-down: ``rejected[i]`` for the family ``pvalues`` at family-wise error
    ``alpha``. The i-th smallest p (i = 0..K−1) is rejected iff every p up to it satisfies
    p_(j) ≤ alpha / (K − j); the others are kept."""
    p = np.asarray(pvalues, dtype=np.float64)
    if p.ndim != 1 or np.isnan(p).any():
        raise ValueError("pvalues must be a flat sequence of numbers")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    out = [False] * len(p)
    for j, i in enumerate(np.argsort(p, kind="stable")):
        if p[i] > alpha / (len(p) - j):
            break
        out[int(i)] = True
    return out


def holm_verdicts(boots: Sequence[Any], directions: Sequence[str], margins: Sequence[float],
                  level: float = LEVEL) -> list[str]:
    """Verdicts of a family of K claims (one per replicate array ``boots[k] [n_boot]``),
    family-wise error 1 − ``level`` controlled by Holm's step-down.

    Claim k's p-value is ``2 · min`` of its three :func:`tail_pvalues` (each outcome's
    one-sided test runs at (1 − level)/2, as the interval rule does) and its candidate
    verdict the outcome attaining the minimum; Holm decides which candidates stand, the
    others are ``undecided``. With K = 1 this is :func:`verdict` of the percentile
    interval at ``level`` (up to one replicate)."""
    if not len(boots) == len(directions) == len(margins):
        raise ValueError("boots, directions and margins need one entry per claim")
    cands, ps = [], []
    for boot, direction, margin in zip(boots, directions, margins, strict=True):
        tails = tail_pvalues(boot, direction, margin)
        best = min(tails, key=tails.__getitem__)
        cands.append(best)
        ps.append(min(1.0, 2 * tails[best]))
    if not ps:
        return []
    return [c if ok else "undecided" for c, ok in zip(cands, holm(ps, 1 - level), strict=True)]
