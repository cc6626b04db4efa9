"""Learning-rate selection on the tuning split: train the trials, keep the best.

A *trial* is one recovery run of a model at one point of its recipe's tuning grid (``lr``,
and ``gamma_lr`` for the ``flexigpt`` recipe). The DAG's ``train`` rule
(``workflow/scripts/train.py``) runs :func:`run_sweep`: every trial of a run in one process,
as successive halving with one rung (Jamieson & Talwalkar 2016): each trial trains the
first ``k = round(rung · n)`` of its ``n`` steps *on the full run's schedule*, is scored by
its tuning-split perplexity at step k, and only the best continues from its checkpoint to
step n (the next best if it diverges). ``rung = 1`` trains every trial fully and keeps the
lowest final tuning perplexity. With a bracketing rule (``search``: config
``tuning.bracket``, :mod:`flexigpt.core.lr_search`) the grid's points are where the search
starts: after they are scored it adds trials one at a time (scored the same way) until the
best one is bracketed on every learning-rate axis, the hard range stops it, or the trial cap
does. The chosen trial's model becomes the run's ``trained/``
directory (hard links) with ``selection.json`` listing every trial (ties: the earlier
trial). The perplexity test text is never read here.

:func:`select_trial` keeps the best of trial directories already trained fully (each with a
``trial.json`` from :func:`~flexigpt.runtime.training.trials.trial_record` /
:func:`~flexigpt.runtime.training.trials.diverged_record`; the record formats live in
:mod:`flexigpt.runtime.training.trials`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from flexigpt.core import faults
from flexigpt.core.fileio import MARKER, atomic_directory, atomic_write_text
from flexigpt.core.lr_search import (
    NOT_SEARCHED,
    Bracketing,
    axis_neighbours,
    bracket_status,
    propose,
    varied_axes,
)
from flexigpt.core.memory import reuse_freed_memory
from flexigpt.runtime.training.config import TrainConfig
from flexigpt.runtime.training.loop import TrainingDivergedError
from flexigpt.runtime.training.memo import SweepMemo
from flexigpt.runtime.training.processes import barrier, broadcast_from_main, is_main_process
from flexigpt.runtime.training.runner import train_model
from flexigpt.runtime.training.trials import (
    SELECTION_FILE,
    TRIAL_FILE,
    best_trial,
    diverged_record,
    finite_score,
    read_trial,
    score_of,
    scored_record,
    selection_record,
    trial_record,
)

if TYPE_CHECKING:
    from flexigpt.storage.manifest import Manifest

log = logging.getLogger(__name__)

RUNG_FILE = "rung.json"
FINAL_FILE = "final.json"



def select_trial(trial_dirs: list[str | os.PathLike], out_dir: str | os.PathLike,
                 meta: dict[str, Any]) -> dict[str, Any]:
    """Keep the best trial as ``out_dir`` (hard links where possible) + ``selection.json``.

    ``meta`` is copied into the selection record (run name, tuning text and windows).
    Returns the selection record.
    """
    records = [read_trial(d) for d in trial_dirs]
    best = best_trial(records)
    selection = selection_record(meta, records, best)
    _publish(Path(trial_dirs[best]), out_dir, selection)
    log.info("chose trial %d of %d (lr %s, gamma_lr %s, tune ppl %.4f)", best, len(records),
             selection["chosen"]["lr"], selection["chosen"]["gamma_lr"],
             records[best]["tune_ppl"])
    return selection


def _publish(chosen: Path, out_dir: str | os.PathLike, selection: dict[str, Any]) -> None:
    """``chosen`` (a saved model) appears at ``out_dir`` (hard links) with ``selection.json``."""
    with atomic_directory(out_dir) as staged:
        (staged / MARKER).unlink()  # the staging stamp: the chosen model brings its marker
        staged.rmdir()
        shutil.copytree(chosen, staged, copy_function=_link_or_copy)
        (staged / TRIAL_FILE).unlink(missing_ok=True)
        atomic_write_text(staged / SELECTION_FILE, json.dumps(selection, indent=2) + "\n")


def rung_step(steps: int, trials: int, rung: float) -> int:
    """The step at which the trials of a sweep are compared: ``steps`` for one trial or
    ``rung >= 1``, else ``round(rung · steps)`` clamped to ``[1, steps − 1]``."""
    if not 0 < rung <= 1:
        raise ValueError(f"tuning rung must be in (0, 1], got {rung!r}")
    if trials == 1 or rung >= 1 or steps < 2:
        return steps
    return max(1, min(steps - 1, round(rung * steps)))


def run_sweep(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
              configs: list[TrainConfig], points: list[dict[str, Any]],
              text: str | os.PathLike, tune: str | os.PathLike, meta: dict[str, Any],
              rung: float = 0.5, teacher: str | os.PathLike | None = None,
              search: dict[str, Any] | None = None,
              finish_all: bool = False) -> dict[str, Any]:
    """Train the trials ``configs`` (TrainConfigs, one per grid ``points`` entry) of one run
    and save the best as ``out_dir`` with ``selection.json`` (see the module docstring).
    ``search`` (a :class:`~flexigpt.core.lr_search.Bracketing` as a dict): extend
    the trials until the choice is bracketed; trial i > the grid's is ``configs[0]`` with
    the proposed learning rates. ``finish_all`` (the rung check): the chosen trial's
    bracketing neighbours also continue to the end and record their final tuning perplexity,
    so the rung's ranking of the bracket can be compared with the final one; the choice stays
    the rung's (the same model).

    Scratch space is ``<out_dir>.sweep/t<i>/`` (checkpoints, ``rung.json``,
    ``final.json``, the trial's trained model); it is removed
    once ``out_dir`` is in place. Rerunning after a kill resumes: finished rungs are read
    back (when their config, step and input are the same), training resumes from the
    trials' checkpoints. ``meta`` is copied into the selection record.

    Returns:
        The selection record (``rung``: step, steps, fraction; per trial ``tune_ppl`` = the
        score it was compared by, ``tune_ppl_final`` for trials trained to the end;
        ``search``: the rule, the trial count and whether the choice is bracketed).

    Raises:
        ValueError: empty grid, trials with different step counts, or no trial that
            finished with a finite tuning perplexity.
    """
    steps = _grid_steps(configs, points)
    # a search scores at least a point and its two neighbours: compare them at the rung
    k = rung_step(steps, max(len(configs), 3) if search else len(configs), rung)
    rule = Bracketing.from_dict(search) if search else None
    sweep = _Sweep(model_dir, list(configs), list(points), text, tune, teacher, steps,
                   Path(out_dir).with_name(Path(out_dir).name + ".sweep"), rule)
    # one heap for every trial: a later trial reuses the pages an earlier one faulted in
    # (a 2-trial LoRA sweep of SmolLM2, fp32, AMD EPYC Zen 3: 137.7 -> 116.2 s, the same
    # weights; results/reference/smollm2-135m/zen3_ab_69f4d0e/)
    with reuse_freed_memory():
        if k < steps:
            records, best = _halving(sweep, k, finish_all)
        else:
            records, best = _train_all(sweep)
    selection = {**selection_record(meta, records, best),
                 "rung": {"step": k, "steps": steps, "fraction": k / steps},
                 "search": _search_record(sweep, records, best)}
    faults.point("sweep:publish")
    if is_main_process():
        _publish(sweep.trained(best), out_dir, selection)
        for stored in sweep.scratch.glob(f"t*/{FINAL_FILE}"):  # first: never read back a
            stored.unlink()                                    # half-removed model
        shutil.rmtree(sweep.scratch, ignore_errors=True)
    barrier()
    log.info("chose trial %d of %d (lr %s, gamma_lr %s; tune ppl %.4f at step %d of %d; %s)",
             best, len(sweep.configs), selection["chosen"]["lr"],
             selection["chosen"]["gamma_lr"], records[best]["tune_ppl"], k, steps,
             selection["search"]["status"])
    return selection


def _search_record(sweep: _Sweep, records: list[dict[str, Any]], best: int) -> dict[str, Any]:
    """The ``search`` entry of a selection: the rule (None: the fixed grid), how many trials
    were scored, and whether the choice is bracketed on the axes the trials vary or search."""
    axes = _axes(sweep)
    status = (bracket_status(sweep.points, [score_of(r) for r in records], best, axes,
                             rule=sweep.rule)["status"] if axes else NOT_SEARCHED)
    return {"rule": sweep.rule.to_dict() if sweep.rule else None, "trials": len(records),
            "grid_points": sweep.grid_points, "axes": list(axes), "status": status}


def _grid_steps(configs: list[TrainConfig], points: list[dict[str, Any]]) -> int:
    """The step count every trial shares (ValueError: empty or mismatched grid, or trials
    of different lengths)."""
    if not configs or len(configs) != len(points):
        raise ValueError(f"a sweep needs one config per grid point ({len(configs)} configs, "
                         f"{len(points)} points)")
    steps = configs[0].steps()
    if any(c.steps() != steps for c in configs):
        raise ValueError("every trial of a sweep must train the same number of steps")
    return steps


@dataclass
class _Sweep:
    """The fixed inputs of one :func:`run_sweep`; trial i lives in ``scratch/t<i>/``."""

    model_dir: str | os.PathLike
    configs: list[TrainConfig]
    points: list[dict[str, Any]]
    text: str | os.PathLike
    tune: str | os.PathLike
    teacher: str | os.PathLike | None
    steps: int
    scratch: Path
    rule: Bracketing | None = None
    memo: SweepMemo = field(default_factory=SweepMemo)  # computed once for all trials
    grid_points: int = 0  # how many of ``points`` the grid gave (the rest: the search)

    def __post_init__(self) -> None:
        self.grid_points = len(self.points)

    def next_point(self, records: list[dict[str, Any]]) -> int | None:
        """Append the search's next trial (from the scores of ``records``, one per trial so
        far) and return its index; None when there is no rule or the search is done."""
        if self.rule is None:
            return None
        point = propose(self.points, [score_of(r) for r in records], self.rule)
        if point is None:
            return None
        rates: dict[str, Any] = dict(point)
        self.configs.append(dataclasses.replace(self.configs[0], **rates))
        self.points.append({**self.points[0], **point})
        log.info("search: trial t%d at %s (%d scored)", len(self.points) - 1, point,
                 len(records))
        return len(self.points) - 1

    def trial_dir(self, i: int) -> Path:
        return self.scratch / f"t{i}"

    def trained(self, i: int) -> Path:
        """Where trial i's trained model is saved."""
        return self.trial_dir(i) / "trained"

    @overload
    def train(self, i: int, stop: None) -> Manifest | str: ...
    @overload
    def train(self, i: int, stop: int) -> Manifest | dict[str, Any] | str: ...

    def train(self, i: int, stop: int | None) -> Manifest | dict[str, Any] | str:
        """Trial i trained to step ``stop`` (None: to the end): its manifest (its rung
        record when stopped), or the error message if it diverged."""
        cfg = self.configs[i]
        try:
            return train_model(self.model_dir, self.trained(i), cfg, text=self.text,
                               validation=self.tune, teacher=self.teacher, stop_step=stop,
                               memo=self.memo)
        except TrainingDivergedError as err:  # a result of the sweep, not a failure
            log.warning("trial t%d (lr %s, gamma_lr %s) diverged: %s", i, cfg.lr,
                        cfg.gamma_lr, err)
            return str(err)

    def final(self, i: int) -> dict[str, Any]:
        """Trial i's record at the end of training (``final.json``: read back, or trained)."""
        return _cached(self.trial_dir(i) / FINAL_FILE,
                       _key(self.configs[i], self.steps, self.model_dir),
                       lambda: _final(self.train(i, None), self.points[i]))


