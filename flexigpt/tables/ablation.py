"""Paper Table 4: FlexiGPT ablations, start (before recovery) and final PPL per variant."""

from __future__ import annotations

import logging

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.collect import STAGES
from flexigpt.tables.labels import ABLATIONS, display_name, slug
from flexigpt.tables.paper_blocks import PAPER_NOTES, paper_title, reference_model
from flexigpt.tables.published import match_published
from flexigpt.tables.render import Block, Table
from flexigpt.tables.row_intervals import with_errors

log = logging.getLogger(__name__)


def _stage_wide(rows: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """One row per (ratio, variant) with ``<metric>_<stage>`` columns, in ablation order."""
    out = []
    for (ratio, variant), g in rows.groupby(["ratio", "variant"], dropna=False, sort=False):
        rec = {"ratio": ratio, "variant": variant}
        for stage in STAGES:
            hit = g[g["stage"].eq(stage)]
            rec.update({f"{m}_{stage}": hit[m].iloc[0] if len(hit) else float("nan")
                        for m in metrics})
        out.append(rec)
    order = {v: i for i, v in enumerate(ABLATIONS)}
    df = pd.DataFrame(out)
    return (df.assign(_k=df["variant"].map(order)).sort_values(["ratio", "_k"])
            .drop(columns="_k").reset_index(drop=True))


def table4(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
           display: str | None = None) -> Table | None:
    """FlexiGPT ablations: start (before recovery) and final PPL per variant and ratio."""
    name = display_name(model, display)
    rows = agg[agg["model"].eq(model) & agg["method"].eq(ROLES.subject)
               & agg["variant"].isin(ABLATIONS)]
    if not (rows["variant"] != "default").any():
        log.info("table 4 for %s: no ablation results; skipped", model)
        return None
    cis = tuple(c for c in ("ppl_lo", "ppl_hi", "avg_lo", "avg_hi") if c in rows)
    ours = _stage_wide(rows, ("ppl", "avg", *cis))
    kinds = {"Ratio": "pct0", "Start PPL": "ppl", "Final PPL": "ppl", "Final Avg": "num"}
    best = {"Start PPL": "min", "Final PPL": "min", "Final Avg": "max"}

    def frame_of(wide: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"Variant": wide["variant"].map(ABLATIONS).values,
                             "Ratio": (wide["ratio"] * 100).values,
                             "Start PPL": wide["ppl_start"].values,
                             "Final PPL": wide["ppl_final"].values,
                             "Final Avg": wide["avg_final"].values if "avg_final" in wide
                             else float("nan")})

    notes = ["Start = right after compression, before recovery; Final = after recovery "
             "(Final Avg = mean of the five tasks in %). Best per column within each ratio "
             "in bold."]
    stage_ci = ours.rename(columns={f"{m}_{s}_{st}": f"{m}{st}_{s}" for m in ("ppl", "avg")
                                    for s in ("lo", "hi") for st in STAGES})
    blocks = [with_errors(Block(f"Ours: {name}, FlexiGPT ablations", frame_of(ours), kinds,
                                best, "Ratio", notes=notes), stage_ci,
                          {"pplstart": "Start PPL", "pplfinal": "Final PPL",
                           "avgfinal": "Final Avg"})]
    key, same = reference_model(model, pub, (4,), "llama-2-7b")
    paper = _stage_wide(pub[pub["table"].eq(4) & pub["model"].eq(key)], ("ppl",))
    pframe = frame_of(paper).drop(columns="Final Avg")
    blocks.append(Block(paper_title(key, (4,), same), pframe, kinds, best, "Ratio",
                        notes=[PAPER_NOTES[4]]))
    deltas = pd.DataFrame(index=ours.index, columns=["delta_ppl_start", "delta_ppl_final"],
                          dtype=float)
    for i, r in ours.iterrows():
        for stage in STAGES:
            ref = match_published(pub, (4,), model, ROLES.subject, r["variant"], r["ratio"], stage)
            if ref is not None:
                deltas.at[i, f"delta_ppl_{stage}"] = r[f"ppl_{stage}"] - ref["ppl"]
    hit = deltas.notna().any(axis=1)
    if hit.any():
        blocks.append(Block("Δ ours − paper (same setting)", pd.DataFrame({
            "Variant": ours["variant"][hit].map(ABLATIONS).values,
            "Ratio": (ours["ratio"][hit] * 100).values,
            "Δ Start PPL": deltas["delta_ppl_start"][hit].values,
            "Δ Final PPL": deltas["delta_ppl_final"][hit].values}),
            {"Ratio": "pct0", "Δ Start PPL": "delta", "Δ Final PPL": "delta"}))
    csv = pd.concat([ours.assign(source="ours", model=model).join(deltas),
                     paper.assign(source="paper", model=key,
                                  citation="FlexiGPT NAACL 2025, Table 4")], ignore_index=True)
    front = ["source", "model", "variant", "ratio"]
    csv = csv[front + [c for c in csv.columns if c not in front]]
    return Table(f"table4_ablation_{slug(model)}", f"Table 4 — FlexiGPT ablations, {name}",
                 blocks, csv)
