"""The optimisation loop: causal-LM loss (:mod:`flexigpt.runtime.training.losses`), AdamW, warm-up +
cosine, accumulation, clipping.

Runs through ``accelerate.Accelerator``: on CPU, one GPU, or several processes started with
``accelerate launch``. With W processes, the global batch of step s is the sequences
``[s·G, (s+1)·G)`` of the window stream; process r takes micro-batches ``a·W + r``
(a = 0 .. accumulation−1), and gradients are synchronised only on the last micro-batch.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from flexigpt.core import devices, faults
from flexigpt.core.fileio import CheckpointError
from flexigpt.core.memory import reuse_freed_memory
from flexigpt.core.precision import native_bf16
from flexigpt.methods.perplexity import perplexity
from flexigpt.runtime.training.checkpoint import TrainState, load_checkpoint, save_checkpoint
from flexigpt.runtime.training.config import TrainConfig, TrainPlan
from flexigpt.runtime.training.data import WindowStream
from flexigpt.runtime.training.losses import causal_lm_loss, kd_loss
from flexigpt.runtime.training.memo import start_key
from flexigpt.runtime.training.optim import lr_factor, make_optimizer

log = logging.getLogger(__name__)

#: ``on_step(step, loss)`` is called after each optimizer step (after its checkpoint).
StepHook = Callable[[int, float], None]


class TrainingDivergedError(FloatingPointError):
    """The loss or gradient norm became NaN/inf; the last good checkpoint is untouched."""


@dataclass
class LoopResult:
    state: TrainState
    steps: int
    resumed_from: int
    bf16: bool
    accumulation: int
    processes: int
    seconds_this_run: float
    stopped_at: int | None = None  # the step a ``stop_step`` run stopped at (checkpointed)


def train_device(spec: str) -> str:
    """Where this process loads the models it trains: the :mod:`flexigpt.core.devices` setting
    ``spec`` resolved, or the CPU in a multi-process launch (each process's model then goes
    to that process's own device in :func:`run_loop`)."""
    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return "cpu" if multi else devices.resolve_device(spec)


def bf16_enabled(mode: str, device: torch.device) -> bool:
    """Resolve ``TrainConfig.bf16`` (auto: :func:`flexigpt.core.precision.native_bf16`)."""
    return native_bf16(device) if mode == "auto" else mode == "on"


def run_loop(model: nn.Module, stream: WindowStream, val_windows: torch.Tensor | None,
             cfg: TrainConfig, plan: TrainPlan, ckpt: Path, digest: str,
             on_step: StepHook | None = None, teacher: nn.Module | None = None,
             stop_step: int | None = None,
             start_ppl: dict[str, float | None] | None = None) -> LoopResult:
    """Train ``model``'s trainable parameters in place for ``cfg.steps()`` steps.

    ``stop_step`` < ``cfg.steps()`` stops after that step of the same schedule (the LR
    follows the full run's warm-up + cosine) and always writes the checkpoint there, so a
    later call without it continues exactly (successive halving,
    :mod:`flexigpt.runtime.training.tuning`). A checkpoint already past ``stop_step`` is refused.

    With ``cfg.loss == "kd"`` the loss is :func:`kd_loss` against ``teacher`` (a frozen
    model with the same tokenizer, run on the same windows; its forward counts in the step
    time).

    ``start_ppl`` (the trials of one sweep share it) memoises the step-0 tune perplexity by
    :func:`flexigpt.runtime.training.memo.start_key`: a trial that starts from a state an earlier
    trial already scored reads the score back instead of evaluating it again (the value is
    the same).


    Resumes from ``ckpt`` when it holds a checkpoint with the same ``digest``. The model is
    returned unwrapped (``result`` carries the log); it is left in eval mode.

    Raises:
        TrainingDivergedError: non-finite loss or gradient norm (names the step).
        ValueError: global_batch not divisible by micro_batch × processes.
    """
    with reuse_freed_memory():  # each step's large tensors reuse the last step's pages
        run = _setup(_accelerator(cfg), model, stream, val_windows, cfg, plan, ckpt, digest,
                     teacher, stop_step)
        if run.state.step == 0 and val_windows is not None:
            _log_start(run, val_windows, start_ppl)
        run_start = time.perf_counter()
        _train_steps(run, on_step)
        return _finish(run, run_start)


@dataclass
class _Run:
    """One :func:`run_loop` call once set up: ``model`` as ``accelerate`` prepared it
    (DDP-wrapped with several processes), ``inner`` unwrapped; ``accum`` micro-batches per
    step and process; ``last`` the step this call stops after (``steps`` unless a
    ``stop_step`` came); ``resumed_from`` the checkpoint's step (0: fresh)."""

    accelerator: Any
    model: nn.Module
    inner: nn.Module
    optimizer: Any
    scheduler: torch.optim.lr_scheduler.LambdaLR
    trainable: list[nn.Parameter]
    cfg: TrainConfig
    stream: WindowStream
    val_windows: torch.Tensor | None
    teacher: nn.Module | None
    ckpt: Path
    digest: str
    state: TrainState
    use_bf16: bool
    world: int
    rank: int
    accum: int
    steps: int
    last: int
    resumed_from: int


def _accelerator(cfg: TrainConfig) -> Any:
    """The ``accelerate.Accelerator`` of this process: gloo on the CPU in a multi-process
    launch without CUDA, else on :func:`train_device` of ``cfg.device``.

    Raises:
        RuntimeError: accelerate did not set up as many processes as were launched.
    """
    from accelerate import Accelerator

    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1:
        # a multi-process launch on a machine without CUDA means gloo on CPU (accelerate
        # would otherwise start W independent single-process runs writing the same output)
        accelerator = Accelerator(cpu=not torch.cuda.is_available())
    else:
        target = torch.device(train_device(cfg.device))
        if target.type == "cuda" and target.index is not None:
            torch.cuda.set_device(target)
        accelerator = Accelerator(cpu=target.type == "cpu")
    world = accelerator.num_processes
    if world != launched:
        raise RuntimeError(f"launched as {launched} processes but accelerate set up {world}; "
                           "check the accelerate launch configuration")
    return accelerator


def _setup(accelerator: Any, model: nn.Module, stream: WindowStream,
           val_windows: torch.Tensor | None, cfg: TrainConfig, plan: TrainPlan, ckpt: Path,
           digest: str, teacher: nn.Module | None, stop_step: int | None) -> _Run:
    """Models on the device, optimizer and schedule, the checkpoint (if any) loaded, the
    model prepared by ``accelerator``: everything :func:`run_loop` steps through."""
    world, rank = accelerator.num_processes, accelerator.process_index
    if cfg.global_batch % (cfg.micro_batch * world):
        raise ValueError(f"global_batch {cfg.global_batch} is not a multiple of micro_batch "
                         f"{cfg.micro_batch} × {world} process(es)")
    accum = cfg.global_batch // (cfg.micro_batch * world)
    steps = cfg.steps()
    use_bf16 = bf16_enabled(cfg.bf16, accelerator.device)
    model.to(accelerator.device)
    if cfg.loss == "kd":
        if teacher is None:
            raise ValueError("loss 'kd' needs a teacher model")
        teacher.to(accelerator.device).eval().requires_grad_(False)
    optimizer = make_optimizer(model, cfg, plan)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps))
    state = load_checkpoint(ckpt, model, optimizer, scheduler, digest) or TrainState()
    last = _last_step(state, steps, stop_step, ckpt)
    if state.step:
        log.info("resuming from %s at step %d/%d", ckpt, state.step, steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if cfg.compile:
        model.compile()
    prepared, optimizer = accelerator.prepare(model, optimizer)
    return _Run(accelerator=accelerator, model=prepared,
                inner=accelerator.unwrap_model(prepared), optimizer=optimizer,
                scheduler=scheduler, trainable=trainable, cfg=cfg, stream=stream,
                val_windows=val_windows, teacher=teacher, ckpt=ckpt, digest=digest,
                state=state, use_bf16=use_bf16, world=world, rank=rank, accum=accum,
                steps=steps, last=last, resumed_from=state.step)


def _last_step(state: TrainState, steps: int, stop_step: int | None, ckpt: Path) -> int:
    """The step this call stops after: ``steps``, or ``stop_step`` when it is earlier.

    Raises:
        ValueError: ``stop_step`` < 1.
        CheckpointError: the checkpoint in ``ckpt`` is already past that step.
    """
    last = steps if stop_step is None else min(int(stop_step), steps)
    if last < 1:
        raise ValueError(f"stop_step must be >= 1, got {stop_step!r}")
    if state.step > last:
        raise CheckpointError(f"training checkpoint {str(ckpt)!r} is at step {state.step}, "
                              f"past the requested stop at step {last}")
    return last


def _evaluate(run: _Run) -> float | None:
    """Tune-split perplexity in the training compute dtype (bf16 autocast when on), scored
    by the main process (None on the others, and without validation windows)."""
    ppl = None
    if run.accelerator.is_main_process and run.val_windows is not None:
        start = time.perf_counter()
        with torch.autocast(run.accelerator.device.type, dtype=torch.bfloat16,
                            enabled=run.use_bf16):
            ppl = perplexity(run.inner, run.val_windows, batch_size=run.cfg.micro_batch)
        log.info("tune-split perplexity %.4f at step %d (compute %.1f s)", ppl, run.state.step,
                 time.perf_counter() - start)
    run.accelerator.wait_for_everyone()
    return ppl


def _log_start(run: _Run, val_windows: torch.Tensor,
               start_ppl: dict[str, float | None] | None) -> None:
    """Append the step-0 row (its perplexity read back from ``start_ppl`` when a trial of
    the same sweep already scored this start, see :func:`start_key`); ``val_windows``:
    ``run.val_windows``, known to be there."""
    if start_ppl is None:
        ppl0 = _evaluate(run)
    else:
        key = start_key(run.inner, val_windows, run.use_bf16)
        if key not in start_ppl:
            start_ppl[key] = _evaluate(run)
        ppl0 = start_ppl[key]
    run.state.log.append({"step": 0, "tokens": 0, "loss": None, "lr": None, "ppl": ppl0})


def _train_steps(run: _Run, on_step: StepHook | None) -> None:
    """Optimizer steps ``state.step + 1 .. last``: one log row each, checkpoints, hooks."""
    cfg, state = run.cfg, run.state
    autocast = torch.autocast(run.accelerator.device.type, dtype=torch.bfloat16,
                              enabled=run.use_bf16)
    bar = tqdm(total=run.steps, initial=state.step, desc="train",
               disable=not run.accelerator.is_local_main_process)
    run.model.train()
    for step in range(state.step + 1, run.last + 1):
        torch.manual_seed((cfg.seed * 1_000_003 + step) * 1_009 + run.rank)
        tic = time.perf_counter()
        mean_loss = _step_loss(run, step, autocast)
        lr = _optimizer_step(run, step)
        state.step, state.position = step, state.position + cfg.global_batch
        state.train_seconds += time.perf_counter() - tic
        state.log.append(_step_row(run, step, mean_loss, lr))
        bar.update(1)
        bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
        _periodic_checkpoint(run, step)
        faults.point("train:step")
        if on_step is not None:
            on_step(step, mean_loss)
    bar.close()


def _step_loss(run: _Run, step: int, autocast: torch.autocast) -> float:
    """Forward and backward of step ``step``'s micro-batches on this process (gradients
    synchronised on the last one); the loss averaged over micro-batches and processes.

    Process r takes micro-batches ``a·W + r`` of the step's global batch.

    Raises:
        TrainingDivergedError: the mean loss is not finite.
    """
    cfg, accelerator, state = run.cfg, run.accelerator, run.state
    total = torch.zeros((), device=accelerator.device)
    for a in range(run.accum):
        ids = run.stream.sequences(state.position + (a * run.world + run.rank) * cfg.micro_batch,
                                   cfg.micro_batch).to(accelerator.device)
        sync = accelerator.no_sync(run.model) if a < run.accum - 1 else nullcontext()
        with sync:
            loss = _micro_batch_loss(run, ids, autocast)
            accelerator.backward(loss / run.accum)
        total += loss.detach()
    mean_loss = float(accelerator.reduce(total / run.accum, reduction="mean"))
    if not math.isfinite(mean_loss):
        raise TrainingDivergedError(
            f"non-finite training loss ({mean_loss}) at step {step}; the last good "
            f"checkpoint (step {state.step}) in {str(run.ckpt)!r} is left intact")
    return mean_loss


def _micro_batch_loss(run: _Run, ids: torch.Tensor, autocast: torch.autocast) -> torch.Tensor:
    """The loss of one micro-batch ``ids [micro_batch, seq_len]``: :func:`causal_lm_loss`,
    or :func:`kd_loss` against the teacher's logits on the same ids."""
    with autocast:
        logits = run.model(input_ids=ids, use_cache=False).logits
    if run.cfg.loss == "kd":
        if run.teacher is None:  # _setup refuses this already
            raise ValueError("loss 'kd' needs a teacher model")
        with torch.no_grad(), autocast:
            target = run.teacher(input_ids=ids, use_cache=False).logits
        return kd_loss(logits, target, run.cfg.kd_temperature)
    return causal_lm_loss(logits, ids)


def _optimizer_step(run: _Run, step: int) -> float:
    """Clip the gradients, step the optimizer and the schedule; returns the step's LR.

    Raises:
        TrainingDivergedError: the gradient norm is not finite (with clipping on).
    """
    cfg = run.cfg
    if cfg.grad_clip is not None:
        norm = float(run.accelerator.clip_grad_norm_(run.trainable, cfg.grad_clip))
        if not math.isfinite(norm):
            raise TrainingDivergedError(
                f"non-finite gradient norm ({norm}) at step {step}; the last good "
                f"checkpoint (step {run.state.step}) in {str(run.ckpt)!r} is left intact")
    lr = float(run.scheduler.get_last_lr()[0])  # a float already (float LRs); typed float | Tensor
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return lr


def _step_row(run: _Run, step: int, mean_loss: float, lr: float) -> dict[str, Any]:
    """The log row of step ``step`` (state already advanced), with the tune perplexity at
    the periodic evaluations and at a stop before the end."""
    cfg, steps = run.cfg, run.steps
    row = {"step": step, "tokens": run.state.position * cfg.seq_len, "loss": mean_loss,
           "lr": lr, "ppl": None}
    periodic = cfg.eval_every and step % cfg.eval_every == 0 and step < steps
    if periodic or step == run.last < steps:  # a stop's PPL is saved with its checkpoint
        row["ppl"] = _evaluate(run)
        run.model.train()
    return row


def _periodic_checkpoint(run: _Run, step: int) -> None:
    """The checkpoint every ``cfg.checkpoint_every`` steps (not at this call's last step)."""
    every = run.cfg.checkpoint_every
    if every and step % every == 0 and step < run.last:
        if run.accelerator.is_main_process:
            save_checkpoint(run.ckpt, run.inner, run.optimizer, run.scheduler, run.state,
                            run.digest)
        run.accelerator.wait_for_everyone()


def _finish(run: _Run, run_start: float) -> LoopResult:
    """Checkpoint a stop before the end, return the model to eager eval mode, report."""
    state, steps = run.state, run.steps
    stopped = run.last < steps
    if stopped and state.step > run.resumed_from and run.accelerator.is_main_process:
        # the state at the stop, whatever checkpoint_every (unless it was resumed there)
        save_checkpoint(run.ckpt, run.inner, run.optimizer, run.scheduler, state, run.digest)
    run.accelerator.wait_for_everyone()
    if run.cfg.compile:
        run.inner._compiled_call_impl = None  # back to eager for the final eval, merge and save
    run.inner.eval()
    return LoopResult(state=state, steps=steps, resumed_from=run.resumed_from,
                      bf16=run.use_bf16, accumulation=run.accum, processes=run.world,
                      seconds_this_run=time.perf_counter() - run_start,
                      stopped_at=state.step if stopped else None)
