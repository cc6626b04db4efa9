"""The optimisation loop: causal-LM loss, AdamW, warm-up + cosine, accumulation, clipping.

Runs through ``accelerate.Accelerator``: on CPU, one GPU, or several processes started with
``accelerate launch``. With W processes, the global batch of step s is the sequences
``[s·G, (s+1)·G)`` of the window stream; process r takes micro-batches ``a·W + r``
(a = 0 .. accumulation−1), and gradients are synchronised only on the last micro-batch.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from tqdm.auto import tqdm

from flexigpt import faults
from flexigpt.artifacts import CheckpointError
from flexigpt.perplexity import perplexity
from flexigpt.precision import native_bf16
from flexigpt.training.checkpoint import TrainState, load_checkpoint, save_checkpoint
from flexigpt.training.config import TrainConfig, TrainPlan
from flexigpt.training.data import WindowStream

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
    """Where this process loads the models it trains: the :mod:`flexigpt.devices` setting
    ``spec`` resolved, or the CPU in a multi-process launch (each process's model then goes
    to that process's own device in :func:`run_loop`)."""
    from flexigpt import devices

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return "cpu"
    return devices.resolve_device(spec)


def bf16_enabled(mode: str, device: torch.device) -> bool:
    """Resolve ``TrainConfig.bf16`` (auto: :func:`flexigpt.precision.native_bf16`)."""
    if mode != "auto":
        return mode == "on"
    return native_bf16(device)


def lr_factor(cfg: TrainConfig, steps: int) -> Callable[[int], float]:
    """LR multiplier of optimizer step ``i`` (0-based): linear warm-up, then cosine."""
    warm = min(cfg.warmup_steps(steps), steps)

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        if cfg.schedule == "constant":
            return 1.0
        t = min(1.0, (i - warm) / max(1, steps - warm - 1))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))

    return factor


#: Rows of the logits processed at once by :class:`NextTokenCrossEntropy` (bounds the fp32
#: temporaries to CHUNK_ROWS × V instead of B·T × V).
CHUNK_ROWS = 256


