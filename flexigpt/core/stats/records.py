"""Records to statistics: per-document values of result records
(:func:`flexigpt.runtime.evaluation.results.load_records`), checked to describe the same documents
(windows) before they are paired, and the record-level API (:func:`run_intervals`,
:func:`compare_runs`, :func:`paired_replicates`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexigpt.core.stats.bootstrap import LEVEL, N_BOOT, PairingError, _as_group
from flexigpt.core.stats.intervals import (
    Replicates,
    _contrast_replicates,
    average_diff_interval,
    average_interval,
    diff_interval,
    logppl_diff_interval,
    logppl_interval,
    mean_interval,
)


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

    ``records``: :func:`flexigpt.runtime.evaluation.results.load_records` output (or its
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
    if name is None:  # records without a metric name: no per-doc values to read
        raise PairingError(f"{task}: records have no per-doc {name!r}")
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
    have = [set(r.get("tasks") or {}) for r in runs]
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
    kw: dict[str, Any] = {"paired": paired, "n_boot": n_boot, "seed": seed, "level": level}
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
