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
    verdict(ci_low, ci_high, direction)    "supported" | "contradicted" | "undecided"
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
VERDICTS = ("supported", "contradicted", "undecided")
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

    def verdict(self, direction: str) -> str:
        """:func:`verdict` of this interval."""
        return verdict(self.low, self.high, direction)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["seeds"] = list(self.seeds)
        return out


def verdict(ci_low: float, ci_high: float, direction: str) -> str:
    """Verdict on a claim "the difference is ``direction`` than 0" from its interval.

    ``direction``: ``"greater"`` (or ``">"``, ``"higher"``) when the claim is A − B > 0,
    ``"less"`` (``"<"``, ``"lower"``) when it is A − B < 0 (e.g. a lower PPL). Supported iff
    the whole interval lies strictly on the claimed side of 0, contradicted iff it lies
    strictly on the other side, undecided otherwise (the interval touches or covers 0).
    """
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {sorted(_DIRECTIONS)}, got {direction!r}")
    low, high = float(ci_low), float(ci_high)
    if math.isnan(low) or math.isnan(high) or low > high:
        raise ValueError(f"not an interval: [{ci_low}, {ci_high}]")
    sign = _DIRECTIONS[direction]
    low, high = (low, high) if sign > 0 else (-high, -low)
    if low > 0:
        return "supported"
    if high < 0:
        return "contradicted"
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


def _bootstrap(sides: list[list[_Group]], paired: bool, n_boot: int, seed: int,
               level: float) -> Interval:
    """Interval of ``stat(side 0) − stat(side 1)`` (or ``stat(side 0)`` with one side), where
    a side's statistic is the mean over its groups (tasks) of the seed-mean per-seed
    statistic. Groups of the same index across sides are paired when ``paired``."""
    _check_args(n_boot, level)
    rng = np.random.default_rng(seed)
    n_groups = len(sides[0])
    for side in sides:
        if len(side) != n_groups or not side:
            raise ValueError("every side needs the same, non-zero number of groups")
        if len({g.seeds for g in side}) != 1:
            raise ValueError("every task of one method needs the same number of runs")
    for k in range(n_groups):
        if len({side[k].n for side in sides}) != 1:
            raise PairingError(f"group {k}: sizes differ ({[s[k].n for s in sides]})")
    signs = [1.0, -1.0][: len(sides)]
    weights = [_seed_weights(rng, n_boot, side[0].seeds) for side in sides]
    boot = np.zeros(n_boot)
    estimate = 0.0
    for k in range(n_groups):
        n = sides[0][k].n
        chunk = max(1, min(n_boot, _CHUNK_CELLS // n))
        for start in range(0, n_boot, chunk):
            c = min(chunk, n_boot - start)
            shared = _doc_counts(rng, c, n) if paired else None
            for side, w, sign in zip(sides, weights, signs, strict=True):
                counts = shared if shared is not None else _doc_counts(rng, c, n)
                per_seed = side[k].weighted(counts)  # [c, S]
                boot[start:start + c] += sign * (per_seed * w[start:start + c]).sum(axis=1)
        estimate += sum(sign * float(side[k].full().mean())
                        for side, sign in zip(sides, signs, strict=True))
    boot /= n_groups
    estimate /= n_groups
    alpha = 1 - level
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return Interval(estimate=float(estimate), low=float(low), high=float(high),
                    se=float(boot.std(ddof=1)), level=level,
                    n=min(side[k].n for side in sides for k in range(n_groups)),
                    n_boot=n_boot, seeds=tuple(side[0].seeds for side in sides))


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
