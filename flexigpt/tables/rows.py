"""Row subsets of the seed-aggregated results frame that the tables and figures read.

Rows belong to a table by their ``table`` column (``labels.table`` of the result file, else
:func:`~flexigpt.tables.collect.classify`); :func:`main_rows` are Table 1's.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from flexigpt.storage.registry import METHODS, ROLES
from flexigpt.tables.collect import classify
from flexigpt.tables.labels import METHOD_ORDER

#: Methods that delete whole blocks and add nothing (their achieved ratio / blocks gives the
#: block step): the registry's ``block_count == "remove"``.
DEPTH_METHODS = tuple(name for name, facts in METHODS.items() if facts.block_count == "remove")


def table_of(agg: pd.DataFrame) -> pd.Series:
    """Each row's table: the ``table`` column, else :func:`classify` (older frames)."""
    fallback = pd.Series([classify(m, v) for m, v in zip(agg["method"], agg["variant"])],
                         index=agg.index, dtype=object)
    return agg["table"].where(agg["table"].notna(), fallback) if "table" in agg else fallback


def is_reference(df: pd.DataFrame) -> pd.Series:
    """Which rows of ``df`` are the reference (uncompressed) model's, :attr:`ROLES.reference
    <flexigpt.storage.registry.Roles.reference>` (any variant)."""
    return df["method"].eq(ROLES.reference)


def _dense_default(agg: pd.DataFrame) -> pd.Series:
    return is_reference(agg) & agg["variant"].eq("default")


def table_rows(agg: pd.DataFrame, model: str, table: str, dense: bool = True) -> pd.DataFrame:
    """Final-stage rows of ``model`` in ``table`` (never a dense control), plus the dense
    reference (dense/default) when ``dense``."""
    ours = agg["model"].eq(model) & agg["stage"].eq("final")
    pick = table_of(agg).eq(table) & ~is_reference(agg)
    return agg[ours & (pick | (_dense_default(agg) if dense else False))]


def main_rows(agg: pd.DataFrame, model: str) -> pd.DataFrame:
    """Table 1 rows of ``model``: final stage, table "main" and the dense reference; no
    extension, dense control, ablation, paper-protocol or KD row."""
    return table_rows(agg, model, "main")


def order_rows(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` sorted by ratio, then the methods' table order (:data:`METHOD_ORDER`; unknown
    methods last), method and variant."""
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    key = df["method"].map(lambda m: rank.get(m, len(rank)))
    return df.assign(_k=key).sort_values(["ratio", "_k", "method", "variant"]).drop(columns="_k")


def optional_float(v: Any) -> float | None:
    """``v`` as a float, or None when it is None / NaN."""
    return None if v is None or pd.isna(v) else float(v)


def block_step(agg: pd.DataFrame, model: str) -> float | None:
    """Points of the parameter ratio one block is worth for ``model``: the median of
    ``achieved_ratio / blocks`` over its :data:`DEPTH_METHODS` rows (blocks = ``blocks_pruned``,
    else dense layers − layers), or None without such rows."""
    rows = agg[agg["model"].eq(model) & agg["method"].isin(DEPTH_METHODS)]
    dense = agg[agg["model"].eq(model) & is_reference(agg)]["num_layers"].dropna()
    steps = []
    for _, r in rows.iterrows():
        blocks = optional_float(r.get("blocks_pruned"))
        if blocks is None and len(dense):
            blocks = float(dense.iloc[0]) - float(r["num_layers"])
        achieved = optional_float(r["achieved_ratio"])
        if blocks and blocks > 0 and achieved is not None:
            steps.append(100.0 * achieved / blocks)
    return float(pd.Series(steps).median()) if steps else None


def column_or_nan(ours: pd.DataFrame, col: str) -> pd.Series:
    """Column ``col`` of ``ours``, or an all-NaN series on its index when it has none."""
    return ours[col] if col in ours else pd.Series(float("nan"), index=ours.index)
