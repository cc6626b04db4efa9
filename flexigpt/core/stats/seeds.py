"""The training-seed component of a difference: per-run values on the full data, their
spread across seeds, and the component a one-seed contrast borrows from where seeds were
measured.

A difference A − B measured with one training run per side has an interval over documents
only: a second seed would move the estimate by the seed-to-seed spread, which documents do
not show. Where the same methods were run with several seeds (at another token budget), the
sample variance of their per-run values (:func:`seed_variance`) estimates that spread, and
:func:`add_seed_component` adds it to the one-seed contrast's bootstrap replicates as a
normal draw per replicate, so every function of the replicates (a slope across budgets)
carries it. A side with several seeds is resampled by the hierarchical bootstrap already
(:func:`flexigpt.core.stats.paired_replicates`) and borrows nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from flexigpt.core.stats.intervals import Replicates
from flexigpt.core.stats.records import _common_tasks, _runs, paired_values, windows_values


def run_values(runs: Any, metric: str, tasks: Sequence[str] | None = None) -> np.ndarray:
    """``[S]`` the metric of each run on its full data: ``"log_ppl"`` = Σnll/Σtokens
    (nats), ``"avg"`` = the equal-weight mean over ``tasks`` (default: every common task)
    of per-task mean accuracy (0–1), or one task's mean accuracy."""
    rs = _runs(runs)
    if metric == "log_ppl":
        nll, tok = windows_values(rs)
        return nll.sum(axis=1) / tok.sum(axis=1)
    names = [metric] if metric != "avg" else sorted(_common_tasks(rs, tasks))
    per_task = [paired_values(rs, None, t)[0].mean(axis=1) for t in names]
    return np.mean(per_task, axis=0)


def seed_variance(runs: Any, metric: str, tasks: Sequence[str] | None = None,
                  scale: float = 1.0) -> float | None:
    """Sample variance (ddof 1) across runs of ``scale`` × :func:`run_values`; None for a
    single run."""
    values = scale * run_values(runs, metric, tasks)
    return float(np.var(values, ddof=1)) if values.size >= 2 else None


def add_seed_component(reps: Replicates, variances: Sequence[float], seed: int = 0,
                       ) -> Replicates:
    """Replicates with contrast j's column shifted by an independent N(0, variances[j])
    draw per replicate (0: unchanged); the estimate is unchanged. Draws are deterministic
    for ``seed`` and independent across contrasts (each budget's runs are trained apart)."""
    var = np.asarray(variances, dtype=np.float64)
    if var.shape != reps.estimate.shape or not np.isfinite(var).all() or (var < 0).any():
        raise ValueError(f"variances must be {reps.estimate.shape[0]} finite values >= 0, "
                         f"got {variances!r}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 4049]))
    noise = rng.standard_normal(reps.boot.shape) * np.sqrt(var)[None, :]
    return Replicates(reps.estimate, reps.boot + noise, reps.n, reps.seeds)
