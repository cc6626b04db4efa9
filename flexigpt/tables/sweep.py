"""The recovery LR sweeps: every trial of every ``selection.json`` and the chosen LR.

Rows come from :func:`~flexigpt.tables.selections.collect_selections` (one per trial); the
figure is :func:`flexigpt.tables.plots.lr_sweep`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import pandas as pd

from flexigpt.tables.labels import EXTENSION_LABELS, METHOD_ORDER, display_name, method_label, slug
from flexigpt.tables.render import Block, Table
from flexigpt.tables.row_intervals import run_key

log = logging.getLogger(__name__)

_RANK = {m: i for i, m in enumerate(METHOD_ORDER)}
_KINDS = {"LR": "sci", "γ LR": "sci", "Trainable (M)": "num", "Tokens": "si",
          "PPL before": "ppl", "Tune PPL": "ppl", "Final tune PPL": "ppl"}


def order_trials(sel: pd.DataFrame) -> pd.DataFrame:
    """Trials by setting (ratios first, ascending), method order, variant, γ LR, LR."""
    return sel.assign(
        _r=sel["ratio"].fillna(math.inf), _m=sel["method"].map(lambda m: _RANK.get(m, len(_RANK))),
        _g=sel["gamma_lr"].fillna(-1.0)).sort_values(
        ["_r", "setting", "_m", "method", "variant", "_g", "lr"]).drop(
        columns=["_r", "_m", "_g"]).reset_index(drop=True)


#: where a run's chosen learning rates sit (:func:`choice_status`)
BRACKETED, EDGE = "bracketed", "edge"


def choice_status(sel: pd.DataFrame) -> dict[tuple, str]:
    """:func:`run_key` → :data:`BRACKETED` or :data:`EDGE`: where the run's chosen
    learning rates sit in its search. A run that reuses another run's choice (``lr_from``,
    a results path ending in that run's key ``run``) takes that run's status; one whose
    source is not among ``sel`` is left out."""
    chosen = [row for _, row in sel.iterrows() if bool(row["chosen"])]
    own = {str(r["run"]): BRACKETED if r["search_status"] == BRACKETED else EDGE
           for r in chosen if not str(r["search_status"]).startswith("reuses")}
    status: dict[tuple, str] = {}
    for r in chosen:
        source = r.get("lr_from")
        found = ([v for k, v in own.items() if source.rstrip("/").endswith(k)]
                 if isinstance(source, str) else [own.get(str(r["run"]))])
        if found and found[0] is not None:
            status[run_key(r)] = found[0]
    return status


def _search_cell(row: pd.Series, status: Mapping[tuple, str]) -> str:
    """The chosen row's search status, its neighbours' Tune PPL and its trial count; a
    reusing run says where the choice it reuses sits."""
    text = str(row["search_status"])
    if row.get("search_neighbours"):
        text += f" ({row['search_neighbours']})"
    if not text.startswith("reuses"):
        text += f"; {int(row['search_trials'])} trials"
    elif run_key(row) in status:
        text += (" (a bracketed choice)" if status[run_key(row)] == BRACKETED
                 else " (a choice at an edge: unbracketed)")
    return text


def sweep_label(method: str, variant: str) -> str:
    """The run's display name (the extension's and controls' names from Table 5)."""
    return EXTENSION_LABELS.get((method, variant)) or method_label(method, variant)


def run_label(method: str, variant: str, setting: str) -> str:
    return f"{sweep_label(method, variant)} @ {setting}"


