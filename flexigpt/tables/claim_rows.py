"""Rows of ``verdicts.md`` and the look-ups the claims share: our point values and the
paper's, the row dict of one claim (with its seeds and † mark), the Holm family of one
claim over the six benchmarks, and the recovery-budget fields of a row.

Keys are those of :func:`~flexigpt.tables.row_intervals.setting_key` (model, method, variant,
ratio, stage); metrics are ``log_ppl`` (nats), the five tasks and ``avg`` (points).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.collect import TASKS
from flexigpt.tables.comparisons import Comparator, Diff, key_of
from flexigpt.tables.decision import (
    CONTRADICTED,
    MISSING_RUN,
    NO_DIFFERENCE,
    SINGLE_SEED,
    SUPPORTED,
    UNDECIDED,
    Rules,
    decide_count,
    decide_family,
)
from flexigpt.tables.labels import TASK_HEADERS
from flexigpt.tables.published import match_published, paper_model
from flexigpt.tables.render import si
from flexigpt.tables.row_intervals import setting_key
from flexigpt.tables.rows import main_rows
from flexigpt.tables.trend import BudgetPair, budget_pairs

#: the six benchmarks of the counted claims (c), (f)
BENCHMARKS = ("log_ppl", *TASKS)
METRIC_COLUMN = {"log_ppl": "ppl"}  # metric → column of agg / published
BENCHMARK_HEADERS = {"log_ppl": "PPL", **TASK_HEADERS}
DIRECTION = {"log_ppl": "less"}  # lower log-PPL is better; accuracy: higher
#: the paper's models of Tables 1, 4 (PAPER_T1) and Table 5 (PAPER_T5)
PAPER_T1 = "llama-2-7b"
PAPER_T5 = "tinyllama-1.1b"


def num_text(value: Any, metric: str = "") -> str:
    """``value`` with two decimals, or "–" when missing."""
    if value is None or pd.isna(value):
        return "–"
    return f"{float(value):.2f}"


def agg_row(agg: pd.DataFrame, key: tuple) -> pd.Series | None:
    """The aggregated row of setting ``key`` (None: not in the results)."""
    rows = agg[agg["model"].eq(key[0])]
    hit = [i for i, r in rows.iterrows() if setting_key(r) == key]
    return rows.loc[hit[0]] if hit else None


def _point(agg: pd.DataFrame, key: tuple, metric: str) -> Any:
    row = agg_row(agg, key)
    return None if row is None else row[METRIC_COLUMN.get(metric, metric)]


def paper_pair(pub: pd.DataFrame, table: int | tuple[int, int], model: str, a: tuple,
               b: tuple, metric: str) -> str:
    """``A vs B`` of the paper's numbers (``a``/``b`` = (method, variant, ratio, stage);
    ``table`` one number or one per side)."""
    vals = []
    tables = table if isinstance(table, tuple) else (table, table)
    for t, (method, variant, ratio, stage) in zip(tables, (a, b)):
        ref = match_published(pub, (t,), model, method, variant, ratio, stage)
        value = None if ref is None else ref[METRIC_COLUMN.get(metric, metric)]
        vals.append(num_text(value, metric))
    return "" if vals == ["–", "–"] else f"{vals[0]} vs {vals[1]}"


def ours_pair(agg: pd.DataFrame, a: tuple, b: tuple, metric: str) -> str:
    """``A vs B`` of our point values of ``metric`` at settings ``a`` and ``b``."""
    return (f"{num_text(_point(agg, a, metric), metric)} vs "
            f"{num_text(_point(agg, b, metric), metric)}")


def _seeds(diffs: list[Diff]) -> tuple[str, bool]:
    """``Seeds`` text of the differences that decided a row and whether one side had a
    single seed whose interval covers documents only (then marked †). A one-seed side whose
    seed spread was borrowed from another budget of a ladder (``Diff.seed_source``) is
    covered: its text says where the spread came from, no †."""
    pairs = sorted({d.seeds for d in diffs if d.seeds})
    if not pairs:
        return "–", False
    uncovered = [d for d in diffs if d.seeds and min(d.seeds) == 1
                 and (not d.seed_source or "documents only" in d.seed_source)]
    single = bool(uncovered)
    text = ", ".join(" vs ".join(map(str, p)) for p in pairs)
    borrowed = sorted({d.seed_source for d in diffs if d.seeds and d.seed_source})
    if borrowed:
        text += f" (seed spread borrowed: {'; '.join(borrowed)})"
    return text + (f" {SINGLE_SEED}" if single else ""), single


def claim_row(claim: str, setting: str, paper: str, ours: str, diff: Diff | None,
              verdict: str, metric: str = "", *, budget: str = "–", tokens: float | None = None,
              tokens_per_param: float | None = None, notes: str = "",
              margin: float | None = None,
              decided_by: list[Diff] | None = None) -> dict[str, Any]:
    """One row of ``verdicts.csv``: the shown columns (Claim … Notes) and the interval,
    margin and budget fields; Seeds from ``decided_by`` (default: ``diff``)."""
    iv = diff.interval if diff is not None else None
    digits = 3 if metric == "log_ppl" else 1
    seeds, single = _seeds(decided_by if decided_by is not None else
                           ([diff] if diff is not None else []))
    decidable = decidable_from(iv, margin) if metric not in ("log_ppl", "count", "") \
        and verdict.startswith(UNDECIDED) else None
    if decidable is not None:
        reach = (f"decidable from a difference of {decidable:.1f} points (margin {margin:g} "
                 f"+ half-width {decidable - float(margin or 0):.1f})")
        notes = "; ".join(x for x in (notes, reach) if x)
    return {"Claim": claim, "Setting": setting, "Budget": budget, "Paper": paper or "–",
            "Ours": ours, "Metric": metric,
            "Δ [95% CI]": diff.text(digits) if diff is not None else "–", "Seeds": seeds,
            "Verdict": verdict, "Notes": notes, "estimate": iv.estimate if iv else None,
            "ci_low": iv.low if iv else None, "ci_high": iv.high if iv else None,
            "margin": margin, "tokens": tokens, "tokens_per_param": tokens_per_param,
            "single_seed": single, "decidable_from": decidable}


def decidable_from(iv: Any, margin: float | None) -> float | None:
    """The smallest |Δ| this evaluation decides (accuracy, in points): the margin plus the
    half-width of the paired interval, whose width comes from the per-document variance of
    the paired differences and the documents scored. A true effect of that size puts the
    interval past the margin when the estimate lands on it (50 % power); None without an
    interval or a margin."""
    if iv is None or margin is None:
        return None
    return float(margin) + (float(iv.high) - float(iv.low)) / 2


def claim_ratios(agg: pd.DataFrame, model: str) -> list[float]:
    """The compressed ratios of ``model``'s Table 1 rows, plus the paper's 30 % and 40 %."""
    rows = main_rows(agg, model)
    found = sorted(r for r in rows["ratio"].dropna().unique() if r > 0)
    return sorted(set(found) | {0.3, 0.4})


def pairs_at(agg: pd.DataFrame, model: str, r: float) -> list[BudgetPair]:
    """The like-for-like pairs at ratio ``r``, one per recovery token budget
    (:func:`~flexigpt.tables.trend.budget_pairs`); without one, the default keys (so the
    row says what is missing)."""
    return budget_pairs(agg, model, r) or [
        BudgetPair(round(r, 6), "default", None, None,
                   key_of(agg, model, ROLES.subject, "default", r),
                   key_of(agg, model, ROLES.comparator, "default", r))]


def budget_fields(pair: BudgetPair) -> dict[str, Any]:
    """The budget keyword arguments of :func:`claim_row` for ``pair``."""
    return {"budget": pair.budget_text(), "tokens": pair.tokens,
            "tokens_per_param": pair.tokens_per_param}


def decide_benchmarks(comp: Comparator, a: tuple, others: list[tuple], rules: Rules,
                      ) -> tuple[list[str], list[Diff]]:
    """Per benchmark (:data:`BENCHMARKS`): A against every other run, all 6 × len(others)
    tests decided as one Holm family. A benchmark is supported iff every test is,
    contradicted iff one is, no practical difference iff one is (and none contradicted)."""
    tests = [(metric, b) for metric in BENCHMARKS for b in others]
    diffs = [comp.diff(a, b, metric) for metric, b in tests]
    verdicts = decide_family(diffs, [DIRECTION.get(m, "greater") for m, _ in tests],
                             [rules.margin(m) for m, _ in tests], rules.level)
    out = []
    for metric in BENCHMARKS:
        vs = [v for (m, _), v in zip(tests, verdicts, strict=True) if m == metric]
        if not vs:
            out.append(MISSING_RUN)
        elif CONTRADICTED in vs or NO_DIFFERENCE in vs:
            out.append(CONTRADICTED if CONTRADICTED in vs else NO_DIFFERENCE)
        elif all(v == SUPPORTED for v in vs):
            out.append(SUPPORTED)
        else:
            out.append(next((v for v in vs if v not in (SUPPORTED, UNDECIDED)), UNDECIDED))
    return out, diffs


def count_row(claim: str, setting: str, paper: str, names: list[str], per: list[str],
              need: int, diffs: list[Diff], **kw: Any) -> dict[str, Any]:
    """The row of a counted claim: ``per`` = the verdict per benchmark, decided as "at least
    ``need`` won" (:func:`decide_count`); ``kw`` go to :func:`claim_row`."""
    won = sum(v == SUPPORTED for v in per)
    detail = "; ".join(f"{b}: {v}" for b, v in zip(BENCHMARKS, per))
    k = len([d for d in diffs if d.replicates is not None])
    notes = kw.pop("notes", "") or ""
    notes = "; ".join(x for x in (notes, f"Holm over {k} tests" if k else "") if x)
    row = claim_row(claim, setting, paper,
                    f"{won}/{len(per)} supported vs {', '.join(names)}", None,
                    decide_count(per, need), "count", decided_by=diffs, notes=notes, **kw)
    row["Δ [95% CI]"] = detail
    return row


