"""Across models: do the verdicts and the replacement ranking hold beyond one model?

Reads the tables of two or more finished runs (each run's table directory holds the
``verdicts.csv`` and ``table_replacement_<model>.csv`` that :func:`flexigpt.tables.build_all`
wrote, e.g. ``results/reference/smollm2-135m`` and ``results/reference/gemma3-270m``) and
writes, side by side, one column group per model:

* ``verdicts_across_models``: each claim row of the per-model verdicts (the same claim,
  setting and recovery tokens; the per-model decision rules are unchanged: margins, Holm for
  counted claims, † for one seed) and a summary per row (:func:`summary`): on how many of the
  models the claim holds (supported), fails (contradicted or no practical difference), is
  undecided, or was not tested (not run, no records, not decided, timings).
* ``table_replacement_across_models``: each strategy row (method, variant, ratio, stage) with
  every model's PPL, its rank by PPL among that model's rows of the same ratio and stage,
  and its paired Δ log-PPL vs the skip row, decided by the verdicts' rule with the log-PPL
  margin (:func:`vs_skip`), and a summary of those decisions across models.

Nothing here recomputes an interval: every number is read from a per-model table, so the
cross-model tables are exactly as reproducible as those (``flexigpt tables --across``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from flexigpt.core import stats
from flexigpt.tables.decision import (
    CONTRADICTED,
    LOG_PPL_MARGIN,
    NO_DIFFERENCE,
    SINGLE_SEED,
    SUPPORTED,
    UNDECIDED,
)
from flexigpt.tables.labels import row_label
from flexigpt.tables.render import Block, Table, write_table
from flexigpt.tables.schema import ResultFileError

#: the per-model tables read from each run directory
VERDICTS = "verdicts.csv"
REPLACEMENT = "table_replacement_*.csv"
#: how a per-model verdict counts in the summary
HOLDS, FAILS, OPEN, UNTESTED = "holds", "fails", "undecided", "not tested"
_CLASS = {SUPPORTED: HOLDS, CONTRADICTED: FAILS, NO_DIFFERENCE: FAILS, UNDECIDED: OPEN}
#: the words of :func:`vs_skip` (Δ log-PPL vs the skip row, lower is better)
BETTER, WORSE, TIED = "lower PPL than skip", "higher PPL than skip", "no practical difference"


def classify(verdict: str) -> str:
    """:data:`HOLDS`, :data:`FAILS`, :data:`OPEN` or :data:`UNTESTED` for a per-model
    verdict (anything without an interval-based decision is untested)."""
    return _CLASS.get(verdict, UNTESTED)


def _count(n: int, of: int) -> str:
    if of == 2:
        return {0: "neither", 1: "one", 2: "both"}[n]
    return "none" if n == 0 else "all" if n == of else str(n)


def summary(classes: Sequence[str], single_seed: bool = False) -> str:
    """Across-model summary of one claim row from its per-model classes (:func:`classify`).

    Every model tested and decided: "holds on both" / "holds on one" / "holds on neither"
    (counts beyond two models: "holds on 2 of 3"); every model undecided: "undecided";
    otherwise the parts that occur, e.g. "holds on one; undecided on one" or "fails on one;
    not tested on one"; "not tested" when no model has a decision rule for it. † when a
    decision rests on one training seed on a side."""
    n = len(classes)
    counts = {c: classes.count(c) for c in (HOLDS, FAILS, OPEN, UNTESTED)}
    decided = counts[HOLDS] + counts[FAILS]
    if counts[UNTESTED] == n:
        return UNTESTED
    if counts[OPEN] == n:
        return OPEN
    if decided == n:
        held = counts[HOLDS]
        text = f"holds on {_count(held, n)}" + ("" if n == 2 or held in (0, n) else f" of {n}")
    else:
        text = "; ".join(f"{word} on {_count(counts[c], n)}"
                         for c, word in ((HOLDS, "holds"), (FAILS, "fails"), (OPEN, "undecided"),
                                         (UNTESTED, "not tested")) if counts[c])
    return text + (f" {SINGLE_SEED}" if single_seed and decided else "")


def vs_skip(low: float | None, high: float | None,
            margin: float = LOG_PPL_MARGIN) -> str | None:
    """A replacement row's Δ log-PPL vs skip decided by the verdicts' interval rule
    (:func:`flexigpt.core.stats.verdict`, claim "lower", ``margin`` nats): :data:`BETTER`,
    :data:`WORSE`, :data:`TIED` or "undecided"; None without an interval (the skip row)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return None
    word = stats.verdict(low, high, "less", margin)
    return {"supported": BETTER, "contradicted": WORSE}.get(word, word)


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ResultFileError(path, f"not a readable table ({exc})") from exc


