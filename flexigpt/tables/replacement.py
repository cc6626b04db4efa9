"""The replacement-strategies table: what each block-removal method puts where the removed
blocks were (nothing, a folded linear map, one trained module, weight-shared blocks with
adapters), side by side at each ratio, one-shot and recovered.

Rows are Table 1's rows (same achieved compression, same recovery tokens and trainable
budget: the fairness contract) of the methods whose registry facts name a ``replacement``
(:attr:`flexigpt.storage.registry.MethodFacts.replacement`). Beside each row's PPL and average
(with their 95 % intervals) stand the parameters it adds back and its paired difference
from the skip row (the comparator's strategy, :data:`flexigpt.storage.registry.ROLES`) of the same
ratio and the same stage (one-shot against one-shot, recovered against recovered).
"""

from __future__ import annotations

import logging

import pandas as pd

from flexigpt.storage.registry import METHODS, ROLES
from flexigpt.tables.columns import marks_note, ordered_labels, result_notes
from flexigpt.tables.comparisons import Comparator, Diff
from flexigpt.tables.labels import display_name, slug
from flexigpt.tables.render import Block, Table
from flexigpt.tables.row_intervals import setting_key, with_errors
from flexigpt.tables.rows import column_or_nan, main_rows, order_rows

log = logging.getLogger(__name__)

#: the strategy every other row is compared with: what the comparator puts in (nothing)
SKIP = METHODS[ROLES.comparator].replacement


def strategy(method: str) -> str | None:
    """What ``method`` puts where removed blocks were (None: not a block-removal method)."""
    facts = METHODS.get(method)
    return facts.replacement if facts is not None else None


def block_size(rows: pd.DataFrame) -> float | None:
    """Parameters of one removed block, from the rows of methods that delete whole blocks
    and add nothing back (``block_count == "remove"``): (dense − compressed) / blocks.
    None when no such row has the counts."""
    removing = rows["method"].map(lambda m: METHODS[m].block_count == "remove")
    sizes = ((column_or_nan(rows, "params_dense") - column_or_nan(rows, "params_compressed"))
             / column_or_nan(rows, "blocks_pruned"))[removing & ~rows["trained"].astype(bool)]
    sizes = sizes.dropna()
    return float(sizes.iloc[0]) if len(sizes) else None


def added_parameters(rows: pd.DataFrame, per_block: float | None) -> pd.Series:
    """Parameters each row adds back where its blocks were: compressed − (dense − blocks ·
    one block's parameters), e.g. FlexiGPT's adapters and gains (its shared weights add
    none), LLM-Streamline's module, 0 for ShortGPT and ReplaceMe (its map is folded)."""
    if per_block is None:
        return pd.Series([float("nan")] * len(rows), index=rows.index)
    kept = column_or_nan(rows, "params_dense") - column_or_nan(rows, "blocks_pruned") * per_block
    return (column_or_nan(rows, "params_compressed") - kept).round()


def skip_partner(rows: pd.DataFrame, row: pd.Series) -> tuple | None:
    """The setting key of the skip row at ``row``'s ratio and stage (trained or one-shot),
    the comparator itself first; None when there is none."""
    same = rows[(rows["ratio"] - row["ratio"]).abs().lt(1e-9)
                & rows["trained"].astype(bool).eq(bool(row["trained"]))
                & rows["method"].map(strategy).eq(SKIP)]
    if same.empty:
        return None
    first = same[same["method"].eq(ROLES.comparator)]
    return setting_key((first if len(first) else same).iloc[0])