def paper_wins(pub: pd.DataFrame, table: int, model: str, a: tuple[str, str, float | None],
               others: Sequence[tuple[str, str, float | None]]) -> tuple[int, list[str]] | None:
    """How many of the six benchmarks the paper's row ``a`` (method, variant, ratio) beats
    every row of ``others`` on (PPL: lower; a benchmark without both numbers is skipped),
    and the benchmarks it does not win (``"PIQA 73.23 vs 73.29"``). None without ``a``."""
    ref = match_published(pub, (table,), model, *a, "final")
    if ref is None or paper_model(model) is None:
        return None
    rows = [r for o in others if (r := match_published(pub, (table,), model, *o, "final"))
            is not None]
    won, lost = 0, []
    for metric in BENCHMARKS:
        col = METRIC_COLUMN.get(metric, metric)
        theirs = [float(r[col]) for r in rows if not pd.isna(r[col])]
        if pd.isna(ref[col]) or not theirs:
            continue
        best = min(theirs) if metric == "log_ppl" else max(theirs)
        if (ref[col] < best) if metric == "log_ppl" else (ref[col] > best):
            won += 1
        else:
            header = BENCHMARK_HEADERS.get(metric, metric)
            lost.append(f"{header} {float(ref[col]):.2f} vs {best:.2f}")
    return won, lost


def tokens_fields(agg: pd.DataFrame, key: tuple) -> dict[str, Any]:
    """Budget fields of the row ``key`` (``before recovery`` at the start stage)."""
    if key[4] == "start":
        return {"budget": "before recovery"}
    row = agg_row(agg, key)
    t = None if row is None or "tokens" not in row or pd.isna(row["tokens"]) else row["tokens"]
    return {"budget": "–" if t is None else f"{si(float(t))} tokens",
            "tokens": None if t is None else float(t)}
