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

from flexigpt.runtime.evaluation.inference import measure_inference, run_inference_cost
from flexigpt.runtime.evaluation.results import evaluate_model, load_result, validate_result
from flexigpt.runtime.evaluation.tasks import HEADLINE_METRIC, PAPER_TASKS

__all__ = ["HEADLINE_METRIC", "PAPER_TASKS", "evaluate_model", "load_result",
           "measure_inference", "run_inference_cost", "validate_result"]