def read_run(run_dir: str | os.PathLike) -> tuple[str, pd.DataFrame, pd.DataFrame | None]:
    """``(model key, verdict rows, replacement rows or None)`` of one run's table directory.

    Raises:
        FileNotFoundError: no ``verdicts.csv`` there (named).
        ResultFileError: a table is unreadable, lacks its columns, or holds several models.
    """
    root = Path(run_dir)
    path = root / VERDICTS
    if not path.is_file():
        raise FileNotFoundError(f"{root} holds no {VERDICTS}: give a run's table directory "
                                "(flexigpt tables --out)")
    verdicts = _read_csv(path)
    need = {"Claim", "Setting", "Budget", "Verdict", "Δ [95% CI]", "single_seed", "tokens",
            "model"}
    if missing := sorted(need - set(verdicts.columns)):
        raise ResultFileError(path, f"missing columns {missing}")
    models = list(dict.fromkeys(verdicts["model"]))
    if len(models) != 1:
        raise ResultFileError(path, f"expected the verdicts of one model, found {models}")
    found = sorted(root.glob(REPLACEMENT))
    if len(found) > 1:
        raise ResultFileError(root, f"several replacement tables: {[p.name for p in found]}")
    return str(models[0]), verdicts, _read_csv(found[0]) if found else None


def _row_key(row: pd.Series) -> tuple[str, str, str]:
    """A claim row's identity across models: claim, setting and recovery tokens (the
    budget's text carries the model's tokens per parameter, which differ by model)."""
    budget = str(row["Budget"]) if _no_tokens(row) else f"{int(row['tokens'])} tokens"
    setting = "" if pd.isna(row["Setting"]) else str(row["Setting"])
    return str(row["Claim"]), setting, budget


def _matched_rows(runs: Sequence[tuple[str, pd.DataFrame]]) -> tuple[
        list[tuple[str, dict[tuple[str, str, str], pd.Series]]], list[tuple[str, str, str]]]:
    """Each model's verdict rows keyed by :func:`_row_key`, and the union of keys in
    first-seen order. A row without recovery tokens (a run missing on that model: its
    budget reads "–") joins the one row of the same claim and setting another model has,
    rather than standing as a row of its own."""
    keys: list[tuple[str, str, str]] = []
    keyed: list[tuple[str, dict[tuple[str, str, str], pd.Series]]] = []
    for model, rows in runs:
        mine: dict[tuple[str, str, str], pd.Series] = {}
        for _, row in rows.iterrows():
            key = _row_key(row)
            if key not in keys:
                same = [k for k in keys if k[:2] == key[:2] and k not in mine]
                if len(same) == 1 and (_no_tokens(row) or any(
                        _no_tokens(r[same[0]]) for _, r in keyed if same[0] in r)):
                    key = same[0]
                else:
                    keys.append(key)
            mine[key] = row
        keyed.append((model, mine))
    return keyed, keys


def _no_tokens(row: pd.Series) -> bool:
    tokens = row["tokens"]
    return not (isinstance(tokens, (int, float)) and math.isfinite(tokens))


