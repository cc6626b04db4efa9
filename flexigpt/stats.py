"""Bootstrap intervals over documents and perplexity windows, seeds, and claim verdicts.

Inputs are the per-document records of result JSONs
(:func:`flexigpt.evaluation.results.load_records`) or plain arrays. Two runs are paired only
when they scored the same documents: same task, same ``data_sha256`` (per perplexity text:
``text_sha256``, ``seq_len`` and window token counts), the same doc ids and, where recorded,
the same ``doc_hash`` per doc; otherwise :class:`PairingError` names the mismatch.

Statistics (all percentile bootstrap intervals, ``level`` = 0.95, ``n_boot`` = 2000,
deterministic for a given ``seed``; resampling is drawn as per-replicate document counts so
each replicate costs one matrix product):

* accuracy of a run on a task: mean over documents of the per-doc headline metric (``acc`` or
  ``acc_norm``, as the result's ``metric``); the average over tasks weighs tasks equally
  (documents are resampled per task independently, then the task means averaged);
* log-PPL of a run: ``Σ nll / Σ tokens`` over windows (windows resampled);
* a difference ``A − B`` is *paired* by default: each replicate resamples the same documents
  (windows) for both runs, so the per-document correlation between methods cancels;
* several runs per method (seeds; arrays ``[S, n]`` or lists of records) give a hierarchical
  bootstrap: each replicate draws S seeds with replacement per method (one draw shared by all
  tasks of that method: a seed is a whole run), then documents (shared by all seeds and, when
  paired, by both methods); the statistic is the mean over the drawn seeds. The interval
  then carries seed variance plus document variance. A single run (S = 1) is not resampled
  over seeds.

Public API::

    mean_interval(x)                       Interval of mean(x); x [n] or [S, n]
    diff_interval(a, b, paired=True)       Interval of mean(a) - mean(b)
    average_interval({task: x})            Interval of the mean over tasks
    average_diff_interval({task: (a, b)})  Interval of the difference of task averages
    logppl_interval(nll, tokens)           Interval of Σnll/Σtokens
    logppl_diff_interval(nll_a, tok_a, nll_b, tok_b, paired=True)
    task_values(records, task)             -> TaskValues (doc ids, per-doc metric, sha)
    paired_values(runs_a, runs_b, task)    -> (A [S_a, n], B [S_b, n]) after the checks
    run_intervals(records | [records])     single-run (or seeds) ± of each task, average, log-PPL
    compare_runs(a, b)                     paired A − B of each task, the average, log-PPL
    average_diff_replicates([{task: (a, b)}, ...])  -> Replicates: estimate [B], boot [n_boot, B]
    logppl_diff_replicates([(nll_a, tok_a, nll_b, tok_b), ...])  -> Replicates (joint windows)
    paired_replicates([(runs_a, runs_b), ...], metric)  -> Replicates of records (joint docs)
    verdict(ci_low, ci_high, direction, margin=0)
                                           "supported" | "contradicted" |
                                           "no practical difference" | "undecided"
    tail_pvalues(boot, direction, margin)  bootstrap p-value of each decided outcome
    holm(pvalues, alpha) / holm_verdicts(boots, directions, margins)  family-wise control

Joint replicates: several contrasts scored on the same documents (one comparison at several
recovery-token budgets: every budget's runs are evaluated on the same test documents) are
resampled together: each replicate draws one document multiset per task (one window multiset
for log-PPL) and applies it to every run of every contrast, so ``boot[r]`` is one draw of
the whole vector of differences and any function of it (a slope across budgets) gets its
interval from the rows of ``boot``. Drawing each budget with its own seed would treat the
shared documents as independent samples and misstate the spread of such functions.

Margins (smallest effect that matters, m): :func:`verdict` calls an interval wholly beyond
+m supported (a minimum-effect test), wholly beyond −m contradicted, wholly inside ±m "no
practical difference" (equivalence, two one-sided tests) and anything else undecided.
:func:`holm_verdicts` decides a family of such claims with Holm's step-down on the bootstrap
p-values dual to those intervals (:func:`tail_pvalues`), so the family-wise error of all its
supported / contradicted / no-difference calls stays at 1 − level.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

N_BOOT = 2000
LEVEL = 0.95
#: bootstrap replicates × documents drawn at a time (bounds the count matrix, ~32 MB)
_CHUNK_CELLS = 1 << 22
NO_DIFFERENCE = "no practical difference"
VERDICTS = ("supported", "contradicted", NO_DIFFERENCE, "undecided")
_DIRECTIONS = {"greater": 1, ">": 1, "higher": 1, "+": 1,
               "less": -1, "<": -1, "lower": -1, "-": -1}


class PairingError(ValueError):
    """Two runs' records do not describe the same documents (or windows)."""


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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["seeds"] = list(self.seeds)
        return out


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


# ---- the bootstrap engine -----------------------------------------------------------------
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


# ---- records ------------------------------------------------------------------------------
@dataclass
class TaskValues:
    """One run's per-document headline metric on one task, sorted by doc id."""

    task: str
    metric: str
    data_sha256: str | None
    doc_ids: list[int]
    values: np.ndarray
    doc_hashes: list[str | None]


