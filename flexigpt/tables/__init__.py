"""The paper's tables and figures regenerated from result files.

``build_all(results_dir, out_dir)`` is the entry point (``flexigpt tables`` on the CLI);
``collect`` reads and validates inputs (result JSONs, timings, training logs, manifests,
LR-sweep ``selection.json``), ``published`` holds the paper's numbers, ``build`` (Tables 1
and 5, paper protocol, KD), ``ablation`` (Table 4), ``timing`` (Tables 6, 7) and ``sweep``
(LR sweeps) make the tables, ``render`` writes Markdown/CSV/LaTeX, ``plots`` the figures.
``intervals`` adds 95 % bootstrap intervals from the per-document records,
``comparisons`` the paired differences (``comparisons.md``), ``verdicts`` the paper's claims
decided by those intervals (``verdicts.md``), ``curves`` the per-ratio recovery curves and
Table 1's "tokens to reach the baseline's final loss".
"""

from __future__ import annotations

from flexigpt.tables.collect import ResultFileError
from flexigpt.tables.report import build_all

__all__ = ["ResultFileError", "build_all"]