def verdicts_across(runs: Sequence[tuple[str, pd.DataFrame]]) -> Table:
    """``verdicts_across_models`` from ``[(model, its verdicts.csv rows), ...]``: the union
    of claim rows in first-seen order, each model's Δ and verdict, and :func:`summary`."""
    keyed, keys = _matched_rows(runs)
    table_rows, csv_rows = [], []
    for key in keys:
        shown: dict[str, object] = {"Claim": key[0], "Setting": key[1] or "–",
                                    "Recovery": key[2]}
        classes, single, mine = [], False, []
        for model, rows in keyed:
            row = rows.get(key)
            verdict = "not in this run" if row is None else str(row["Verdict"])
            delta = ("–" if row is None or pd.isna(row["Δ [95% CI]"])
                     else str(row["Δ [95% CI]"]).replace(UNDECIDED, OPEN))
            classes.append(classify(verdict))
            seeded = (row is not None and str(row["single_seed"]) == "True"
                      and classes[-1] in (HOLDS, FAILS))
            single |= seeded
            shown[f"{model}: Δ [95% CI]"] = delta
            shown[f"{model}: verdict"] = verdict + (f" {SINGLE_SEED}" if seeded else "")
            mine.append({"claim": key[0], "setting": key[1], "recovery": key[2],
                         "model": model, "verdict": verdict, "class": classes[-1],
                         "delta": delta, "single_seed": seeded})
        shown["Across models"] = summary(classes, single)
        csv_rows += [{**row, "across": shown["Across models"]} for row in mine]
        table_rows.append(shown)
    models = [m for m, _ in runs]
    notes = [
        f"Models: {', '.join(models)}. Each model's Δ and verdict are its own run's "
        "(verdicts.md there: paired bootstrap intervals over the same documents / windows, "
        "margins 0.02 nats of log-PPL and 1 accuracy point, Holm for counted claims; "
        f"{SINGLE_SEED} = decided from one training seed on a side). Rows are matched by claim, "
        "setting and recovery tokens.",
        "Across models: holds = supported; fails = contradicted or no practical difference; "
        "undecided = the interval reaches into the margin; not tested = not run on that model "
        "(e.g. a method its family refuses), no records, not decided (unequal block counts), "
        "or a timing (reported, never decided)."]
    frame = pd.DataFrame(table_rows)
    return Table("verdicts_across_models", "Verdicts across models",
                 [Block("The paper's claims on every model", frame, notes=notes)],
                 pd.DataFrame(csv_rows))


