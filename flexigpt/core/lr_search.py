"""The bracketing learning-rate search of a recovery sweep: one rule for every method.

A sweep's trials lie on a log lattice per learning-rate *axis* (``lr``; ``lr`` and
``gamma_lr`` for a recipe with an own γ LR): ``anchor · factor^k`` for integer k, the anchor
being the axis's first start value (``tuning.grid``). :func:`propose` is a pattern search on
that lattice: after the start points are scored it proposes, one at a time, the first
unevaluated axis-neighbour (``k − 1`` then ``k + 1``, axes in order) of the current best,
until the best has an evaluated neighbour on each side of every axis (*bracketed*), the
neighbour lies outside the axis's hard range, or the trial cap is reached. A diverged trial
counts as worse than every scored one. For two axes this is a coordinate search that ends
at a point no better axis-neighbour exists for (each axis bracketed at the other's choice).

Every trial is scored the same way by its sweep (tuning-split perplexity at the successive-
halving rung, or at the end when every trial trains fully): the rule has no per-method
setting, and every run of a config gets the same cap.

:func:`bracket_status` tells, from any sweep's trials (searched or a fixed grid), whether
its choice is bracketed at spacing ≤ ``max_spacing`` on every searched axis, or why not.

Shapes: a *point* is ``{axis: value}``; scores are floats (lower is better) or None
(diverged / not finite).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: the learning-rate fields a search may move, in proposal order
AXES = ("lr", "gamma_lr")
#: relative tolerance of "lies on the lattice" and "is the same value"
_TOL = 1e-6
BRACKETED = "bracketed"
#: the variant suffix of a run trained at its twin's next-best learning rates (the DAG's
#: ``tuning.sensitivity`` rows; the verdicts' Sensitivity column)
NEXT_SUFFIX = "_next"
#: the status of a sweep whose trials vary no learning rate (one point, or reused)
NOT_SEARCHED = "edge: one learning rate, not searched"


@dataclass(frozen=True)
class Bracketing:
    """The search rule of a config (``tuning.bracket``).

    Attributes:
        factor: lattice spacing, ``1 < factor ≤ 2`` (the issue's "spacing ≤ 2×").
        ranges: hard range ``(low, high)`` per axis; a neighbour outside is never tried.
        max_trials: most trials one sweep may score (start points included).
    """

    factor: float
    ranges: dict[str, tuple[float, float]]
    max_trials: int

    def __post_init__(self) -> None:
        if not 1.0 < self.factor <= 2.0:
            raise ValueError(f"tuning.bracket.factor must be in (1, 2], got {self.factor!r}")
        if self.max_trials < 3:
            raise ValueError("tuning.bracket.max_trials must be at least 3 (a point and its "
                             f"two neighbours), got {self.max_trials!r}")
        for axis, (low, high) in self.ranges.items():
            if axis not in AXES:
                raise ValueError(f"tuning.bracket.range: unknown axis {axis!r} (one of {AXES})")
            if not 0 < low < high:
                raise ValueError(f"tuning.bracket.range.{axis} must be 0 < low < high, got "
                                 f"[{low}, {high}]")

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Bracketing:
        """From the config's ``tuning.bracket`` (``factor``, ``max_trials``, ``range``)."""
        ranges = {axis: (float(bounds[0]), float(bounds[1]))
                  for axis, bounds in (spec.get("range") or {}).items()}
        return cls(float(spec["factor"]), ranges, int(spec["max_trials"]))

    def to_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "max_trials": self.max_trials,
                "range": {axis: list(bounds) for axis, bounds in self.ranges.items()}}

    def axes_of(self, points: Sequence[dict[str, Any]]) -> tuple[str, ...]:
        """The axes the start ``points`` set, in :data:`AXES` order; each needs a range."""
        axes = tuple(a for a in AXES if any(p.get(a) is not None for p in points))
        missing = [a for a in axes if a not in self.ranges]
        if missing:
            raise ValueError(f"tuning.bracket.range has no hard range for {missing}")
        return axes


