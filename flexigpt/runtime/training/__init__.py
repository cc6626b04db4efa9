"""The one recovery trainer: every method's model is trained by this package.

Usage (CPU, one GPU, or several GPUs through accelerate)::

    flexigpt train --model results/models/flexigpt-0.3 --out results/trained/flexigpt-0.3 \\
        --tokens 100000 --text resources/text/wiki/train.txt \\
        --validation resources/text/wiki/validation.txt --seq-len 256
    accelerate launch -m flexigpt.cli train --model ... --out ... --tokens 1000000000
    accelerate launch --multi_gpu --num_processes 4 -m flexigpt.cli train ...   # 4 GPUs
    # without CUDA the same launch runs gloo CPU processes (checked: losses equal 1 process)

    from flexigpt.runtime.training import TrainConfig, train_model
    manifest = train_model(model_dir, out_dir, TrainConfig(tokens=100_000, seq_len=256),
                           text="resources/text/wiki/train.txt",
                           validation="resources/text/wiki/validation.txt")

Contract:
- the trainable set is a recipe (``flexigpt`` | ``lora`` | ``full`` | ``none``), chosen by
  the config, else by the manifest's ``info.recovery.recipe``, else by the method's
  ``Method.recovery`` (:mod:`flexigpt.runtime.training.recipes`);
- loss: next-token cross-entropy on windows of the training text in a seeded order
  (:mod:`flexigpt.runtime.training.data`); AdamW, warm-up + cosine, gradient accumulation to
  ``global_batch``, clipping, bf16 autocast where supported (:mod:`flexigpt.runtime.training.loop`);
- checkpoints in ``<out>.ckpt/``; rerunning the same command resumes exactly
  (:mod:`flexigpt.runtime.training.checkpoint`); a NaN/inf loss raises ``TrainingDivergedError``;
- output: ``<out>/`` saved with ``save_compressed`` (same method and structure; mergeable
  LoRA merged), ``history`` extended; ``train_log.csv`` and ``loss_curve.png`` beside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flexigpt.core.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, imported on first use (PEP 562)
    from flexigpt.runtime.training.config import TrainConfig, TrainPlan, resolve_plan
    from flexigpt.runtime.training.loop import TrainingDivergedError
    from flexigpt.runtime.training.recipe_table import RECIPES
    from flexigpt.runtime.training.runner import train_loaded, train_model

#: public name → its module, imported when first read: a job that needs only a light
#: submodule (``recipe_table``, ``config``, ``choices``; the evaluate, inference and tables
#: jobs, the Snakefile) does not load the trainer (``runner``, ``loop``: the model loaders,
#: the publisher, the optimiser)
_LAZY = {"TrainConfig": "flexigpt.runtime.training.config",
         "TrainPlan": "flexigpt.runtime.training.config",
         "resolve_plan": "flexigpt.runtime.training.config",
         "TrainingDivergedError": "flexigpt.runtime.training.loop",
         "RECIPES": "flexigpt.runtime.training.recipe_table",
         "train_loaded": "flexigpt.runtime.training.runner",
         "train_model": "flexigpt.runtime.training.runner"}

__all__ = ["RECIPES", "TrainConfig", "TrainPlan", "TrainingDivergedError", "resolve_plan",
           "train_loaded", "train_model"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
