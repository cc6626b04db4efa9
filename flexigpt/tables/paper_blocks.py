"""The paper's rows beside ours: the paper block of a table, the ours − paper delta block,
which paper model a table cites, and the combined ours + paper CSV."""

from __future__ import annotations

import pandas as pd

from flexigpt.tables.columns import METRIC_BEST, METRIC_KINDS, metric_frame
from flexigpt.tables.labels import TASK_HEADERS
from flexigpt.tables.published import PAPER_MODELS, match_published, paper_model
from flexigpt.tables.render import Block

PAPER_NOTES = {
    1: "Paper: PPL on the MiniPile validation split; * = 1B-token SlimPajama recovery.",
    4: "Paper: LLaMA-2 7B at 30%, 1B-token recovery; PPL on the MiniPile validation split.",
    5: "Paper: 10B SlimPajama tokens; Base = the original TinyLlama (no extra training); "
       "PPL on the MiniPile validation split.",
}
AVG_NOTE = ("† the paper's reported average is not the mean of its five task scores; the "
            "recomputed mean is in the next column (docs/method-flexigpt.md §5 in the "
            "repository, Table 1 caveat).")


def paper_block(pub: pd.DataFrame, tables: tuple[int, ...], model: str, title: str,
                note: str, extra: tuple[str, ...] = ("Ratio",)) -> Block:
    """The paper's rows of ``tables`` for ``model`` with reported + recomputed averages."""
    rows = pub[pub["table"].isin(tables) & pub["model"].eq(model)].reset_index(drop=True)
    cols = {"Ratio": rows["ratio"] * 100, "Layers": rows["layers"]}
    frame = metric_frame(rows, rows["label"], {c: cols[c] for c in extra})
    frame["Avg"] = rows["avg"].values
    frame["Avg (recomputed)"] = rows["avg_recomputed"].values
    markers = {(i, "Avg"): "†" for i in rows.index[rows["avg_mismatch"]]}
    kinds = {"Ratio": "pct0", "Layers": "int", **METRIC_KINDS, "Avg (recomputed)": "num"}
    notes = [note] + ([AVG_NOTE] if markers else [])
    return Block(title, frame.dropna(axis=1, how="all"), kinds, dict(METRIC_BEST),
                 group="Ratio" if "Ratio" in extra else None, markers=markers, notes=notes)


def paper_deltas(ours: pd.DataFrame, pub: pd.DataFrame, tables: tuple[int, ...], model: str,
            label: pd.Series) -> tuple[pd.DataFrame, Block | None]:
    """Per-metric ours − paper for settings the paper reports; (csv columns, block)."""
    cols = {"ppl": "PPL", **TASK_HEADERS, "avg": "Avg"}
    deltas = pd.DataFrame(index=ours.index, columns=[f"delta_{c}" for c in cols], dtype=float)
    for i, row in ours.iterrows():
        ref = match_published(pub, tables, model, row["method"], row["variant"], row["ratio"],
                              row["stage"])
        if ref is None:
            continue
        for col in cols:
            paper_value = ref["avg_recomputed"] if col == "avg" else ref[col]
            deltas.at[i, f"delta_{col}"] = row[col] - paper_value
    hit = deltas.notna().any(axis=1)
    if not hit.any():
        return deltas, None
    frame = pd.DataFrame({"Method": label[hit].values, "Ratio": (ours["ratio"][hit] * 100).values,
                          **{f"Δ {h}": deltas.loc[hit, f"delta_{c}"].values
                             for c, h in cols.items()}})
    kinds = {"Ratio": "pct0", **{f"Δ {h}": "delta" for h in cols.values()}}
    note = ("Δ = ours − paper for the same model, method, variant and ratio; Δ Avg is taken "
            "against the paper's recomputed average; Δ PPL compares like with like only when "
            "our PPL text is the paper's (MiniPile validation).")
    return deltas, Block("Δ ours − paper (same setting)", frame, kinds, notes=[note])


def reference_model(model: str, pub: pd.DataFrame, tables: tuple[int, ...],
                    default: str) -> tuple[str, bool]:
    """(paper model id to show, same model?) — our model if the paper has it, else ``default``."""
    key = paper_model(model)
    if key is not None and pub[pub["table"].isin(tables) & pub["model"].eq(key)].shape[0]:
        return key, True
    return default, False


def paper_title(key: str, tables: tuple[int, ...], same: bool) -> str:
    cite = ", ".join(f"Table {t}" for t in tables)
    head = f"Paper ({PAPER_MODELS[key]}): FlexiGPT NAACL 2025, {cite}"
    return head if same else f"{head} — a different model, for reference only (no deltas)"


def ours_and_paper_csv(ours: pd.DataFrame, label: pd.Series, deltas: pd.DataFrame,
                       pub_rows: pd.DataFrame, keep: list[str]) -> pd.DataFrame:
    """Our rows (``keep`` columns, labels, the ``deltas``) then the paper's ``pub_rows``, one
    tidy frame with a ``source`` column (``ours`` | ``paper``)."""
    mine = ours.reindex(columns=["model", "method", "variant", "ratio", "stage", *keep]).assign(
        source="ours", label=label.values).join(deltas)
    theirs = pub_rows.assign(source="paper")
    cols = ["source", "label", "model", "method", "variant", "ratio", "stage", *keep,
            "avg_recomputed", "citation", *deltas.columns]
    return pd.concat([mine, theirs], ignore_index=True).reindex(columns=cols)
