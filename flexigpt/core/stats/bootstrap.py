"""The bootstrap engine of :mod:`flexigpt.core.stats`: per-replicate document counts and seed
weights, applied to groups of per-document values (one task, or one perplexity text, of one
method) and summed into contrasts.

A group is ``num [S, n]`` (S runs = seeds, n documents) and optionally ``den [S, n]``
(token counts: the statistic is then Σnum/Σden, a log-PPL); :func:`_replicates` draws
``n_boot`` replicates of every output at once, one document multiset per group index shared
by all arms when paired. Deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

N_BOOT = 2000
LEVEL = 0.95
#: bootstrap replicates × documents drawn at a time (bounds the count matrix, ~32 MB)
_CHUNK_CELLS = 1 << 22


class PairingError(ValueError):
    """Two runs' records do not describe the same documents (or windows)."""


@dataclass
class _Group:
    """One task (or perplexity text) of one method: ``num [S, n]``, ``den [S, n] | None``
    (None: plain mean); the per-seed statistic is Σnum/Σden over the drawn documents."""

    num: np.ndarray
    den: np.ndarray | None

    @property
    def seeds(self) -> int:
        return self.num.shape[0]

    @property
    def n(self) -> int:
        return self.num.shape[1]

    def full(self) -> np.ndarray:
        """Per-seed statistic on all documents, ``[S]``."""
        if self.den is None:
            return self.num.mean(axis=1)
        return self.num.sum(axis=1) / self.den.sum(axis=1)

    def weighted(self, counts: np.ndarray) -> np.ndarray:
        """Per-seed statistic under document counts ``[c, n]`` → ``[c, S]``."""
        total = counts @ self.num.T
        if self.den is None:
            return total / self.n
        return total / (counts @ self.den.T)


def _as_group(x: Any, den: Any = None, what: str = "values") -> _Group:
    num = np.asarray(x, dtype=np.float64)
    if num.ndim == 1:
        num = num[None]
    if num.ndim != 2 or num.shape[1] == 0 or num.shape[0] == 0:
        raise ValueError(f"{what} must be a non-empty [n] or [seeds, n] array, got shape "
                         f"{np.shape(x)}")
    if not np.isfinite(num).all():
        raise ValueError(f"{what} contain non-finite values")
    d = None
    if den is not None:
        d = np.asarray(den, dtype=np.float64)
        d = d[None] if d.ndim == 1 else d
        if d.shape != num.shape:
            raise ValueError(f"{what}: token counts {d.shape} do not match NLLs {num.shape}")
        if (d <= 0).any():
            raise ValueError(f"{what}: token counts must be positive")
    return _Group(num, d)


def _doc_counts(rng: np.random.Generator, c: int, n: int) -> np.ndarray:
    """``[c, n]`` bootstrap counts: each row the multiplicities of n draws from n docs."""
    idx = rng.integers(0, n, size=(c, n)) + (np.arange(c) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=c * n).reshape(c, n).astype(np.float64)


def _seed_weights(rng: np.random.Generator, n_boot: int, s: int) -> np.ndarray:
    """``[n_boot, S]`` weights of a with-replacement draw of S seeds (all 1/S if S == 1)."""
    if s == 1:
        return np.ones((n_boot, 1))
    idx = rng.integers(0, s, size=(n_boot, s)) + (np.arange(n_boot) * s)[:, None]
    return np.bincount(idx.ravel(), minlength=n_boot * s).reshape(n_boot, s) / s


def _check_args(n_boot: int, level: float) -> None:
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 10:
        raise ValueError(f"n_boot must be an int >= 10, got {n_boot!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")


@dataclass
class _Arm:
    """One run (list of seeds) of one contrast: its ``groups`` (one per task, the same task
    order in every arm), added to output column ``out`` with ``sign`` (+1: A, −1: B)."""

    groups: list[_Group]
    out: int = 0
    sign: float = 1.0

    @property
    def seeds(self) -> int:
        return self.groups[0].seeds


def _check_arms(arms: list[_Arm], n_out: int) -> None:
    if not arms or n_out < 1 or {a.out for a in arms} != set(range(n_out)):
        raise ValueError("every output needs at least one arm")
    n_groups = len(arms[0].groups)
    for arm in arms:
        if len(arm.groups) != n_groups or not arm.groups:
            raise ValueError("every side needs the same, non-zero number of groups")
        if len({g.seeds for g in arm.groups}) != 1:
            raise ValueError("every task of one method needs the same number of runs")
    for k in range(n_groups):
        if len({arm.groups[k].n for arm in arms}) != 1:
            raise PairingError(f"group {k}: sizes differ ({[a.groups[k].n for a in arms]})")


def _replicates(arms: list[_Arm], n_out: int, paired: bool, n_boot: int,
                seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(estimate [n_out], boot [n_boot, n_out])`` of ``Σ_arms sign · stat(arm)`` per output,
    where an arm's statistic is the mean over its groups (tasks) of the seed-mean per-seed
    statistic. When ``paired``, every replicate draws one document multiset per group index,
    shared by all arms of all outputs (so outputs are jointly resampled); each arm draws its
    seeds on its own."""
    _check_arms(arms, n_out)
    rng = np.random.default_rng(seed)
    weights = [_seed_weights(rng, n_boot, arm.seeds) for arm in arms]
    n_groups = len(arms[0].groups)
    boot, estimate = np.zeros((n_boot, n_out)), np.zeros(n_out)
    for k in range(n_groups):
        n = arms[0].groups[k].n
        chunk = max(1, min(n_boot, _CHUNK_CELLS // n))
        for start in range(0, n_boot, chunk):
            c = min(chunk, n_boot - start)
            shared = _doc_counts(rng, c, n) if paired else None
            for arm, w in zip(arms, weights, strict=True):
                counts = shared if shared is not None else _doc_counts(rng, c, n)
                per_seed = arm.groups[k].weighted(counts)  # [c, S]
                boot[start:start + c, arm.out] += arm.sign * (per_seed
                                                              * w[start:start + c]).sum(axis=1)
        contrib = np.zeros(n_out)
        for arm in arms:
            contrib[arm.out] += arm.sign * float(arm.groups[k].full().mean())
        estimate += contrib
    return estimate / n_groups, boot / n_groups