def replacement_table(agg: pd.DataFrame, comp: Comparator, model: str,
                      display: str | None = None) -> Table | None:
    """``table_replacement_<model>``: one row per Table 1 row of a block-removal method, in
    table order, grouped by ratio; None when fewer than two strategies were run."""
    rows = main_rows(agg, model)
    rows = rows[rows["method"].map(strategy).notna()]
    if rows["method"].map(strategy).nunique() < 2:
        log.info("replacement table for %s: fewer than two strategies; skipped", model)
        return None
    ours = order_rows(rows).reset_index(drop=True)
    per_block = block_size(ours)
    added = added_parameters(ours, per_block)
    diffs: list[tuple[Diff | None, Diff | None]] = []
    for _, row in ours.iterrows():
        if strategy(row["method"]) == SKIP:
            diffs.append((None, None))
            continue
        base = skip_partner(ours, row)  # None → "not run"
        diffs.append((comp.diff(setting_key(row), base, "log_ppl"),
                      comp.diff(setting_key(row), base, "avg")))
    frame = pd.DataFrame({
        "Strategy": ours["method"].map(strategy).values,
        "Method": ordered_labels(ours).values,
        "Ratio": (ours["ratio"] * 100).values,
        "Achieved": (ours["achieved_ratio"] * 100).values,
        "Blocks": column_or_nan(ours, "blocks_pruned").values,
        "Added (M)": (added / 1e6).values,
        "Trainable (M)": (column_or_nan(ours, "trainable_params") / 1e6).values,
        "Tokens": column_or_nan(ours, "tokens").values,
        "PPL": ours["ppl"].values,
        "Avg": ours["avg"].values,
        "Δ log-PPL vs skip": [d[0].text(3) if d[0] else "–" for d in diffs],
        "Δ Avg vs skip": [d[1].text(1) if d[1] else "–" for d in diffs],
    })
    if (ours["n_seeds"] > 1).any():
        frame["Seeds"] = ours["n_seeds"].values
    kinds = {"Seeds": "int", "Ratio": "pct0", "Achieved": "pct1", "Blocks": "int", "Added (M)": "num3",
             "Trainable (M)": "num3", "Tokens": "si", "PPL": "ppl", "Avg": "num"}
    notes = result_notes(ours) + [
        "Strategy = what the method puts where the removed blocks were (flexigpt.storage.registry: "
        "MethodFacts.replacement). Rows are Table 1's: every row of a ratio at the same "
        "achieved compression, every recovered row (*) with the same tokens and trainable "
        "budget. " + marks_note(ours),
        "Blocks = blocks taken out (a contiguous span for ReplaceMe and LLM-Streamline). "
        "Added = parameters put back in their place: compressed − (dense − Blocks × one "
        "block's parameters" + (f", {per_block / 1e6:.3f} M here" if per_block else "")
        + "); a folded map or shared weights add none, adapters and a trained module do.",
        "Δ vs skip = row − the skip row of the same ratio and stage (recovered vs recovered, "
        "one-shot vs one-shot), paired over the same documents / evaluation windows, 95% "
        "bootstrap interval in brackets; log-PPL in nats (< 0: lower PPL), Avg in points."]
    block = with_errors(Block(f"Replacement strategies: {display_name(model, display)}", frame,
                              kinds, {"PPL": "min", "Avg": "max"}, group="Ratio", notes=notes),
                        ours, {"ppl": "PPL", "avg": "Avg"})
    csv = ours[["method", "variant", "ratio", "stage", "trained", "achieved_ratio"]].assign(
        strategy=frame["Strategy"].values, blocks=frame["Blocks"].values,
        added_params=added.values, trainable_params=column_or_nan(ours, "trainable_params"),
        tokens=column_or_nan(ours, "tokens"), ppl=ours["ppl"], avg=ours["avg"],
        ppl_lo=column_or_nan(ours, "ppl_lo"), ppl_hi=column_or_nan(ours, "ppl_hi"),
        avg_lo=column_or_nan(ours, "avg_lo"), avg_hi=column_or_nan(ours, "avg_hi"),
        **{f"{m}_vs_skip_{part}": [_interval_part(d[i], part) for d in diffs]
           for i, m in enumerate(("log_ppl", "avg")) for part in ("estimate", "low", "high")})
    return Table(f"table_replacement_{slug(model)}",
                 f"Replacement strategies — {display_name(model, display)}", [block], csv)


def _interval_part(diff: Diff | None, part: str) -> float | None:
    """``part`` (estimate, low or high) of a paired difference's interval; None when the
    difference or its interval is missing."""
    if diff is None or diff.interval is None:
        return None
    return getattr(diff.interval, part, None)
