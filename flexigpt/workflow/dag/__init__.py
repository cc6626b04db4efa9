"""The run grid of the Snakemake DAG, as typed objects (config → runs → paths/params).

``workflow/rules/common.smk`` builds one :class:`RunGrid` from the validated config; rules
only look things up in it. A *run* is one model produced by the DAG, addressed by the
wildcards ``{model}/{method}/{variant}/{setting}``:

- ``setting`` is ``r<ratio>`` for compression, ``full`` for the dense model and ``L<layers>``
  for the extension; ``variant`` is ``default`` or an ablation / extension pattern name.
- Each run is evaluated at stage ``final`` (perplexity + tasks) and, when it has recovery
  training, at stage ``start`` (perplexity right after compression: Table 4's "Start PPL").
- Held-out text is split by document (:func:`flexigpt.methods.calibration.split_heldout`): every
  recovery choice reads the tuning split, perplexity only the test split.
- A recovered run trains every point of its recipe's tuning grid in one job, by successive
  halving (:func:`flexigpt.runtime.training.tuning.run_sweep`, rung ``tuning.rung`` of the
  schedule), and keeps the best on the tuning split as ``trained/`` (its
  ``selection.json`` lists every trial). Its training log records the tuning-split
  perplexity every ``training.eval_every_tokens`` tokens
  (:func:`flexigpt.runtime.training.config.curve_every_steps`).
- The budget axis (``budget:``, :func:`budget_runs`): named Table 1 runs recovered again at
  a ladder of token budgets, each a run of its own (variant ``tok<n>`` / ``<variant>_tok<n>``,
  table ``budget``) whose schedule ends at its own budget.

Modules, bottom to top: :mod:`~flexigpt.workflow.dag.runs` (a run and its key),
:mod:`~flexigpt.workflow.dag.derived` (seed replicates, the budget ladder),
:mod:`~flexigpt.workflow.dag.defaults` (the schema's defaults), :mod:`~flexigpt.workflow.dag.sections` (one
builder per config section) and :mod:`~flexigpt.workflow.dag.grid` (the grid and its lookups; it
checks itself with :func:`flexigpt.workflow.config_check.check_grid`, which sits below this package).
"""

from __future__ import annotations

from flexigpt.workflow.dag.defaults import with_schema_defaults
from flexigpt.workflow.dag.derived import budget_runs, budget_variant, replicate_runs
from flexigpt.workflow.dag.grid import RunGrid
from flexigpt.workflow.dag.runs import (
                               BI_METHODS,
                               BUDGET_LR,
                               BUDGET_TASKS,
                               GRID_KEYS,
                               TABLES,
                               Key,
                               Run,
                               prefix_of,
                               step_tokens,
)

__all__ = ["BI_METHODS", "BUDGET_LR", "BUDGET_TASKS", "GRID_KEYS", "TABLES", "Key", "Run",
           "RunGrid", "budget_runs", "budget_variant", "prefix_of", "replicate_runs",
           "step_tokens", "with_schema_defaults"]
