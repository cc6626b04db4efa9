"""Training configuration and its resolution against a model's manifest.

:class:`TrainConfig` holds what the user chose; :func:`resolve_plan` fills the choices left
open (``None``) from the input model's manifest (``info.recovery``, written by the method
that produced it) or from the method's registered default recipe, and records where each
value came from.

``manifest.info["recovery"]`` is a :class:`flexigpt.storage.registry.RecoveryRecipe` (the method's
recipe: ``recipe``, ``lr``, ``gamma_lr``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``,
``lora_targets``; all optional).

Recipes: :mod:`flexigpt.runtime.training.recipe_table` (their facts), applied by
:func:`flexigpt.runtime.training.recipes.apply_recipe`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flexigpt.core.devices import check_device
from flexigpt.runtime.training.recipe_table import (
    DEFAULT_LR,
    RECIPE_FACTS,
    RECIPES,
    recipe_names,
    recipes_with,
)
from flexigpt.storage.registry import RecoveryRecipe, get_method

if TYPE_CHECKING:
    from flexigpt.storage.manifest import Manifest

#: LoRA rank/alpha when neither config nor manifest gives them (LLM-Pruner's r 8, α 16).
DEFAULT_LORA_RANK = 8
DEFAULT_LORA_ALPHA = 16.0
#: Default spacing of the recovery curve's tuning-split evaluations, in multiples of the
#: tokens one evaluation reads (``eval_windows · seq_len``): a forward pass costs about a
#: third of a training step on as many tokens, so periodic evaluation costs ~1/24 (≈ 4 %)
#: of the training compute.
CURVE_SPACING = 8
BF16_MODES = ("auto", "on", "off")
SCHEDULES = ("cosine", "constant")
LOSSES = ("lm", "kd")


@dataclass
class TrainConfig:
    """Options of one recovery-training run (validated on construction).

    Attributes:
        tokens: token budget; steps = ceil(tokens / (global_batch · seq_len)).
        seq_len: tokens per training window (BOS included).
        micro_batch: windows per forward pass per process.
        global_batch: windows per optimizer step over all processes; must be a multiple of
            micro_batch × processes (the quotient is the gradient-accumulation count).
        lr: peak learning rate; None → manifest ``info.recovery.lr`` → :data:`DEFAULT_LR`.
        gamma_lr: peak learning rate of the output-norm γ's (their own parameter group:
            γ starts near 0 and Adam moves it by about the LR per step, so at the adapters'
            LR a short recovery cannot open the replacement blocks); None → ``lr``.
        warmup: linear warm-up, a fraction of the steps if < 1 else a step count.
        warmup_min_steps: floor of the warm-up in steps (capped at half the steps), so a
            short run does not take its first step at the peak LR.
        weight_decay: AdamW decoupled weight decay (applied to ≥2-D tensors only).
        grad_clip: max global gradient L2 norm; None disables clipping.
        schedule: ``cosine`` (warm-up then cosine to ``min_lr_ratio·lr``) or ``constant``.
        min_lr_ratio: final LR as a fraction of the peak LR (cosine).
        betas: AdamW betas.
        bf16: bf16 autocast: ``auto`` (on where the device has native bf16: CUDA with
            bf16 support, or a CPU with AMX/AVX512-BF16), ``on`` or ``off``. Master
            weights, optimizer state and the loss stay fp32.
        compile: ``torch.compile`` the model's forward for training (``nn.Module.compile``;
            parameter names and saved weights are unchanged).
        eval_every: held-out perplexity every this many steps (0: only before/after).
        eval_windows: validation windows (first ones of the file); None → all.
        checkpoint_every: training checkpoint every this many steps (0: never).
        keep_checkpoint: keep ``<out>.ckpt/`` after a successful run.
        seed: seeds data order, LoRA initialisation and per-step RNG (dropout).
        recipe: trainable set (:data:`RECIPES`); None → manifest ``info.recovery.recipe``
            → the method's registered ``Method.recovery``.
        lora_rank, lora_alpha, lora_dropout, lora_targets: the trainer's mergeable LoRA
            (recipe ``lora``, and ``flexigpt`` with ``lora_other_blocks``); targets are
            short module names (``q_proj`` ...), None → every linear the architecture
            adapter names. None values fall back to the manifest, then to defaults.
        lora_other_blocks: recipe ``flexigpt`` only: also put mergeable LoRA on the
            unshared linears of blocks that have no replacement adapters.
        lora_budget: total trainable parameters to match (a like-for-like comparison): the
            mergeable LoRA rank is chosen so that the trainable count (FlexiGPT adapters
            included) is nearest to it, α scaled to keep α/r; None → ``lora_rank``.
        last_blocks: recipe ``last_blocks`` only, and required by it: k, the number of
            trailing decoder blocks trained (with the final norm and the LM head; k must be
            below the model's block count, checked when the recipe is applied).
        loss: ``lm`` (next-token cross-entropy, the paper's) or ``kd`` (KL divergence to a
            dense teacher's next-token distribution at ``kd_temperature``, scaled by T²,
            on the same tokens; the teacher is passed to :func:`train_model`).
        kd_temperature: softmax temperature T of the ``kd`` loss.
        device: where a single-process run trains (:mod:`flexigpt.core.devices`: ``auto`` =
            CUDA where available); a multi-process launch (``accelerate launch``) puts each
            process on its own GPU, or on the CPU (gloo) where there is none.
    """

    tokens: int = 1_000_000
    seq_len: int = 512
    micro_batch: int = 4
    global_batch: int = 16
    lr: float | None = None
    gamma_lr: float | None = None
    warmup: float = 0.05
    warmup_min_steps: int = 3
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    bf16: str = "auto"
    compile: bool = False
    eval_every: int = 0
    eval_windows: int | None = 64
    checkpoint_every: int = 50
    keep_checkpoint: bool = False
    seed: int = 0
    recipe: str | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_targets: tuple[str, ...] | None = None
    lora_other_blocks: bool = False
    lora_budget: int | None = None
    last_blocks: int | None = None
    loss: str = "lm"
    kd_temperature: float = 2.0
    device: str = "auto"

    def __post_init__(self) -> None:
        """Validate every field (ValueError naming the first bad one, in declaration-group
        order: counts, loss and optimizer, device and precision, recipe and LoRA) and
        normalise ``betas`` / ``lora_targets`` to tuples."""
        self._check_counts()
        self._check_optimizer()
        check_device(self.device)
        if self.bf16 not in BF16_MODES:
            raise ValueError(f"bf16 must be one of {BF16_MODES}, got {self.bf16!r}")
        if self.eval_windows is not None:
            _check_int(self, "eval_windows")
        self._check_lora()
        if self.warmup >= 1 and int(self.warmup) > self.steps():
            raise ValueError(f"warmup of {int(self.warmup)} steps is longer than the whole run "
                             f"({self.steps()} optimizer steps of {self.global_batch} x "
                             f"{self.seq_len} tokens)")

    def _check_counts(self) -> None:
        """Token, batch, step-count and seed fields are integers in range."""
        _check_int(self, "tokens")
        _check_int(self, "seq_len", 2)
        _check_int(self, "micro_batch")
        _check_int(self, "global_batch")
        _check_int(self, "eval_every", 0)
        _check_int(self, "checkpoint_every", 0)
        _check_int(self, "seed", 0)
        _check_int(self, "warmup_min_steps", 0)
        if self.lora_budget is not None:
            _check_int(self, "lora_budget")

    def _check_optimizer(self) -> None:
        """Loss, batch divisibility, learning rates, warm-up, schedule, clipping, betas."""
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if not (_finite(self.kd_temperature) and self.kd_temperature > 0):
            raise ValueError(f"kd_temperature must be positive, got {self.kd_temperature!r}")
        if self.gamma_lr is not None and not (_finite(self.gamma_lr) and self.gamma_lr > 0):
            raise ValueError(f"gamma_lr must be a positive number, got {self.gamma_lr!r}")
        if self.global_batch % self.micro_batch:
            raise ValueError(f"global_batch ({self.global_batch}) must be a multiple of "
                             f"micro_batch ({self.micro_batch})")
        if self.lr is not None and not (_finite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if not _finite(self.warmup) or self.warmup < 0 or (
                self.warmup >= 1 and float(self.warmup) != int(self.warmup)):
            raise ValueError(f"warmup must be a fraction in [0, 1) or a whole number of "
                             f"steps, got {self.warmup!r}")
        if not _finite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.grad_clip is not None and not (_finite(self.grad_clip) and self.grad_clip > 0):
            raise ValueError(f"grad_clip must be positive or None, got {self.grad_clip!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not _finite(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        if len(self.betas) != 2 or not all(_finite(b) and 0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")

    def _check_lora(self) -> None:
        """Recipe name, ``last_blocks`` and the LoRA settings that are given."""
        if self.recipe is not None and self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES} or None, got {self.recipe!r}")
        check_last_blocks(self.recipe, self.last_blocks, given=self.recipe is not None)
        if self.lora_rank is not None:
            _check_int(self, "lora_rank")
        if self.lora_alpha is not None and not (_finite(self.lora_alpha) and self.lora_alpha > 0):
            raise ValueError(f"lora_alpha must be positive, got {self.lora_alpha!r}")
        if self.lora_dropout is not None and not (
                _finite(self.lora_dropout) and 0 <= self.lora_dropout < 1):
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if self.lora_targets is not None:
            self.lora_targets = tuple(self.lora_targets)
            if not self.lora_targets or not all(isinstance(t, str) and t
                                                for t in self.lora_targets):
                raise ValueError(f"lora_targets must be non-empty module names, "
                                 f"got {self.lora_targets!r}")

    def steps(self) -> int:
        """Optimizer steps that spend the token budget (rounded up)."""
        return math.ceil(self.tokens / (self.global_batch * self.seq_len))

    def warmup_steps(self, steps: int) -> int:
        """Warm-up steps: the configured fraction or count, at least ``warmup_min_steps``,
        at most half the run."""
        warm = round(self.warmup * steps) if self.warmup < 1 else int(self.warmup)
        return min(max(warm, self.warmup_min_steps), steps // 2)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}


@dataclass(frozen=True)
class TrainPlan:
    """Resolved choices of a run: the config plus what the manifest/method filled in.

    ``sources`` maps each resolved field to ``config``, ``manifest``, ``method`` or
    ``default``.
    """

    recipe: str
    lr: float
    gamma_lr: float
    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    lora_targets: tuple[str, ...] | None
    lora_other_blocks: bool
    lora_budget: int | None = None
    last_blocks: int | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["lora_targets"] is not None:
            out["lora_targets"] = list(out["lora_targets"])
        return out


def resolve_plan(cfg: TrainConfig, manifest: Manifest) -> TrainPlan:
    """Fill the config's open choices from ``manifest`` and the method registry.

    Raises:
        ValueError: the manifest names an unknown recipe, ``lora_other_blocks`` is set
            for a recipe other than ``flexigpt``, or ``last_blocks`` is missing for recipe
            ``last_blocks`` / set for another one.
    """
    recovery = RecoveryRecipe.from_info(manifest.info) or RecoveryRecipe(recipe=None)
    sources: dict[str, str] = {}

    def pick(name: str, value: Any, default: Any) -> Any:
        """The config's value, else the manifest recipe's field ``name``, else ``default``."""
        if value is not None:
            sources[name] = "config"
            return value
        if getattr(recovery, name) is not None:
            sources[name] = "manifest"
            return getattr(recovery, name)
        sources[name] = "default"
        return default

    recipe = pick("recipe", cfg.recipe, None)
    if recipe is None:
        recipe = get_method(manifest.method).recovery
        sources["recipe"] = "method"
    if recipe not in RECIPES:
        raise ValueError(f"recipe {recipe!r} (from the {sources['recipe']}) is not one of "
                         f"{RECIPES}")
    facts = RECIPE_FACTS[recipe]
    if cfg.lora_other_blocks and not facts.other_blocks:
        raise ValueError(f"lora_other_blocks applies to recipe "
                         f"{recipe_names(recipes_with('other_blocks'))} only, not {recipe!r}")
    check_last_blocks(recipe, cfg.last_blocks, given=True)
    lr = float(pick("lr", cfg.lr, DEFAULT_LR[recipe]))
    gamma_lr = float(pick("gamma_lr", cfg.gamma_lr, lr))
    rank = int(pick("lora_rank", cfg.lora_rank, DEFAULT_LORA_RANK))
    alpha = float(pick("lora_alpha", cfg.lora_alpha, DEFAULT_LORA_ALPHA))
    dropout = float(pick("lora_dropout", cfg.lora_dropout, 0.0))
    targets = pick("lora_targets", cfg.lora_targets, None)
    if rank < 1 or alpha <= 0 or not 0 <= dropout < 1:
        raise ValueError(f"invalid LoRA settings rank={rank}, alpha={alpha}, "
                         f"dropout={dropout} (sources {sources})")
    if facts.trains and lr <= 0:
        raise ValueError(f"recipe {recipe!r} needs a positive lr, got {lr}")
    if cfg.lora_budget is not None and not facts.lora:
        raise ValueError(f"lora_budget applies to recipes {recipe_names(recipes_with('lora'))}, "
                         f"not {recipe!r}")
    if cfg.lora_budget is not None and facts.other_blocks and not cfg.lora_other_blocks:
        raise ValueError(f"lora_budget with recipe {recipe!r} needs lora_other_blocks (the "
                         "method's own adapters alone have a fixed size)")
    return TrainPlan(recipe=recipe, lr=lr, gamma_lr=gamma_lr, lora_rank=rank, lora_alpha=alpha,
                     lora_dropout=dropout,
                     lora_targets=None if targets is None else tuple(targets),
                     lora_other_blocks=cfg.lora_other_blocks, lora_budget=cfg.lora_budget,
                     last_blocks=cfg.last_blocks, sources=sources)


def check_last_blocks(recipe: str | None, k: Any, *, given: bool) -> None:
    """``last_blocks`` (k) is an integer >= 1, set only for a recipe that takes it
    (``RecipeFacts.last_blocks``: ``last_blocks``), and set for it whenever the recipe is known (``given``: a config's recipe left open is resolved
    later, by :func:`resolve_plan`, which checks again). The bound k < the model's block
    count needs the model (:func:`flexigpt.runtime.training.recipes.apply_recipe`).

    Raises:
        ValueError: naming ``last_blocks`` (a bad or misplaced k) or ``recipe`` (k missing).
    """
    takers = recipes_with("last_blocks")
    takes = recipe is not None and recipe in RECIPE_FACTS and RECIPE_FACTS[recipe].last_blocks
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"last_blocks must be an integer >= 1 (the number of trailing "
                             f"decoder blocks recipe {recipe_names(takers)} trains), got {k!r}")
        if given and not takes:
            raise ValueError(f"last_blocks (k = {k}) applies to recipe {recipe_names(takers)} only, "
                             f"not {recipe!r}")
    elif given and takes:
        raise ValueError(f"recipe {recipe!r} needs last_blocks: k, the number of trailing "
                         "decoder blocks to train (e.g. last_blocks: 3)")


def _check_int(cfg: TrainConfig, name: str, minimum: int = 1) -> None:
    """ValueError unless field ``name`` of ``cfg`` is an integer (not a bool) >= ``minimum``."""
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def curve_every_steps(every_tokens: int | None, *, step_tokens: int, eval_tokens: int) -> int:
    """``TrainConfig.eval_every`` (optimizer steps) for a recovery curve point every
    ``every_tokens`` training tokens (``training.eval_every_tokens``): rounded to whole steps,
    at least 1; ``0`` = no periodic evaluation (the curve has only its start, the rung of a
    sweep and its end). ``None`` = every :data:`CURVE_SPACING` × ``eval_tokens`` tokens (the
    tokens one evaluation reads), so the default costs ≈ 4 % of training whatever the run.

    Raises:
        ValueError: a negative ``every_tokens`` or a non-positive step / evaluation size.
    """
    if step_tokens < 1 or eval_tokens < 1:
        raise ValueError(f"step_tokens and eval_tokens must be >= 1, got {step_tokens}, "
                         f"{eval_tokens}")
    if every_tokens is None:
        every_tokens = CURVE_SPACING * eval_tokens
    if isinstance(every_tokens, bool) or not isinstance(every_tokens, int) or every_tokens < 0:
        raise ValueError(f"eval_every_tokens must be an integer >= 0, got {every_tokens!r}")
    if every_tokens == 0:
        return 0
    return max(1, round(every_tokens / step_tokens))
