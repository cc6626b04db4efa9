"""Evaluation: zero-shot lm-eval tasks (local files or hub), perplexity, result JSON,
the fast exact lm-eval scorer, and inference timing.

Public entry points::

    evaluate_model(model_dir, out_json, tasks=..., limit=..., source="local", ...)
    load_result(path)                                     # validated result JSON
    measure_inference(models, batch, seq_len, repeats)   # Tables 6/7
    flexigpt.runtime.evaluation.fast.lm.FastHFLM                      # lm-eval model "flexigpt-fast"

lm-eval itself is imported only when a task is evaluated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flexigpt.core.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, imported on first use (PEP 562)
    from flexigpt.runtime.evaluation.inference import measure_inference, run_inference_cost
    from flexigpt.runtime.evaluation.results import evaluate_model, load_result, validate_result
    from flexigpt.runtime.evaluation.tasks import HEADLINE_METRIC, PAPER_TASKS

#: public name → its module, imported when first read: the evaluate job loads no decoding
#: code (``inference`` → ``flexigpt.runtime.generation``), the inference job no lm-eval
#: plumbing of ``results``
_LAZY = {"measure_inference": "flexigpt.runtime.evaluation.inference",
         "run_inference_cost": "flexigpt.runtime.evaluation.inference",
         "evaluate_model": "flexigpt.runtime.evaluation.results",
         "load_result": "flexigpt.runtime.evaluation.results",
         "validate_result": "flexigpt.runtime.evaluation.results",
         "HEADLINE_METRIC": "flexigpt.runtime.evaluation.tasks",
         "PAPER_TASKS": "flexigpt.runtime.evaluation.tasks"}

__all__ = ["HEADLINE_METRIC", "PAPER_TASKS", "evaluate_model", "load_result",
           "measure_inference", "run_inference_cost", "validate_result"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