def _halving(sweep: _Sweep, k: int, finish_all: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Successive halving with one rung at step ``k`` < steps: every trial to step k, then
    the best at the rung to the end (the next best if it diverges); ``finish_all`` (the rung
    check): then the bracketing trials too, the chosen one's nearest trials on each side of
    every axis (their ``tune_ppl_final``).

    Returns:
        Every trial's record and the index of the one trained to the end.
    """
    def rung(i: int) -> dict[str, Any]:
        return _rung(sweep.trial_dir(i), sweep.configs[i], sweep.points[i], k,
                     sweep.model_dir, lambda: sweep.train(i, k))

    records = [rung(i) for i in range(len(sweep.configs))]
    while (new := sweep.next_point(records)) is not None:
        records.append(rung(new))
    order = [i for _, i in sorted((r["tune_ppl"], i) for i, r in enumerate(records)
                                  if finite_score(r))]
    log.info("rung at step %d of %d: tune ppl %s", k, sweep.steps,
             [r.get("tune_ppl") for r in records])
    chosen = None
    for i in order:
        final = sweep.final(i)
        if final.get("diverged"):  # after the rung: keep its score, mark it diverged
            records[i] = {**records[i], "diverged": True, "error": final["error"]}
            continue
        records[i] = _finished(records[i], final, sweep.steps)
        chosen = i
        break
    if chosen is None:
        raise ValueError(f"no trial of {len(sweep.configs)} finished with a finite tuning "
                         "perplexity")
    if finish_all:  # the rung check: the bracketing trials to the end as well
        for i in axis_neighbours(sweep.points, chosen, _axes(sweep)):
            if not finite_score(records[i]):
                continue
            final = sweep.final(i)
            records[i] = ({**records[i], "final_diverged": True, "error": final["error"]}
                          if final.get("diverged") else _finished(records[i], final, sweep.steps))
    return records, chosen


def _finished(record: dict[str, Any], final: dict[str, Any], steps: int) -> dict[str, Any]:
    """A rung record completed by its trial's record at the end of training."""
    return {**record, "tune_ppl_final": final["tune_ppl"], "stopped_at_step": steps,
            "tokens": final["tokens"]}


def _axes(sweep: _Sweep) -> tuple[str, ...]:
    """The learning-rate axes of a sweep: the rule's, else those its grid varies."""
    return sweep.rule.axes_of(sweep.points) if sweep.rule is not None else varied_axes(sweep.points)


def _train_all(sweep: _Sweep) -> tuple[list[dict[str, Any]], int]:
    """Every trial trained to the end (no rung); the best is the lowest final tune PPL.

    Returns:
        Every trial's record and the index of the best.
    """
    records: list[dict[str, Any]] = []
    finished: list[int] = []
    i: int | None = 0
    while i is not None:
        cfg, final = sweep.configs[i], sweep.final(i)
        if final.get("diverged"):
            records.append(diverged_record(sweep.points[i], cfg.lr, cfg.gamma_lr,
                                           final["error"]))
        else:
            records.append({**final, "tune_ppl_final": final["tune_ppl"],
                            "stopped_at_step": sweep.steps})
            finished.append(i)
        i = i + 1 if i + 1 < len(sweep.configs) else sweep.next_point(records)
    if not finished:
        raise ValueError(f"no trial of {len(sweep.configs)} finished with a finite tuning "
                         "perplexity")
    return records, finished[best_trial([records[i] for i in finished])]


def _key(cfg: Any, step: int, model_dir: str | os.PathLike) -> dict[str, Any]:
    """What a stored rung / final record must have been made with to be read back."""
    key = {"config": cfg.to_dict(), "step": step, "model": str(Path(model_dir).resolve())}
    return json.loads(json.dumps(key, default=str))


def _cached(path: Path, key: dict[str, Any], compute: Any) -> dict[str, Any]:
    """The record stored at ``path`` for ``key``, else ``compute()`` stored there."""
    if path.is_file():
        try:
            saved = json.loads(path.read_text())
        except json.JSONDecodeError:
            saved = {}
        if saved.get("key") == key:
            log.info("%s: read back", path)
            return saved["record"]
    # several processes: the main one's record (it scored the trial)
    record = broadcast_from_main(compute())
    if is_main_process():
        atomic_write_text(path, json.dumps({"key": key, "record": record}, indent=2,
                                           default=str) + "\n")
    barrier()
    return record


def _final(result: Manifest | str, point: dict[str, Any]) -> dict[str, Any]:
    """The record of a trial trained to the end (or of its divergence)."""
    if isinstance(result, str):
        return {"diverged": True, "error": result}
    return trial_record(result, point)


def _rung(trial_dir: Path, cfg: Any, point: dict[str, Any], step: int,
          model_dir: str | os.PathLike, train: Any) -> dict[str, Any]:
    """The rung record of one trial: read back from ``rung.json`` when it was made with the
    same config, step and input model, else trained now (``train()``) and stored there."""

    def compute() -> dict[str, Any]:
        result = train()
        if isinstance(result, str):  # diverged before the rung
            return diverged_record(point, cfg.lr, cfg.gamma_lr, result)
        log.info("trial %s: rung at step %d after %.1fs of training", trial_dir.name,
                 result["stopped_at_step"], result.get("train_seconds", 0.0))
        return {**scored_record(point, result["plan"], result["trainable"], result["ppl"],
                          result["ppl_before"], result["tokens"]),
                "stopped_at_step": result["stopped_at_step"], "tune_ppl_final": None}

    record = _cached(trial_dir / RUNG_FILE, _key(cfg, step, model_dir), compute)
    faults.point("sweep:rung")
    return record


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