def _task_records(records: Mapping[str, Any], task: str) -> list[dict[str, Any]]:
    tasks = records.get("tasks") if "tasks" in records else records
    if not tasks or task not in tasks:
        raise PairingError(f"no per-document records of task {task!r} "
                           f"(have {sorted(tasks or {})})")
    return tasks[task]


def task_values(records: Mapping[str, Any], task: str, metric: str | None = None,
                ) -> TaskValues:
    """The per-doc ``metric`` (default: the records' headline metric) of ``task``.

    ``records``: :func:`flexigpt.evaluation.results.load_records` output (or its
    ``tasks`` dict).
    """
    docs = sorted(_task_records(records, task), key=lambda r: r["doc_id"])
    if not docs:
        raise PairingError(f"{task}: no documents")
    shas = {d.get("data_sha256") for d in docs}
    metrics = {d.get("metric") for d in docs}
    if len(shas) != 1 or len(metrics) != 1:
        raise PairingError(f"{task}: records mix data sha256 {shas} / metrics {metrics}")
    name = metric or metrics.pop()
    ids = [int(d["doc_id"]) for d in docs]
    if len(set(ids)) != len(ids):
        raise PairingError(f"{task}: duplicate doc ids")
    try:
        values = np.array([float(d[name]) for d in docs])
    except KeyError:
        raise PairingError(f"{task}: records have no per-doc {name!r}") from None
    return TaskValues(task, name, shas.pop(), ids, values, [d.get("doc_hash") for d in docs])


def _check_same_docs(ref: TaskValues, other: TaskValues, where: str) -> None:
    t = ref.task
    if ref.metric != other.metric:
        raise PairingError(f"{t}: metric {ref.metric!r} vs {other.metric!r} ({where})")
    if ref.data_sha256 != other.data_sha256:
        raise PairingError(f"{t}: data_sha256 differs ({where}): {ref.data_sha256} vs "
                           f"{other.data_sha256}; the runs scored different data")
    if ref.doc_ids != other.doc_ids:
        only_a = sorted(set(ref.doc_ids) - set(other.doc_ids))[:5]
        only_b = sorted(set(other.doc_ids) - set(ref.doc_ids))[:5]
        raise PairingError(f"{t}: doc ids differ ({where}): {len(ref.doc_ids)} vs "
                           f"{len(other.doc_ids)} docs; only in the first {only_a}, only in "
                           f"the second {only_b}")
    for i, (h1, h2) in enumerate(zip(ref.doc_hashes, other.doc_hashes, strict=True)):
        if h1 is not None and h2 is not None and h1 != h2:
            raise PairingError(f"{t}: doc {ref.doc_ids[i]} has a different doc_hash ({where})")


def _runs(x: Any) -> list[Mapping[str, Any]]:
    """A records dict or a sequence of them (seeds)."""
    if isinstance(x, Mapping):
        return [x]
    runs = list(x)
    if not runs or not all(isinstance(r, Mapping) for r in runs):
        raise ValueError("expected a records dict or a non-empty list of them")
    return runs