class NextTokenCrossEntropy(torch.autograd.Function):
    """Mean next-token cross-entropy of ``logits [B, T, V]`` (any float dtype) against
    ``ids [B, T]``, computed in fp32 a few rows at a time.

    Equal to ``F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())``
    (and its gradient), without the fp32 copy of the logits, the saved fp32 log-softmax and
    the zero-padded slice gradient: the forward keeps nothing but the inputs, the backward
    recomputes each chunk's softmax and writes ``(softmax − onehot)/N`` straight into a
    gradient of the logits' dtype. Chunks are contiguous row ranges of one sequence.
    """

    @staticmethod
    def _chunks(b: int, t: int):
        for i in range(b):
            for start in range(0, t - 1, CHUNK_ROWS):
                yield i, start, min(start + CHUNK_ROWS, t - 1)

    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # noqa: D102
        b, t, _ = logits.shape
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for i, start, end in NextTokenCrossEntropy._chunks(b, t):
            logp = torch.log_softmax(logits[i, start:end].float(), dim=-1)
            total -= logp.gather(1, ids[i, start + 1:end + 1, None]).sum()
        ctx.save_for_backward(logits, ids)
        return total / (b * (t - 1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        logits, ids = ctx.saved_tensors
        b, t, _ = logits.shape
        out = torch.empty_like(logits)
        out[:, -1].zero_()
        scale = grad.float() / (b * (t - 1))
        for i, start, end in NextTokenCrossEntropy._chunks(b, t):
            probs = torch.softmax(logits[i, start:end].float(), dim=-1)
            rows = torch.arange(end - start, device=logits.device)
            probs[rows, ids[i, start + 1:end + 1]] -= 1.0
            out[i, start:end] = probs.mul_(scale)
        return out, None


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (fp32) of ``logits [B, T, V]`` against ``ids [B, T]``
    (:class:`NextTokenCrossEntropy`)."""
    return NextTokenCrossEntropy.apply(logits, ids)


def kd_loss(logits: torch.Tensor, teacher_logits: torch.Tensor,
            temperature: float) -> torch.Tensor:
    """T² · mean over predicted positions of KL(teacher ‖ student) at temperature T.

    ``logits``/``teacher_logits``: ``[B, T, V]``; the positions are those of
    :func:`causal_lm_loss` (every one but the last), computed in fp32. Zero iff the two
    next-token distributions agree.
    """
    student = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits[:, :-1].float() / temperature, dim=-1)
    kl = F.kl_div(student.reshape(-1, student.shape[-1]), teacher.reshape(-1, teacher.shape[-1]),
                  log_target=True, reduction="batchmean")
    return kl * temperature**2


def param_groups(model: nn.Module, cfg: TrainConfig, plan: TrainPlan) -> list[dict]:
    """AdamW groups: ≥2-D tensors with weight decay; 1-D without; the output-norm γ's
    (parameters named ``gamma``) in their own group at ``plan.gamma_lr``."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    gammas = [p for n, p in named if n.rsplit(".", 1)[-1] == "gamma"]
    ids = {id(p) for p in gammas}
    decay = [p for _, p in named if p.ndim >= 2 and id(p) not in ids]
    rest = [p for _, p in named if p.ndim < 2 and id(p) not in ids]
    groups = ({"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
              {"params": rest, "weight_decay": 0.0, "name": "no_decay"},
              {"params": gammas, "weight_decay": 0.0, "lr": plan.gamma_lr, "name": "gamma"})
    return [g for g in groups if g["params"]]


def _optimizer(model: nn.Module, cfg: TrainConfig, plan: TrainPlan) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, cfg, plan), lr=plan.lr, betas=cfg.betas,
                             eps=1e-8)


def start_key(model: nn.Module, val_windows: torch.Tensor, bf16: bool) -> str:
    """Identity of a step-0 tune-perplexity evaluation: sha256 of the validation windows,
    the compute dtype, every parameter's name / shape / dtype / trainable flag, and the
    values of the trainable ones. The frozen values are not hashed: callers share one memo
    only between trials of one input model (:func:`flexigpt.training.tuning.run_sweep`),
    whose frozen weights are the same by construction."""
    digest = hashlib.sha256(f"bf16={bool(bf16)}".encode())
    digest.update(val_windows.detach().cpu().contiguous().numpy().tobytes())
    for name, param in model.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}:{param.requires_grad}"
                      .encode())
        if param.requires_grad:
            digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def run_loop(model: nn.Module, stream: WindowStream, val_windows: torch.Tensor | None,
             cfg: TrainConfig, plan: TrainPlan, ckpt: Path, digest: str,
             on_step: StepHook | None = None, teacher: nn.Module | None = None,
             stop_step: int | None = None,
             start_ppl: dict[str, float | None] | None = None) -> LoopResult:
    """Train ``model``'s trainable parameters in place for ``cfg.steps()`` steps.

    ``stop_step`` < ``cfg.steps()`` stops after that step of the same schedule (the LR
    follows the full run's warm-up + cosine) and always writes the checkpoint there, so a
    later call without it continues exactly (successive halving,
    :mod:`flexigpt.training.tuning`). A checkpoint already past ``stop_step`` is refused.

    With ``cfg.loss == "kd"`` the loss is :func:`kd_loss` against ``teacher`` (a frozen
    model with the same tokenizer, run on the same windows; its forward counts in the step
    time).

    ``start_ppl`` (the trials of one sweep share it) memoises the step-0 tune perplexity by
    :func:`start_key`: a trial that starts from a state an earlier trial already scored
    reads the score back instead of evaluating it again (the value is the same).

    Resumes from ``ckpt`` when it holds a checkpoint with the same ``digest``. The model is
    returned unwrapped (``result`` carries the log); it is left in eval mode.

    Raises:
        TrainingDivergedError: non-finite loss or gradient norm (names the step).
        ValueError: global_batch not divisible by micro_batch × processes.
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
    world, rank = accelerator.num_processes, accelerator.process_index
    if world != launched:
        raise RuntimeError(f"launched as {launched} processes but accelerate set up {world}; "
                           "check the accelerate launch configuration")
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
    optimizer = _optimizer(model, cfg, plan)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps))
    state = load_checkpoint(ckpt, model, optimizer, scheduler, digest) or TrainState()
    resumed_from = state.step
    last = steps if stop_step is None else min(int(stop_step), steps)
    if last < 1:
        raise ValueError(f"stop_step must be >= 1, got {stop_step!r}")
    if state.step > last:
        raise CheckpointError(f"training checkpoint {str(ckpt)!r} is at step {state.step}, "
                              f"past the requested stop at step {last}")
    if resumed_from:
        log.info("resuming from %s at step %d/%d", ckpt, resumed_from, steps)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if cfg.compile:
        model.compile()
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)

    def evaluate() -> float | None:
        """Tune-split perplexity in the training compute dtype (bf16 autocast when on)."""
        ppl = None
        if accelerator.is_main_process and val_windows is not None:
            with torch.autocast(accelerator.device.type, dtype=torch.bfloat16,
                                enabled=use_bf16):
                ppl = perplexity(inner, val_windows, batch_size=cfg.micro_batch)
        accelerator.wait_for_everyone()
        return ppl

    if state.step == 0 and val_windows is not None:
        if start_ppl is None:
            ppl0 = evaluate()
        else:
            key = start_key(inner, val_windows, use_bf16)
            if key not in start_ppl:
                start_ppl[key] = evaluate()
            ppl0 = start_ppl[key]
        state.log.append({"step": 0, "tokens": 0, "loss": None, "lr": None, "ppl": ppl0})
    autocast = torch.autocast(accelerator.device.type, dtype=torch.bfloat16, enabled=use_bf16)
    bar = tqdm(total=steps, initial=state.step, desc="train",
               disable=not accelerator.is_local_main_process)
    run_start = time.perf_counter()
    model.train()
    for step in range(state.step + 1, last + 1):
        torch.manual_seed((cfg.seed * 1_000_003 + step) * 1_009 + rank)
        tic = time.perf_counter()
        total = torch.zeros((), device=accelerator.device)
        for a in range(accum):
            ids = stream.sequences(state.position + (a * world + rank) * cfg.micro_batch,
                                   cfg.micro_batch).to(accelerator.device)
            sync = accelerator.no_sync(model) if a < accum - 1 else nullcontext()
            with sync:
                with autocast:
                    logits = model(input_ids=ids, use_cache=False).logits
                if cfg.loss == "kd":
                    with torch.no_grad(), autocast:
                        target = teacher(input_ids=ids, use_cache=False).logits
                    loss = kd_loss(logits, target, cfg.kd_temperature)
                else:
                    loss = causal_lm_loss(logits, ids)
                accelerator.backward(loss / accum)
            total += loss.detach()
        mean_loss = float(accelerator.reduce(total / accum, reduction="mean"))
        if not math.isfinite(mean_loss):
            raise TrainingDivergedError(
                f"non-finite training loss ({mean_loss}) at step {step}; the last good "
                f"checkpoint (step {state.step}) in {str(ckpt)!r} is left intact")
        if cfg.grad_clip is not None:
            norm = float(accelerator.clip_grad_norm_(trainable, cfg.grad_clip))
            if not math.isfinite(norm):
                raise TrainingDivergedError(
                    f"non-finite gradient norm ({norm}) at step {step}; the last good "
                    f"checkpoint (step {state.step}) in {str(ckpt)!r} is left intact")
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state.step, state.position = step, state.position + cfg.global_batch
        state.train_seconds += time.perf_counter() - tic
        row = {"step": step, "tokens": state.position * cfg.seq_len, "loss": mean_loss,
               "lr": lr, "ppl": None}
        periodic = cfg.eval_every and step % cfg.eval_every == 0 and step < steps
        if periodic or step == last < steps:  # a stop's PPL is saved with its checkpoint
            row["ppl"] = evaluate()
            model.train()
        state.log.append(row)
        bar.update(1)
        bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < last:
            if accelerator.is_main_process:
                save_checkpoint(ckpt, inner, optimizer, scheduler, state, digest)
            accelerator.wait_for_everyone()
        faults.point("train:step")
        if on_step is not None:
            on_step(step, mean_loss)
    bar.close()
    stopped = last < steps
    if stopped and state.step > resumed_from and accelerator.is_main_process:
        # the state at the stop, whatever checkpoint_every (unless it was resumed there)
        save_checkpoint(ckpt, inner, optimizer, scheduler, state, digest)
    accelerator.wait_for_everyone()
    if cfg.compile:
        inner._compiled_call_impl = None  # back to eager for the final eval, merge and save
    inner.eval()
    return LoopResult(state=state, steps=steps, resumed_from=resumed_from, bf16=use_bf16,
                      accumulation=accum, processes=world,
                      seconds_this_run=time.perf_counter() - run_start,
                      stopped_at=state.step if stopped else None)
