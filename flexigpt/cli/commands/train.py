"""flexigpt train: recovery training of any saved model (see flexigpt.runtime.training).

Multi-GPU: ``accelerate launch -m flexigpt.cli train ...`` (same flags).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flexigpt.runtime.training import TrainConfig

HELP = "recovery-train a saved model (FlexiGPT adapters, LoRA, or full) and save it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flexigpt.cli.commands import add_device_argument
    from flexigpt.runtime.training.config import BF16_MODES, LOSSES, SCHEDULES
    from flexigpt.runtime.training.recipe_table import RECIPES

    p.add_argument("--model", required=True, help="saved model dir (any method) or HF checkpoint")
    p.add_argument("--out", required=True, help="output directory (checkpoints in <out>.ckpt)")
    p.add_argument("--tokens", type=int, required=True, help="training token budget")
    p.add_argument("--text", default="resources/text/wiki/train.txt", help="training text")
    p.add_argument("--validation", default="resources/text/wiki/validation.txt",
                   help="held-out text for perplexity ('' to skip)")
    p.add_argument("--recipe", choices=RECIPES,
                   help="trainable set (default: the manifest's, else the method's)")
    p.add_argument("--lr", type=float, help="peak LR (default: manifest, else per recipe)")
    p.add_argument("--gamma-lr", type=float, help="peak LR of the output-norm gammas "
                   "(default: --lr)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step")
    p.add_argument("--warmup", type=float, default=0.05, help="fraction (<1) or steps")
    p.add_argument("--warmup-min-steps", type=int, default=3,
                   help="warm-up floor in steps (capped at half the run)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--grad-clip", type=float, default=1.0, help="<= 0 disables clipping")
    p.add_argument("--schedule", choices=SCHEDULES, default="cosine")
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--bf16", choices=BF16_MODES, default="auto")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward")
    p.add_argument("--eval-every", type=int, default=0, help="steps between held-out evals")
    p.add_argument("--eval-windows", type=int, default=64, help="validation windows")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--keep-checkpoint", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lora-rank", type=int)
    p.add_argument("--lora-alpha", type=float)
    p.add_argument("--lora-dropout", type=float)
    p.add_argument("--lora-targets", help="comma-separated module names, e.g. q_proj,v_proj")
    p.add_argument("--lora-other-blocks", action="store_true",
                   help="recipe flexigpt: also mergeable LoRA on unpruned blocks")
    p.add_argument("--lora-budget", type=int,
                   help="total trainable parameters to match: picks the LoRA rank")
    p.add_argument("--loss", choices=LOSSES, default="lm",
                   help="lm: next-token cross-entropy; kd: KL to --teacher")
    p.add_argument("--kd-temperature", type=float, default=2.0)
    p.add_argument("--teacher", help="dense teacher model (dir or hub id) for --loss kd")
    add_device_argument(p)


#: count-like flags → the smallest value each takes (0: "off" / "no floor" where the help
#: says so); optional ones (default None) are checked when given
COUNT_FLAGS = {"--tokens": 1, "--seq-len": 2, "--micro-batch": 1, "--global-batch": 1,
               "--warmup-min-steps": 0, "--eval-every": 0, "--eval-windows": 1,
               "--checkpoint-every": 0, "--seed": 0, "--lora-rank": 1, "--lora-budget": 1}


def check_flags(args: argparse.Namespace) -> None:
    """Every count-like flag (:data:`COUNT_FLAGS`) is an integer at or above its minimum
    (``ValueError`` naming the flag), before TrainConfig's checks (which name fields)."""
    from flexigpt.api.values import check_count

    for flag, minimum in COUNT_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            check_count(value, flag, minimum)


def check_something_to_train(model: str, cfg: object) -> None:
    """``ValueError`` (exit 2) when the recipe that would run trains nothing: ``--recipe
    none``, or a model whose method recovers with ``none`` (one-shot ShortGPT, a dense
    checkpoint) and no ``--recipe``; the API still saves such a model unchanged."""
    from pathlib import Path

    from flexigpt.runtime.training.config import resolve_plan
    from flexigpt.storage.artifacts import read_manifest
    from flexigpt.storage.registry import ROLES, get_method

    if (Path(model) / "manifest.json").is_file():
        plan = resolve_plan(cfg, read_manifest(model))  # type: ignore[arg-type]
        recipe, source = plan.recipe, plan.sources.get("recipe", "config")
    else:
        recipe = getattr(cfg, "recipe", None) or get_method(ROLES.reference).recovery
        source = "config" if getattr(cfg, "recipe", None) else "method"
    if recipe == "none":
        where = "--recipe none" if source == "config" else f"the {source}'s recipe is 'none'"
        raise ValueError(f"nothing to train in {model}: {where}; choose --recipe lora, full "
                         "or last_blocks")


def make_config(args: argparse.Namespace) -> TrainConfig:
    """The :class:`~flexigpt.runtime.training.TrainConfig` of the flags (which validates them)."""
    from flexigpt.runtime.training import TrainConfig

    return TrainConfig(
        tokens=args.tokens, seq_len=args.seq_len, micro_batch=args.micro_batch,
        global_batch=args.global_batch, lr=args.lr, gamma_lr=args.gamma_lr,
        warmup=int(args.warmup) if args.warmup >= 1 else args.warmup,
        warmup_min_steps=args.warmup_min_steps,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip if args.grad_clip > 0 else None, schedule=args.schedule,
        min_lr_ratio=args.min_lr_ratio, bf16=args.bf16, compile=args.compile,
        eval_every=args.eval_every,
        eval_windows=args.eval_windows, checkpoint_every=args.checkpoint_every,
        keep_checkpoint=args.keep_checkpoint, seed=args.seed, recipe=args.recipe,
        lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        lora_targets=tuple(args.lora_targets.split(",")) if args.lora_targets else None,
        lora_other_blocks=args.lora_other_blocks, lora_budget=args.lora_budget,
        loss=args.loss, kd_temperature=args.kd_temperature, device=args.device)


@contextlib.contextmanager
def flags_named(args: argparse.Namespace) -> Iterator[None]:
    """Re-raise a config ``ValueError`` that starts with a field name (``lr must be ...``)
    with the flag the user wrote (``--lr must be ...``)."""
    try:
        yield
    except ValueError as err:
        text = str(err)
        field = text.split(" ", 1)[0]
        if field and hasattr(args, field) and field.isidentifier():
            raise ValueError("--" + field.replace("_", "-") + text[len(field):]) from None
        raise


def run(args: argparse.Namespace) -> int:
    from flexigpt.runtime.training import train_model

    check_flags(args)
    with flags_named(args):
        cfg = make_config(args)
    check_something_to_train(args.model, cfg)
    manifest = train_model(args.model, args.out, cfg, text=args.text,
                           validation=args.validation or None, teacher=args.teacher)
    from flexigpt.runtime.training.processes import is_main_process

    if not is_main_process():
        return 0
    assert not isinstance(manifest, dict)  # no stop_step: a full run returns its Manifest
    h = manifest.history[-1]
    print(f"{manifest.method} / recipe {h['recipe']}: {h['steps']} steps, {h['tokens']:,} "
          f"tokens, {h['trainable']['trainable_parameters']:,} trainable parameters; "
          f"held-out ppl {h['ppl_before']} -> {h['final_ppl']} ({h['train_seconds']:.1f}s, "
          f"{h['tokens_per_second']} tok/s) -> {args.out}")
    return 0