def sweep_table(sel: pd.DataFrame, model: str, display: str | None = None) -> Table | None:
    """All LR-sweep trials of ``model`` (one bolding group per run; ✓ = chosen)."""
    rows = sel[sel["model"].eq(model)]
    if rows.empty:
        log.info("LR sweep table for %s: no selection records; skipped", model)
        return None
    name = display_name(model, display)
    ours = order_trials(rows)
    status = choice_status(ours)
    frame = pd.DataFrame({
        "Run": [run_label(m, v, s) for m, v, s in zip(ours["method"], ours["variant"],
                                                      ours["setting"])],
        "LR": ours["lr"], "γ LR": ours["gamma_lr"],
        "Trainable (M)": ours["trainable_params"] / 1e6, "Tokens": ours["tokens"],
        "PPL before": ours["tune_ppl_before"], "At step": [
            "" if pd.isna(k) else f"{int(k)}/{int(n)}"
            for k, n in zip(ours["rung_step"], ours["steps"])],
        "Tune PPL": ours["tune_ppl"], "Final tune PPL": ours["tune_ppl_final"],
        "Chosen": ["✓" if c else "diverged" if d or not math.isfinite(t) else ""
                   for c, d, t in zip(ours["chosen"], ours["diverged"], ours["tune_ppl"])],
        "Search": [_search_cell(row, status) if row["chosen"] else ""
                   for _, row in ours.iterrows()]})
    if frame["γ LR"].isna().all():
        frame = frame.drop(columns="γ LR")
    halving = ours["rung_step"].notna() & ours["rung_step"].lt(ours["steps"])
    if not halving.any():
        frame = frame.drop(columns=["At step", "Final tune PPL"])
    texts = sorted({t if pd.isna(w) else f"{t} ({int(w)} windows)"
                    for t, w in zip(ours["tune_text"], ours["tune_windows"])})
    metrics = sorted(set(ours["metric"]))
    notes = [f"Selection metric {', '.join(metrics)}: PPL on {', '.join(texts)} after recovery "
             "with the trial's learning rate(s); PPL before = the same text before recovery. "
             "✓ = the chosen trial (selection.json); lowest Tune PPL per run in bold; "
             "diverged = the trial failed or ended with a non-finite tune PPL."]
    if halving.any():
        notes.append("Successive halving: every trial trained the first k of n steps on the "
                     "full run's schedule and was compared by its Tune PPL at step k (At step "
                     "k/n); only the chosen trial continued to step n (Final tune PPL), or, "
                     "under the rung check, every trial (the rung check table).")
    if "γ LR" in frame:
        notes.append("γ LR = the learning rate of FlexiGPT's output-norm gains (– = none).")
    notes.append("Search (on the chosen row; flexigpt.core.lr_search): bracketed = the choice "
                 "has a scored, worse or diverged trial at most 2x away on each side of every "
                 "learning-rate axis the run searched, their Tune PPL in brackets; edge: why "
                 "not (a side never tried, a neighbour more than 2x away, the hard range or "
                 "the trial cap of the rule, an axis the grid never moved); reuses = trained "
                 "at another run's chosen learning rates, for the config's stated reason "
                 "(tuning.reuse), and whether that choice is bracketed; n trials = trials the "
                 "run scored.")
    off = []
    for run, g in ours.groupby("run", sort=False):
        finite = g[g["tune_ppl"].map(math.isfinite)]
        chosen = g[g["chosen"]]
        if len(finite) and len(chosen) and not (
                chosen["tune_ppl"].iloc[0] <= finite["tune_ppl"].min()):
            off.append(run)
    if off:
        notes.append(f"Chosen trial is not the lowest Tune PPL for: {', '.join(off)}.")
    block = Block(f"Ours: {name}, recovery LR sweeps", frame, _KINDS, {"Tune PPL": "min"},
                  group="Run", notes=notes)
    csv = ours.drop(columns=["file"]).assign(
        label=[run_label(m, v, s) for m, v, s in zip(ours["method"], ours["variant"],
                                                     ours["setting"])])
    front = ["model", "run", "label", "method", "variant", "setting", "ratio"]
    csv = csv[front + [c for c in csv.columns if c not in front]]
    return Table(f"lr_sweep_{slug(model)}", f"Recovery LR sweeps, {name}", [block], csv)
