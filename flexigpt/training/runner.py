"""Entry points: train a saved model and save it again with its history extended."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from flexigpt.artifacts import LoadedModel, atomic_directory, load_compressed, manifest_hash
from flexigpt.artifacts import save_compressed
from flexigpt.calibration import token_windows
from flexigpt.devices import model_device
from flexigpt.manifest import Manifest
from flexigpt.params import count_parameters
from flexigpt.perplexity import perplexity
from flexigpt.provenance import code_version, setup_run
from flexigpt.training.checkpoint import TrainState, checkpoint_dir, fingerprint
from flexigpt.training.checkpoint import remove_checkpoint
from flexigpt.training.config import TrainConfig, resolve_plan
from flexigpt.training.data import WindowStream
from flexigpt.training.launch import is_main_process
from flexigpt.training.lora import merge_lora
from flexigpt.training.loop import StepHook, run_loop, train_device
from flexigpt.training.outputs import log_csv, plot_loss_curve
from flexigpt.training.recipes import apply_recipe

log = logging.getLogger(__name__)

#: Config fields that do not change the trajectory (excluded from the resume fingerprint;
#: a checkpoint resumes on another device).
_NOT_TRAJECTORY = ("eval_every", "eval_windows", "checkpoint_every", "keep_checkpoint",
                   "device")
LOG_FILE = "train_log.csv"
CURVE_FILE = "loss_curve.png"


@dataclass
class SweepMemo:
    """What the trials of one sweep (one input model, hence one tokenizer) compute alike and
    need only once: the token windows of each text, the step-0 tune perplexity of each
    starting state (:func:`flexigpt.training.loop.start_key`). Reusing them changes no value.
    """

    windows: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    start_ppl: dict[str, float | None] = field(default_factory=dict)

    def token_windows(self, path: str | os.PathLike, tokenizer: Any,
                      seq_len: int) -> torch.Tensor:
        key = (str(Path(path).resolve()), int(seq_len))
        if key not in self.windows:
            self.windows[key] = token_windows(path, tokenizer, seq_len)
        return self.windows[key]


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
        teacher_model = load_compressed(teacher, device=device).model
        source["teacher"] = str(teacher)
    return train_loaded(loaded, out_dir, cfg, text, validation, source, on_step, teacher_model,
                        stop_step, memo)


def train_loaded(loaded: LoadedModel, out_dir: str | os.PathLike, cfg: TrainConfig,
                 text: str | os.PathLike, validation: str | os.PathLike | None = None,
                 source: dict[str, Any] | None = None,
                 on_step: StepHook | None = None,
                 teacher: torch.nn.Module | None = None,
                 stop_step: int | None = None,
                 memo: SweepMemo | None = None) -> Manifest | dict[str, Any]:
    """:func:`train_model` for a model already in memory (trained in place).

    ``source`` identifies the input model in the resume fingerprint; a checkpoint in
    ``<out>.ckpt/`` written with the same settings is resumed exactly.
    """
    wall = time.perf_counter()
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
    settings = {k: v for k, v in cfg.to_dict().items() if k not in _NOT_TRAJECTORY}
    digest = fingerprint({"config": settings, "plan": plan.to_dict(), "source": source,
                          "text": [str(text), Path(text).stat().st_size],
                          "lora": report.lora_injected})
    ckpt = checkpoint_dir(out_dir)
    log.info("training %s (%s) with recipe %s for %d steps (%d tokens/step), lr %.3g",
             manifest.method, (source or {}).get("model"), plan.recipe, cfg.steps(),
             cfg.global_batch * cfg.seq_len, plan.lr)

    result = None
    if plan.recipe == "none":
        state = TrainState(log=[{"step": 0, "tokens": 0, "loss": None, "lr": None, "ppl": None}])
    else:
        result = run_loop(model, stream, val, cfg, plan, ckpt, digest, on_step, teacher,
                          stop_step, None if memo is None else memo.start_ppl)
        state = result.state
        if result.stopped_at is not None:
            return rung_record(state, cfg, plan.to_dict(), report.to_dict())
    model.eval()
    merged = merge_lora(model)
    main = is_main_process()  # with several processes only the main one evaluates and saves
    final_ppl = None
    bf16 = bool(result is not None and result.bf16)  # evaluate as the loop did at step 0
    device = model_device(model)
    if val is not None and main:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            final_ppl = perplexity(model, val, batch_size=cfg.micro_batch)
    state.log[-1]["ppl"] = final_ppl
    before = state.log[0]["ppl"] if state.log[0]["step"] == 0 else None
    tokens = state.position * cfg.seq_len
    entry = {
        "stage": "train", "recipe": plan.recipe, "plan": plan.to_dict(), "config": cfg.to_dict(),
        "loss": cfg.loss, "teacher": (source or {}).get("teacher"),
        "trainable": report.to_dict(), "lora_merged": merged,
        "parameters_after": count_parameters(model),
        "text": str(text), "validation": None if validation is None else str(validation),
        "eval_windows": None if val is None else int(val.shape[0]),
        "eval_dtype": "bfloat16" if bf16 else "float32",
        "device": str(device),
        "token_budget": cfg.tokens, "tokens": tokens, "steps": state.step,
        "epochs": round(stream.epochs(state.position), 4),
        "ppl_before": before, "final_ppl": final_ppl,
        "train_seconds": round(state.train_seconds, 3),
        "wall_seconds": round(time.perf_counter() - wall, 3),
        "tokens_per_second": round(tokens / state.train_seconds, 2) if state.train_seconds else None,
        "bf16": None if result is None else result.bf16,
        "accumulation": None if result is None else result.accumulation,
        "processes": None if result is None else result.processes,
        "resumed_from_step": None if result is None else result.resumed_from,
        "log": LOG_FILE, "curve": CURVE_FILE, "code_version": code_version(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    out_manifest = manifest.with_history(entry)
    if main:
        out_manifest = _save(model, tokenizer, out_manifest, state.log, out_dir,
                             title=f"{manifest.method} · recipe {plan.recipe}")
        if not cfg.keep_checkpoint:
            remove_checkpoint(ckpt)
    log.info("trained %d steps, %d tokens in %.1fs; held-out ppl %s -> %s",
             state.step, tokens, state.train_seconds, before, final_ppl)
    return out_manifest


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
    return Manifest.new("dense", config={}, base_model=base, structure={}, info={},
                        dense_params=n, compressed_params=n, calibration=None, seed=seed,
                        dtype="float32")


def _save(model: torch.nn.Module, tokenizer: Any, manifest: Manifest,
          rows: list[dict[str, Any]], out_dir: str | os.PathLike, title: str) -> Manifest:
    """Model + manifest + log + curve, all appearing at ``out_dir`` together."""
    with atomic_directory(out_dir) as staged:
        saved = save_compressed(model, tokenizer, manifest, staged)
        (staged / LOG_FILE).write_text(log_csv(rows))
        plot_loss_curve(rows, staged / CURVE_FILE, title=title)
    return saved

