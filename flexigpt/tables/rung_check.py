"""The rung check: does successive halving's ranking at the rung equal the ranking at the end?

A sweep with the rung check (config ``tuning.rung_check``) trains its bracketing trials (the
chosen one's nearest trials on each side of every learning-rate axis) on to the end beside
the chosen one and records their final tuning perplexity. For each such run this table
lists those trials in the rung's order and in the final order and says whether the choice,
and the whole order, is the same. Rows come from
:func:`~flexigpt.tables.selections.collect_selections`.
"""

from __future__ import annotations

import math

import pandas as pd

from flexigpt.tables.labels import display_name, slug
from flexigpt.tables.render import Block, Table
from flexigpt.tables.sweep import order_trials, run_label


def _point(row: pd.Series) -> str:
    """A trial's learning rates as the table names them (``4e-3`` or ``4e-3 / γ 5e-2``)."""
    text = f"{row['lr']:.3g}"
    return text if pd.isna(row["gamma_lr"]) else f"{text} / γ {row['gamma_lr']:.3g}"


def _order(trials: pd.DataFrame, column: str) -> list[str]:
    """Trial points from best to worst by ``column`` (non-finite and diverged last, in
    trial order); ties keep the trial order."""
    score = trials[column].map(lambda v: v if isinstance(v, float) and math.isfinite(v)
                               else math.inf)
    if column == "tune_ppl_final":
        score = score.where(~trials["final_diverged"].astype(bool), math.inf)
    ranked = trials.assign(_s=score, _i=range(len(trials))).sort_values(["_s", "_i"])
    return [_point(r) for _, r in ranked.iterrows()]


def rung_check_table(sel: pd.DataFrame, model: str, display: str | None = None) -> Table | None:
    """One row per checked run of ``model`` (None when no run of it was checked). A sweep
    without a rung (``tuning.rung: 1``: every trial compared at its end) has nothing to
    check and no row."""
    rows = order_trials(sel[sel["model"].eq(model)]) if not sel.empty else sel
    records = []
    for run, trials in (rows.groupby("run", sort=False) if len(rows) else ()):
        scored = trials[trials["tune_ppl"].map(lambda v: math.isfinite(v))
                        & ~trials["diverged"].astype(bool)]
        scored = scored[scored["tune_ppl_final"].map(lambda v: math.isfinite(v))
                        | scored["final_diverged"].astype(bool)]
        first = trials.iloc[0]
        if len(scored) < 2 or first["rung_step"] >= first["steps"]:
            continue  # no rung check: only the chosen trial reached the end, or no rung
        at_rung, at_end = _order(scored, "tune_ppl"), _order(scored, "tune_ppl_final")
        records.append({
            "run": run, "label": run_label(first["method"], first["variant"], first["setting"]),
            "trials": len(scored), "rung_step": first["rung_step"], "steps": first["steps"],
            "rung_order": " > ".join(at_rung), "final_order": " > ".join(at_end),
            "same_choice": at_rung[0] == at_end[0], "same_order": at_rung == at_end})
    if not records:
        return None
    csv = pd.DataFrame(records)
    frame = pd.DataFrame({
        "Run": csv["label"], "Trials": csv["trials"],
        "Rung": [f"{int(k)}/{int(n)}" for k, n in zip(csv["rung_step"], csv["steps"])],
        "Order at the rung (best first)": csv["rung_order"],
        "Order at the end": csv["final_order"],
        "Same choice": ["yes" if v else "**no**" for v in csv["same_choice"]],
        "Same order": ["yes" if v else "no" for v in csv["same_order"]]})
    name = display_name(model, display)
    agree = int(csv["same_choice"].sum())
    notes = [f"{agree} of {len(csv)} checked runs choose at the rung what they would choose "
             "at the end. The chosen trial and its bracketing neighbours (the nearest trials on "
             "each side of every learning-rate axis), compared at the rung by their "
             "tuning-split perplexity at step k of n, were also trained to step n on the same "
             "schedule (tuning.rung_check); the run's model is the rung's choice either way. "
             "Points are LR (and γ LR); "
             "> = lower tuning perplexity; a trial that diverged after the rung ranks last."]
    block = Block(f"Ours: {name}, rung check", frame, notes=notes)
    return Table(f"rung_check_{slug(model)}", f"Rung check of the LR sweeps, {name}", [block],
                 csv)
