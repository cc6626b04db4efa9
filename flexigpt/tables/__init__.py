"""The paper's tables and figures regenerated from result files.

``build_all(results_dir, out_dir)`` (``report``) is the entry point (``flexigpt tables`` on
the CLI). Modules, bottom first (each imports only from those before it; no cycle):

* inputs: ``schema`` (JSON checks, ``ResultFileError``), ``collect`` (discovery, result /
  timing JSONs, training logs, manifests), ``selections`` (LR-sweep ``selection.json``),
  ``published`` (the paper's numbers);
* shared pieces: ``labels`` (display names, slugs), ``rows`` (row subsets of the
  seed-aggregated frame), ``render`` (Markdown/CSV/LaTeX/HTML), ``row_intervals`` (95 %
  bootstrap intervals from the per-document records), ``columns`` and ``paper_blocks``
  (the result tables' columns, notes and paper rows);
* tables and figures: ``sweep`` (LR sweeps), ``plots`` (figures), ``curves`` (per-ratio
  recovery curves, Table 1's "tokens to reach the baseline"), ``build`` (Tables 1 and 5,
  paper protocol, KD), ``ablation`` (Table 4), ``decode`` (decoding timings) and ``timing``
  (Tables 6, 7), ``comparisons`` (paired differences, ``comparisons.md``), ``trend_fit`` /
  ``trend`` (the gap against the recovery budget), ``ladder`` (a budget ladder's points and
  jointly resampled differences), ``decision`` / ``claim_rows`` / ``timing_claims`` /
  ``marks`` / ``verdicts`` (the paper's claims decided by those intervals, at a ladder's
  budgets the ladder's interval; each verdict's mark on the page; ``verdicts.md``),
  ``ladder_figure`` / ``budget`` (budget ladder tables and figures);
* ``headline`` / ``findings`` / ``run_times`` (the README's headline, findings and legend,
  run-time table), ``page`` (the report pages, ``report.md`` / ``report.html``, in the
  findings' words);
* ``report``: ``build_all``; ``from_archive``: the same tables from an archived run (``flexigpt tables --archive``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flexigpt.core.lazy import lazy_exports

if TYPE_CHECKING:  # imported on first use: `python -m flexigpt.tables.<module>` then runs a
    # module the package has not imported already (no runpy warning, no double import)
    from flexigpt.tables.report import build_all
    from flexigpt.tables.schema import ResultFileError

__all__ = ["ResultFileError", "build_all"]

__getattr__, __dir__ = lazy_exports(__name__, {"build_all": "flexigpt.tables.report",
                                               "ResultFileError": "flexigpt.tables.schema"},
                                    globals())