def varied_axes(points: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The axes whose value differs between ``points`` (a fixed grid's searched axes)."""
    return tuple(a for a in AXES
                 if len({p.get(a) for p in points if p.get(a) is not None}) > 1)


def _index(value: float, anchor: float, factor: float) -> int:
    """k with ``value == anchor · factor^k`` (ValueError when off the lattice)."""
    k = math.log(value / anchor) / math.log(factor)
    if abs(k - round(k)) > 1e-6:
        raise ValueError(f"learning rate {value:g} is not on the ×{factor:g} lattice through "
                         f"{anchor:g}: start points must differ by whole powers of the factor")
    return round(k)


def lattice_value(anchor: float, factor: float, k: int) -> float:
    """``anchor · factor^k`` rounded to 6 significant digits (so 4e-3 / 2 is 2e-3 exactly as
    written in a config)."""
    return float(f"{anchor * factor ** k:.6g}")


def _coords(points: Sequence[dict[str, Any]], axes: tuple[str, ...],
            anchors: dict[str, float], factor: float) -> list[tuple[int, ...]]:
    return [tuple(_index(float(p[a]), anchors[a], factor) for a in axes) for p in points]


def best_index(scores: Sequence[float | None]) -> int | None:
    """Index of the lowest finite score (ties: the first), None when there is none."""
    finite = [(s, i) for i, s in enumerate(scores) if s is not None and math.isfinite(s)]
    return min(finite)[1] if finite else None


def propose(points: Sequence[dict[str, Any]], scores: Sequence[float | None],
            rule: Bracketing) -> dict[str, float] | None:
    """The next point to score, or None when the search is done (see the module doc).

    ``points[0]`` anchors every axis's lattice; ``points`` and ``scores`` are every trial
    scored so far, in order. When no trial has a finite score yet, the proposal is one
    lattice step below the lowest point on every axis (a learning rate that diverges is too
    large), while that stays in range.
    """
    if len(points) != len(scores) or not points:
        raise ValueError(f"{len(points)} points but {len(scores)} scores")
    if len(points) >= rule.max_trials:
        return None
    axes = rule.axes_of(points)
    anchors = {a: float(points[0][a]) for a in axes}
    coords = _coords(points, axes, anchors, rule.factor)
    seen = set(coords)
    best = best_index(scores)
    if best is None:
        lowest = tuple(min(c[j] for c in coords) - 1 for j in range(len(axes)))
        point = _point(axes, anchors, rule.factor, lowest)
        return point if _in_range(point, rule) and lowest not in seen else None
    for j in range(len(axes)):
        for step in (-1, 1):
            near = tuple(k + step if i == j else k for i, k in enumerate(coords[best]))
            point = _point(axes, anchors, rule.factor, near)
            if near not in seen and _in_range(point, rule):
                return point
    return None


def _point(axes: tuple[str, ...], anchors: dict[str, float], factor: float,
           coord: tuple[int, ...]) -> dict[str, float]:
    return {a: lattice_value(anchors[a], factor, k) for a, k in zip(axes, coord, strict=True)}


def _in_range(point: dict[str, float], rule: Bracketing) -> bool:
    return all(rule.ranges[a][0] * (1 - _TOL) <= v <= rule.ranges[a][1] * (1 + _TOL)
               for a, v in point.items())


def bracket_status(points: Sequence[dict[str, Any]], scores: Sequence[float | None],
                   chosen: int, axes: Sequence[str], max_spacing: float = 2.0,
                   rule: Bracketing | None = None) -> dict[str, Any]:
    """Whether trial ``chosen`` is bracketed on every axis of ``axes``.

    On each axis, its neighbours are the trials equal to it on the other axes with the
    nearest value below and above. The axis is bracketed when both exist, each within
    ``max_spacing`` (ratio) and worse (higher score, or diverged). Works for any sweep's
    trials, searched or a fixed grid.

    Returns:
        ``{"status": "bracketed" | "edge: <reasons>", "neighbours": {axis: {"below":
        (value, score) | None, "above": ...}}}``; a reason names the axis and side, and,
        with ``rule``, whether the hard range or the trial cap stopped the search there.
    """
    at = points[chosen]
    reasons: list[str] = []
    neighbours: dict[str, dict[str, Any]] = {}
    mine_of = {axis: float(at[axis]) for axis in axes}
    found = _nearest(points, chosen, axes)
    for axis in axes:
        sides = {side: None if i is None else (float(points[i][axis]), scores[i])
                 for side, i in found[axis].items()}
        neighbours[axis] = sides
        for side, near in sides.items():
            reason = _side_reason(axis, side, mine_of[axis], near, scores[chosen], max_spacing,
                                  rule, len(points))
            if reason:
                reasons.append(reason)
    return {"status": BRACKETED if not reasons else "edge: " + "; ".join(reasons),
            "neighbours": neighbours}


def axis_neighbours(points: Sequence[dict[str, Any]], chosen: int,
                    axes: Sequence[str]) -> list[int]:
    """Indices of the trials nearest to ``points[chosen]`` below and above on each axis
    (equal to it on the other axes), axes in order, below first; at most ``2·len(axes)``."""
    found = _nearest(points, chosen, axes)
    return [i for axis in axes for i in (found[axis]["below"], found[axis]["above"])
            if i is not None]


def _nearest(points: Sequence[dict[str, Any]], chosen: int,
             axes: Sequence[str]) -> dict[str, dict[str, int | None]]:
    """Per axis, the index of the nearest trial below and above the chosen one."""
    at = points[chosen]
    out: dict[str, dict[str, int | None]] = {}
    for axis in axes:
        mine = float(at[axis])
        line = [(float(p[axis]), i) for i, p in enumerate(points)
                if i != chosen and p.get(axis) is not None
                and all(_same(p.get(o), at.get(o)) for o in axes if o != axis)]
        below = max((t for t in line if t[0] < mine * (1 - _TOL)), default=None)
        above = min((t for t in line if t[0] > mine * (1 + _TOL)), default=None)
        out[axis] = {"below": None if below is None else below[1],
                     "above": None if above is None else above[1]}
    return out


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(float(a) - float(b)) <= _TOL * max(abs(float(a)), abs(float(b)))


def _side_reason(axis: str, side: str, mine: float, near: tuple[float, float | None] | None,
                 score: float | None, max_spacing: float, rule: Bracketing | None,
                 trials: int) -> str | None:
    """Why one side of one axis does not bracket the choice (None: it does)."""
    if near is None:
        if rule is not None and axis in rule.ranges:
            low, high = rule.ranges[axis]
            step = mine / rule.factor if side == "below" else mine * rule.factor
            if not low * (1 - _TOL) <= step <= high * (1 + _TOL):
                return f"{axis} {side} hard range [{low:g}, {high:g}]"
            if trials >= rule.max_trials:
                return f"{axis} {side} untried: trial cap {rule.max_trials}"
        return f"{axis} {side} untried" if rule is not None else f"{axis} {side}: grid edge"
    value, other = near
    ratio = max(value, mine) / min(value, mine)
    if ratio > max_spacing * (1 + _TOL):
        return f"{axis} {side}: nearest trial ×{ratio:g} away"
    if other is not None and math.isfinite(other) and score is not None and other <= score:
        return f"{axis} {side}: neighbour not worse"
    return None
