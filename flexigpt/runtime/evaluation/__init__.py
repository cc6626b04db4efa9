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

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """Import a public name on first use (a submodule alone loads no other)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