def paired_values(runs_a: Any, runs_b: Any | None, task: str, metric: str | None = None,
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """``(A [S_a, n], B [S_b, n])`` per-doc metrics of ``task`` after checking that every run
    scored the same documents (``runs_b`` None: only the A runs are checked)."""
    vals_a = [task_values(r, task, metric) for r in _runs(runs_a)]
    vals_b = [] if runs_b is None else [task_values(r, task, metric) for r in _runs(runs_b)]
    ref = vals_a[0]
    for i, v in enumerate(vals_a[1:], 1):
        _check_same_docs(ref, v, f"run A0 vs A{i}")
    for i, v in enumerate(vals_b):
        _check_same_docs(ref, v, f"run A0 vs B{i}")
    a = np.stack([v.values for v in vals_a])
    return a, (np.stack([v.values for v in vals_b]) if vals_b else None)


def windows_values(runs: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(nll [S, n], tokens [S, n])`` of perplexity records, checked to be the same windows."""
    recs = []
    for r in _runs(runs):
        ppl = r.get("perplexity") if "perplexity" in r else None
        if ppl is None:
            raise PairingError("a run has no perplexity window records")
        recs.append(ppl)
    ref = recs[0]
    for i, p in enumerate(recs[1:], 1):
        for key in ("text_sha256", "seq_len", "n_windows"):
            if p.get(key) != ref.get(key):
                raise PairingError(f"perplexity {key} differs (run 0 vs run {i}): "
                                   f"{ref.get(key)} vs {p.get(key)}")
        if list(p["tokens"]) != list(ref["tokens"]):
            raise PairingError(f"perplexity window token counts differ (run 0 vs run {i})")
    return (np.array([p["nll"] for p in recs], dtype=np.float64),
            np.array([p["tokens"] for p in recs], dtype=np.float64))


def _common_tasks(runs: list[Mapping[str, Any]], tasks: Sequence[str] | None) -> list[str]:
    have = [set((r.get("tasks") or {})) for r in runs]
    if tasks is None:
        common = set.intersection(*have) if have else set()
        return sorted(common)
    for t in tasks:
        if any(t not in h for h in have):
            raise PairingError(f"task {t!r} is missing from some run's records")
    return list(tasks)


def run_intervals(runs: Any, *, tasks: Sequence[str] | None = None, n_boot: int = N_BOOT,
                  seed: int = 0, level: float = LEVEL) -> dict[str, Any]:
    """Single-run (or, given several runs, seed + document) intervals of one method:
    ``{"tasks": {t: Interval of accuracy}, "average": Interval | None,
    "log_ppl": Interval | None}`` (accuracy as a 0–1 fraction)."""
    rs = _runs(runs)
    names = _common_tasks(rs, tasks)
    values = {t: paired_values(rs, None, t)[0] for t in names}
    out: dict[str, Any] = {
        "tasks": {t: mean_interval(v, n_boot=n_boot, seed=seed, level=level)
                  for t, v in values.items()},
        "average": average_interval(values, n_boot=n_boot, seed=seed, level=level)
        if values else None, "log_ppl": None}
    if all(r.get("perplexity") for r in rs):
        nll, tok = windows_values(rs)
        out["log_ppl"] = logppl_interval(nll, tok, n_boot=n_boot, seed=seed, level=level)
    return out


def compare_runs(a: Any, b: Any, *, tasks: Sequence[str] | None = None, paired: bool = True,
                 n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL,
                 ) -> dict[str, Any]:
    """Paired intervals of A − B: ``{"tasks": {t: Interval}, "average": Interval | None,
    "log_ppl": Interval | None}``; ``a``/``b``: a records dict or a list of them (seeds).
    ``tasks`` None: the tasks every run has. Raises :class:`PairingError` when the runs did
    not score the same documents / windows."""
    ra, rb = _runs(a), _runs(b)
    names = _common_tasks(ra + rb, tasks)
    pairs = {t: paired_values(ra, rb, t) for t in names}
    kw = {"paired": paired, "n_boot": n_boot, "seed": seed, "level": level}
    out: dict[str, Any] = {
        "tasks": {t: diff_interval(x, y, **kw) for t, (x, y) in pairs.items()},
        "average": average_diff_interval(pairs, **kw) if pairs else None, "log_ppl": None}
    if all(r.get("perplexity") for r in ra + rb):
        nll, tok = windows_values(ra + rb)
        k = len(ra)
        out["log_ppl"] = logppl_diff_interval(nll[:k], tok[:k], nll[k:], tok[k:], **kw)
    return out


def _split(stacked: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """Rows of ``stacked [ΣS, n]`` split into consecutive ``[S_i, n]`` blocks."""
    return np.split(stacked, np.cumsum(sizes)[:-1])


def paired_replicates(pairs: Sequence[tuple[Any, Any]], metric: str, *,
                      tasks: Sequence[str] | None = None, paired: bool = True,
                      n_boot: int = N_BOOT, seed: int = 0) -> Replicates:
    """Joint bootstrap replicates of ``A_j − B_j`` for the contrasts ``pairs[j] = (runs_a,
    runs_b)`` (each a records dict or a list of them: seeds).

    ``metric``: ``"log_ppl"`` (Σnll/Σtokens, nats), ``"avg"`` (equal-weight mean over
    ``tasks``, default the tasks every run has) or one task name (accuracy as a 0–1
    fraction). Every run of every pair must have scored the same documents (windows):
    :class:`PairingError` otherwise. With ``paired``, each replicate resamples one set of
    documents per task shared by all runs of all contrasts: the contrasts (e.g. the same
    comparison at several token budgets, evaluated on the same test documents) are
    resampled jointly, never with independent draws that would hide their covariance.
    Seeds are resampled per run list. Contrast j alone, same seed, equals
    :func:`compare_runs`' interval of that metric."""
    if not pairs:
        raise ValueError("need at least one pair of runs")
    sides = [_runs(x) for pair in pairs for x in pair]
    flat = [r for side in sides for r in side]
    sizes = [len(side) for side in sides]
    if metric == "log_ppl":
        nll, tok = (_split(x, sizes) for x in windows_values(flat))
        groups = [[_as_group(nll[i], tok[i], "nll")] for i in range(len(sides))]
    else:
        names = ([metric] if metric != "avg"
                 else sorted(_common_tasks(flat, tasks)))
        if not names:
            raise PairingError("no task common to every run")
        per_task = [_split(paired_values(flat, None, t)[0], sizes) for t in names]
        groups = [[_as_group(per_task[k][i], what=names[k]) for k in range(len(names))]
                  for i in range(len(sides))]
    return _contrast_replicates([(groups[2 * j], groups[2 * j + 1]) for j in range(len(pairs))],
                                paired, n_boot, seed)


# ---- decisions with a margin, and Holm ----------------------------------------------------
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
        best = min(tails, key=tails.get)
        cands.append(best)
        ps.append(min(1.0, 2 * tails[best]))
    if not ps:
        return []
    return [c if ok else "undecided" for c, ok in zip(cands, holm(ps, 1 - level), strict=True)]
