"""Bootstrap intervals over documents and perplexity windows, seeds, and claim verdicts.

Inputs are the per-document records of result JSONs
(:func:`flexigpt.runtime.evaluation.results.load_records`) or plain arrays. Two runs are paired only
when they scored the same documents: same task, same ``data_sha256`` (per perplexity text:
``text_sha256``, ``seq_len`` and window token counts), the same doc ids and, where recorded,
the same ``doc_hash`` per doc; otherwise :class:`PairingError` names the mismatch.

Statistics (all percentile bootstrap intervals, ``level`` = 0.95, ``n_boot`` = 2000,
deterministic for a given ``seed``; resampling is drawn as per-replicate document counts so
each replicate costs one matrix product):

* accuracy of a run on a task: mean over documents of the per-doc headline metric (``acc`` or
  ``acc_norm``, as the result's ``metric``); the average over tasks weighs tasks equally
  (documents are resampled per task independently, then the task means averaged);
* log-PPL of a run: ``Σ nll / Σ tokens`` over windows (windows resampled);
* a difference ``A − B`` is *paired* by default: each replicate resamples the same documents
  (windows) for both runs, so the per-document correlation between methods cancels;
* several runs per method (seeds; arrays ``[S, n]`` or lists of records) give a hierarchical
  bootstrap: each replicate draws S seeds with replacement per method (one draw shared by all
  tasks of that method: a seed is a whole run), then documents (shared by all seeds and, when
  paired, by both methods); the statistic is the mean over the drawn seeds. The interval
  then carries seed variance plus document variance. A single run (S = 1) is not resampled
  over seeds.

Public API::

    mean_interval(x)                       Interval of mean(x); x [n] or [S, n]
    diff_interval(a, b, paired=True)       Interval of mean(a) - mean(b)
    average_interval({task: x})            Interval of the mean over tasks
    average_diff_interval({task: (a, b)})  Interval of the difference of task averages
    logppl_interval(nll, tokens)           Interval of Σnll/Σtokens
    logppl_diff_interval(nll_a, tok_a, nll_b, tok_b, paired=True)
    task_values(records, task)             -> TaskValues (doc ids, per-doc metric, sha)
    paired_values(runs_a, runs_b, task)    -> (A [S_a, n], B [S_b, n]) after the checks
    run_intervals(records | [records])     single-run (or seeds) ± of each task, average, log-PPL
    compare_runs(a, b)                     paired A − B of each task, the average, log-PPL
    average_diff_replicates([{task: (a, b)}, ...])  -> Replicates: estimate [B], boot [n_boot, B]
    logppl_diff_replicates([(nll_a, tok_a, nll_b, tok_b), ...])  -> Replicates (joint windows)
    paired_replicates([(runs_a, runs_b), ...], metric)  -> Replicates of records (joint docs)
    run_values(runs, metric) / seed_variance(runs, metric)  per-run values, their seed spread
    add_seed_component(reps, variances)    a one-seed contrast's borrowed seed spread
    verdict(ci_low, ci_high, direction, margin=0)
                                           "supported" | "contradicted" |
                                           "no practical difference" | "undecided"
    tail_pvalues(boot, direction, margin)  bootstrap p-value of each decided outcome
    holm(pvalues, alpha) / holm_verdicts(boots, directions, margins)  family-wise control

Joint replicates: several contrasts scored on the same documents (one comparison at several
recovery-token budgets: every budget's runs are evaluated on the same test documents) are
resampled together: each replicate draws one document multiset per task (one window multiset
for log-PPL) and applies it to every run of every contrast, so ``boot[r]`` is one draw of
the whole vector of differences and any function of it (a slope across budgets) gets its
interval from the rows of ``boot``. Drawing each budget with its own seed would treat the
shared documents as independent samples and misstate the spread of such functions.

Margins (smallest effect that matters, m): :func:`verdict` calls an interval wholly beyond
+m supported (a minimum-effect test), wholly beyond −m contradicted, wholly inside ±m "no
practical difference" (equivalence, two one-sided tests) and anything else undecided.
:func:`holm_verdicts` decides a family of such claims with Holm's step-down on the bootstrap
p-values dual to those intervals (:func:`tail_pvalues`), so the family-wise error of all its
supported / contradicted / no-difference calls stays at 1 − level.
"""

from __future__ import annotations

from flexigpt.core.stats.bootstrap import LEVEL, N_BOOT, PairingError
from flexigpt.core.stats.decisions import (
                                      NO_DIFFERENCE,
                                      VERDICTS,
                                      holm,
                                      holm_verdicts,
                                      tail_pvalues,
                                      verdict,
)
from flexigpt.core.stats.intervals import (
                                      Interval,
                                      Replicates,
                                      average_diff_interval,
                                      average_diff_replicates,
                                      average_interval,
                                      diff_interval,
                                      logppl_diff_interval,
                                      logppl_diff_replicates,
                                      logppl_interval,
                                      mean_interval,
)
from flexigpt.core.stats.records import (
                                      TaskValues,
                                      compare_runs,
                                      paired_replicates,
                                      paired_values,
                                      run_intervals,
                                      task_values,
                                      windows_values,
)
from flexigpt.core.stats.seeds import add_seed_component, run_values, seed_variance

__all__ = ["LEVEL", "NO_DIFFERENCE", "N_BOOT", "VERDICTS", "Interval", "PairingError",
           "Replicates", "TaskValues", "add_seed_component", "average_diff_interval", "average_diff_replicates",
           "average_interval", "compare_runs", "diff_interval", "holm", "holm_verdicts",
           "logppl_diff_interval", "logppl_diff_replicates", "logppl_interval",
           "mean_interval", "paired_replicates", "paired_values", "run_intervals", "run_values",
           "seed_variance", "tail_pvalues", "task_values", "verdict", "windows_values"]