def _ranked(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``rank`` (by PPL, 1 = lowest) and ``rows`` (how many ranked) among the
    rows of the same ratio and stage."""
    group = rows.groupby([rows["ratio"].round(6), rows["trained"].astype(str)])["ppl"]
    return rows.assign(rank=group.rank(method="min"), rows=group.transform("size"))


def _strategy_key(row: pd.Series) -> tuple[str, str, str, float, bool]:
    return (str(row["strategy"]), str(row["method"]), str(row["variant"]),
            round(float(row["ratio"]), 6), str(row["trained"]) == "True")


def replacement_across(runs: Sequence[tuple[str, pd.DataFrame]]) -> Table:
    """``table_replacement_across_models`` from ``[(model, its replacement csv), ...]``:
    one row per (strategy, method, variant, ratio, stage), one-shot rows first."""
    models = [m for m, _ in runs]
    keyed = [(model, {_strategy_key(r): r for _, r in _ranked(rows).iterrows()})
             for model, rows in runs]
    keys = list(dict.fromkeys(k for _, rows in keyed for k in rows))
    keys.sort(key=lambda k: (k[4], k[3]))  # one-shot first, then by ratio; stable otherwise
    table_rows, csv_rows = [], []
    for key in keys:
        strategy, method, variant, ratio, trained = key
        shown: dict[str, object] = {"Strategy": strategy,
                                    "Row": row_label(method, variant, trained),
                                    "Ratio": ratio * 100}
        decisions, mine = [], []
        for model, rows in keyed:
            row = rows.get(key)
            if row is None:
                shown[f"{model}: PPL"] = float("nan")
                shown[f"{model}: rank"] = "–"
                shown[f"{model}: Δ log-PPL vs skip"] = "not run"
                decisions.append(UNTESTED)
                continue
            low, high = _num(row["log_ppl_vs_skip_low"]), _num(row["log_ppl_vs_skip_high"])
            estimate = _num(row["log_ppl_vs_skip_estimate"])
            word = vs_skip(low, high)
            shown[f"{model}: PPL"] = float(row["ppl"])
            shown[f"{model}: rank"] = f"{int(row['rank'])} of {int(row['rows'])}"
            shown[f"{model}: Δ log-PPL vs skip"] = (
                "– (skip)" if word is None
                else f"{estimate:+.3f} [{low:+.3f}, {high:+.3f}]: {word}")
            decisions.append(word or "skip")
            mine.append({"strategy": strategy, "method": method, "variant": variant,
                         "ratio": ratio, "trained": trained, "model": model,
                         "ppl": float(row["ppl"]), "rank": int(row["rank"]),
                         "rows": int(row["rows"]), "log_ppl_vs_skip_estimate": estimate,
                         "log_ppl_vs_skip_low": low, "log_ppl_vs_skip_high": high,
                         "vs_skip": word})
        shown["Across models"] = _agreement(decisions)
        csv_rows += [{**row, "across": shown["Across models"]} for row in mine]
        table_rows.append(shown)
    frame = pd.DataFrame(table_rows)
    kinds = {"Ratio": "pct0", **{f"{m}: PPL": "ppl" for m in models}}
    notes = [
        f"Models: {', '.join(models)}. Rows are each model's replacement-strategies table "
        "(table_replacement_<model>.md there: Table 1's rows, same achieved compression, "
        "recovered rows (*) with the same tokens and trainable budget).",
        "rank = by PPL among the model's rows of the same ratio and stage (1 = lowest). Δ "
        "log-PPL vs skip = row − the skip row of the same ratio and stage, paired, 95% "
        "bootstrap interval, decided with the verdicts' margin (0.02 nats): lower / higher "
        "PPL than skip, no practical difference, or undecided.",
        "Across models: the decision on every model where the row was run, or how they differ."]
    return Table("table_replacement_across_models", "Replacement strategies across models",
                 [Block("Replacement strategies on every model", frame, kinds,
                        {f"{m}: PPL": "min" for m in models}, group="Ratio", notes=notes)],
                 pd.DataFrame(csv_rows))


def _num(v: object) -> float | None:
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _agreement(decisions: Sequence[str]) -> str:
    """One replacement row's Δ-vs-skip decisions across models, summarised."""
    run = [d for d in decisions if d != UNTESTED]
    absent = len(decisions) - len(run)
    if not run:
        return UNTESTED
    suffix = f"; not run on {_count(absent, len(decisions))}" if absent else ""
    if set(run) == {"skip"}:
        return "– (skip)" + suffix
    distinct = list(dict.fromkeys(run))
    text = (f"{distinct[0]} on {_count(len(run), len(decisions))}" if len(distinct) == 1
            else "differs: " + ", ".join(distinct))
    return text + suffix


def across_models(run_dirs: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                  formats: tuple[str, ...] = ("md", "csv")) -> list[Path]:
    """Write the cross-model tables of the runs in ``run_dirs`` (two or more table
    directories of different models) to ``out_dir``; returns the files written.

    Raises:
        ValueError: fewer than two runs, or two runs of the same model.
        FileNotFoundError / ResultFileError: from :func:`read_run`.
    """
    if len(run_dirs) < 2:
        raise ValueError("--across needs the table directories of at least two runs")
    runs = [read_run(d) for d in run_dirs]
    models = [m for m, _, _ in runs]
    if len(set(models)) != len(models):
        raise ValueError(f"--across needs runs of different models, got {models}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = write_table(verdicts_across([(m, v) for m, v, _ in runs]), out, formats)
    replacements = [(m, r) for m, _, r in runs if r is not None]
    if len(replacements) >= 2:
        written += write_table(replacement_across(replacements), out, formats)
    return written
