"""Entry points: train a saved model and save it again with its history extended."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from flexigpt.core.devices import model_device
from flexigpt.core.fileio import atomic_directory
from flexigpt.core.params import count_parameters
from flexigpt.core.provenance import code_version, setup_run
from flexigpt.export.publish import publish_compressed
from flexigpt.methods.calibration import token_windows
from flexigpt.methods.lora import merge_lora
from flexigpt.methods.perplexity import perplexity
from flexigpt.runtime.training.checkpoint import (
    TrainState,
    check_owned,
    checkpoint_dir,
    fingerprint,
    remove_checkpoint,
)
from flexigpt.runtime.training.config import TrainConfig, TrainPlan, resolve_plan
from flexigpt.runtime.training.data import WindowStream
from flexigpt.runtime.training.loop import LoopResult, StepHook, run_loop, train_device
from flexigpt.runtime.training.memo import SweepMemo
from flexigpt.runtime.training.outputs import log_csv, plot_loss_curve
from flexigpt.runtime.training.processes import is_main_process
from flexigpt.runtime.training.recipe_table import RECIPE_FACTS
from flexigpt.runtime.training.recipes import RecipeReport, apply_recipe
from flexigpt.storage.artifacts import LoadedModel, load_compressed
from flexigpt.storage.manifest import Manifest, manifest_hash
from flexigpt.storage.registry import ROLES

log = logging.getLogger(__name__)

#: Config fields that do not change the trajectory (excluded from the resume fingerprint;
#: a checkpoint resumes on another device).
_NOT_TRAJECTORY = ("eval_every", "eval_windows", "checkpoint_every", "keep_checkpoint",
                   "device")
LOG_FILE = "train_log.csv"
CURVE_FILE = "loss_curve.png"


def train_model(model_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: TrainConfig,
                text: str | os.PathLike, validation: str | os.PathLike | None = None,
                on_step: StepHook | None = None,
                teacher: str | os.PathLike | None = None,
                stop_step: int | None = None,
                memo: SweepMemo | None = None) -> Manifest | dict[str, Any]:
    """Load ``model_dir`` (any method's output, or a plain HF checkpoint = method ``dense``),
    train it per ``cfg`` on ``text`` and save it to ``out_dir``.

    ``validation`` is the held-out text of the training curve and the final ``final_ppl``
    (the DAG passes the tuning split, never the perplexity test text); ``teacher`` the
    dense model (dir or hub id) of ``cfg.loss == "kd"``.

    ``stop_step`` (< the run's steps) trains only that far on the full run's schedule and
    saves nothing but the checkpoint in ``<out>.ckpt/`` (the same call without it
    continues from there): the rung of a successive-halving sweep. ``memo`` is what the
    trials of one sweep share (:class:`SweepMemo`).

    Returns:
        The manifest written to ``out_dir/manifest.json`` (input manifest + a ``history``
        entry). ``out_dir`` also holds ``train_log.csv`` and ``loss_curve.png``. A run
        stopped at ``stop_step`` returns its :func:`rung_record` instead.
    """
    device = train_device(cfg.device)
    loaded = load_compressed(model_dir, device=device)
    source = {"model": str(Path(model_dir).resolve()),
              "manifest_hash": manifest_hash(loaded.manifest) if loaded.manifest else None}
    teacher_model = None
    if cfg.loss == "kd":
        if teacher is None:
            raise ValueError("loss 'kd' needs a teacher model (train_model(teacher=...))")
        teacher_loaded = load_compressed(teacher, device=device)
        check_same_tokenizer(loaded.tokenizer, teacher_loaded.tokenizer, str(teacher))
        teacher_model = teacher_loaded.model
        source["teacher"] = str(teacher)
    return train_loaded(loaded, out_dir, cfg, text, validation, source, on_step, teacher_model,
                        stop_step, memo)


#: the special tokens a KD teacher must place where the student does
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def check_same_tokenizer(student: Any, teacher: Any, teacher_name: str) -> None:
    """``ValueError`` unless the KD ``teacher``'s tokenizer maps every token to the id the
    student's does and agrees on the special tokens: distillation compares the two models'
    distributions position by position over the same ids (checked, not assumed)."""
    if student.get_vocab() != teacher.get_vocab():
        mine, theirs = student.get_vocab(), teacher.get_vocab()
        differ = len(set(mine.items()) ^ set(theirs.items()))
        raise ValueError(f"teacher {teacher_name} has another tokenizer ({len(theirs):,} "
                         f"tokens vs the student's {len(mine):,}; {differ:,} token-id pairs "
                         "differ): KD needs the same vocabulary")
    for name in SPECIAL_TOKENS:
        if getattr(student, name, None) != getattr(teacher, name, None):
            raise ValueError(f"teacher {teacher_name} has {name} "
                             f"{getattr(teacher, name, None)!r}, the student "
                             f"{getattr(student, name, None)!r}: KD needs the same special tokens")


def train_loaded(loaded: LoadedModel, out_dir: str | os.PathLike, cfg: TrainConfig,
                 text: str | os.PathLike, validation: str | os.PathLike | None = None,
                 source: dict[str, Any] | None = None,
                 on_step: StepHook | None = None,
                 teacher: torch.nn.Module | None = None,
                 stop_step: int | None = None,
                 memo: SweepMemo | None = None) -> Manifest | dict[str, Any]:
    """:func:`train_model` for a model already in memory (trained in place).

    ``source`` identifies the input model in the resume fingerprint; a checkpoint in
    ``<out>.ckpt/`` written with the same settings is resumed exactly, and a folder there
    that is no checkpoint of the harness is refused before any work
    (:func:`~flexigpt.runtime.training.checkpoint.check_owned`).
    """
    wall = time.perf_counter()
    ckpt = checkpoint_dir(out_dir)
    check_owned(ckpt)  # a folder of the user's named <out>.ckpt is never used or deleted
    run = _start(loaded, cfg, text, validation, source, memo)
    digest = _fingerprint(run)
    log.info("training %s (%s) with recipe %s for %d steps (%d tokens/step), lr %.3g",
             run.manifest.method, (source or {}).get("model"), run.plan.recipe, cfg.steps(),
             cfg.global_batch * cfg.seq_len, run.plan.lr)

    result = None
    if not RECIPE_FACTS[run.plan.recipe].trains:
        state = TrainState(log=[{"step": 0, "tokens": 0, "loss": None, "lr": None, "ppl": None}])
    else:
        result = run_loop(run.model, run.stream, run.val, cfg, run.plan, ckpt, digest, on_step,
                          teacher, stop_step, None if memo is None else memo.start_ppl)
        state = result.state
        if result.stopped_at is not None:
            return rung_record(state, cfg, run.plan.to_dict(), run.report.to_dict())
    return _conclude(run, state, result, out_dir, ckpt, wall)


@dataclass
class _Session:
    """One :func:`train_loaded` call once set up: ``model`` with the recipe applied
    (``report``), the resolved ``plan``, the training ``stream`` and the first
    ``cfg.eval_windows`` validation windows ``val [n, seq_len]`` (None without
    ``validation``)."""

    model: torch.nn.Module
    tokenizer: Any
    manifest: Manifest
    cfg: TrainConfig
    plan: TrainPlan
    report: RecipeReport
    stream: WindowStream
    val: torch.Tensor | None
    text: str | os.PathLike
    validation: str | os.PathLike | None
    source: dict[str, Any] | None


def _start(loaded: LoadedModel, cfg: TrainConfig, text: str | os.PathLike,
           validation: str | os.PathLike | None, source: dict[str, Any] | None,
           memo: SweepMemo | None) -> _Session:
    """Resolve the plan, seed the run, apply the recipe and tokenise the texts (through
    ``memo`` when a sweep shares them)."""
    model, tokenizer = loaded.model, loaded.tokenizer
    manifest = loaded.manifest or dense_manifest(model, (source or {}).get("model"), cfg.seed)
    plan = resolve_plan(cfg, manifest)
    setup_run(cfg.seed)
    report = apply_recipe(model, plan)
    windows = memo.token_windows if memo is not None else token_windows
    stream = WindowStream(windows(text, tokenizer, cfg.seq_len), cfg.seed)
    val = None
    if validation is not None:
        val = windows(validation, tokenizer, cfg.seq_len)[: cfg.eval_windows]
    return _Session(model=model, tokenizer=tokenizer, manifest=manifest, cfg=cfg, plan=plan,
                    report=report, stream=stream, val=val, text=text, validation=validation,
                    source=source)


def _fingerprint(run: _Session) -> str:
    """The resume fingerprint: trajectory settings, plan, input model, training text and
    the LoRA modules injected (a checkpoint resumes only under the same one)."""
    settings = {k: v for k, v in run.cfg.to_dict().items() if k not in _NOT_TRAJECTORY}
    return fingerprint({"config": settings, "plan": run.plan.to_dict(), "source": run.source,
                        "text": [str(run.text), Path(run.text).stat().st_size],
                        "lora": run.report.lora_injected})


def _conclude(run: _Session, state: TrainState, result: LoopResult | None,
              out_dir: str | os.PathLike, ckpt: Path, wall: float) -> Manifest:
    """After the last step: merge LoRA, score the final held-out PPL (main process, in the
    loop's compute dtype), and save model + manifest + log + curve (main process)."""
    model, cfg = run.model, run.cfg
    model.eval()
    merged = merge_lora(model)
    main = is_main_process()  # with several processes only the main one evaluates and saves
    final_ppl = None
    if run.val is not None and main:
        start = time.perf_counter()
        with torch.autocast(model_device(model).type, dtype=torch.bfloat16,
                            enabled=_eval_bf16(result)):
            final_ppl = perplexity(model, run.val, batch_size=cfg.micro_batch)
        log.info("tune-split perplexity %.4f after training (compute %.1f s)", final_ppl,
                 time.perf_counter() - start)
    state.log[-1]["ppl"] = final_ppl
    entry = _history_entry(run, state, result, merged, final_ppl, wall)
    out_manifest = run.manifest.with_history(entry)
    if main:
        out_manifest = _save(model, run.tokenizer, out_manifest, state.log, out_dir,
                             title=f"{run.manifest.method} · recipe {run.plan.recipe}")
        if not cfg.keep_checkpoint:
            remove_checkpoint(ckpt)
    log.info("trained %d steps, %d tokens in %.1fs; held-out ppl %s -> %s",
             state.step, entry["tokens"], state.train_seconds, entry["ppl_before"], final_ppl)
    return out_manifest


def _eval_bf16(result: LoopResult | None) -> bool:
    """Whether the final evaluation runs in bf16 autocast: as the loop did at step 0."""
    return bool(result is not None and result.bf16)


def _history_entry(run: _Session, state: TrainState, result: LoopResult | None,
                   merged: int, final_ppl: float | None, wall: float) -> dict[str, Any]:
    """The ``history`` entry of this run (keys in their manifest order)."""
    cfg, plan, val, bf16 = run.cfg, run.plan, run.val, _eval_bf16(result)
    before = state.log[0]["ppl"] if state.log[0]["step"] == 0 else None
    tokens = state.position * cfg.seq_len
    return {
        "stage": "train", "recipe": plan.recipe, "plan": plan.to_dict(), "config": cfg.to_dict(),
        "loss": cfg.loss, "teacher": (run.source or {}).get("teacher"),
        "trainable": run.report.to_dict(), "lora_merged": merged,
        "parameters_after": count_parameters(run.model),
        "text": str(run.text),
        "validation": None if run.validation is None else str(run.validation),
        "eval_windows": None if val is None else int(val.shape[0]),
        "eval_dtype": "bfloat16" if bf16 else "float32",
        "device": str(model_device(run.model)),
        "token_budget": cfg.tokens, "tokens": tokens, "steps": state.step,
        "epochs": round(run.stream.epochs(state.position), 4),
        "ppl_before": before, "final_ppl": final_ppl,
        "train_seconds": round(state.train_seconds, 3),
        "wall_seconds": round(time.perf_counter() - wall, 3),
        "tokens_per_second": (round(tokens / state.train_seconds, 2) if state.train_seconds
                              else None),
        "bf16": None if result is None else result.bf16,
        "accumulation": None if result is None else result.accumulation,
        "processes": None if result is None else result.processes,
        "resumed_from_step": None if result is None else result.resumed_from,
        "log": LOG_FILE, "curve": CURVE_FILE, "code_version": code_version(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def rung_record(state: TrainState, cfg: TrainConfig, plan: dict[str, Any],
                trainable: dict[str, Any]) -> dict[str, Any]:
    """What a run stopped early (``stop_step``) reports: the step it stopped at of how many,
    its held-out PPL there and at step 0 (None without validation text), tokens so far."""
    first = state.log[0] if state.log and state.log[0]["step"] == 0 else {}
    return {"stage": "rung", "stopped_at_step": state.step, "steps": cfg.steps(),
            "tokens": state.position * cfg.seq_len, "ppl": state.log[-1].get("ppl"),
            "ppl_before": first.get("ppl"), "plan": plan, "trainable": trainable,
            "train_seconds": round(state.train_seconds, 3)}


def dense_manifest(model: torch.nn.Module, base: str | None, seed: int) -> Manifest:
    """Manifest for a plain HF checkpoint: the ``dense`` method, nothing removed."""
    n = count_parameters(model)
    return Manifest.new(ROLES.reference, config={}, base_model=base, structure={}, info={},
                        dense_params=n, compressed_params=n, calibration=None, seed=seed,
                        dtype="float32")


def _save(model: torch.nn.Module, tokenizer: Any, manifest: Manifest,
          rows: list[dict[str, Any]], out_dir: str | os.PathLike, title: str) -> Manifest:
    """Model + manifest + log + curve, all appearing at ``out_dir`` together."""
    with atomic_directory(out_dir) as staged:
        saved = publish_compressed(model, tokenizer, manifest, staged)
        (staged / LOG_FILE).write_text(log_csv(rows))
        plot_loss_curve(rows, staged / CURVE_FILE, title=title)
    return saved

