"""Paper Tables 1 and 5 (and the helpers the other tables share) from evaluation rows.

Each builder takes the seed-aggregated frame (:func:`aggregate`), the published numbers
and one model id, and returns a :class:`~flexigpt.tables.render.Table` (or None when the
results hold nothing for it). Our rows come first; the paper's rows follow as a separate
block, labelled with the paper's model. A delta block (ours − paper) is added only for
settings the paper also reports (same model id, method, variant, ratio, stage).
"""

from __future__ import annotations

import logging

import pandas as pd

from flexigpt.tables.collect import SETTING_KEYS, TASKS
from flexigpt.tables.published import PAPER_MODELS, match_published, paper_model
from flexigpt.tables.render import Block, Table

log = logging.getLogger(__name__)

TASK_HEADERS = {"arc_easy": "ARC-e", "arc_challenge": "ARC-c", "piqa": "PIQA",
                "winogrande": "WinoG.", "hellaswag": "HellaS."}
METHOD_LABELS = {"dense": "Dense", "slicegpt": "SliceGPT", "llm_pruner": "LLM-Pruner",
                 "shortgpt": "ShortGPT", "shortgpt_lora": "ShortGPT + LoRA",
                 "flexigpt": "FlexiGPT", "flexigpt_extend": "FlexiGPT extension"}
METHOD_ORDER = list(METHOD_LABELS)
#: FlexiGPT variants that are Table 4 ablations (kept out of Table 1), in the paper's order.
ABLATIONS = {"no_lowrank": "Ablate high-rank prune (no low-rank truncation)",
             "no_outnorm": "Ablate output norm.", "no_svdinit": "Ablate LoRA SVD init.",
             "frobenius": "Frobenius-norm base (Fig. 2c)", "default": "Full method"}
EXTENSION_LABELS = {("dense", "default"): "Base", ("dense", "trained"):
                    "Base trained on the same tokens (control)",
                    ("flexigpt_extend", "block"): "FlexiGPT (Block)",
                    ("flexigpt_extend", "sequential"): "FlexiGPT (Sequential)"}
RECOVERY_NOTE = "* = after recovery training (the evaluated model was trained)."
PAPER_NOTES = {
    1: "Paper: PPL on the MiniPile validation split; * = 1B-token SlimPajama recovery.",
    4: "Paper: LLaMA-2 7B at 30%, 1B-token recovery; PPL on the MiniPile validation split.",
    5: "Paper: 10B SlimPajama tokens; Base = the original TinyLlama (no extra training); "
       "PPL on the MiniPile validation split.",
}
AVG_NOTE = ("† the paper's reported average is not the mean of its five task scores; the "
            "recomputed mean is in the next column (method-flexigpt.md §5, Table 1 caveat).")
_TASK_COLS = [TASK_HEADERS[t] for t in TASKS]


def aggregate(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per setting; adds ``avg`` (mean of the five tasks in %, NaN when a
    task is missing), ``avg_std`` (over seeds) and ``n_seeds``. Per-task metric / limit
    metadata keeps the first file's."""
    df = df.copy()
    df["avg"] = df[list(TASKS)].mean(axis=1).where(df[list(TASKS)].notna().all(axis=1))
    tasks = [c.split(":", 1)[1] for c in df.columns if c.startswith("metric:")]
    numeric = ["num_layers", "params_dense", "params_compressed", "achieved_ratio", "ppl",
               *TASKS, *[t for t in tasks if t not in TASKS], "avg"]
    meta = [c for c in df.columns if ":" in c or c in ("ppl_text", "ppl_seq_len", "trained")]
    groups = df.groupby(list(SETTING_KEYS), dropna=False, sort=False)
    out = groups[numeric].mean()
    out["n_seeds"] = groups.size()
    out["avg_std"] = groups["avg"].std()  # over seeds; NaN for a single seed
    out = out.join(groups[meta].first()).reset_index()
    return out


def main_rows(agg: pd.DataFrame, model: str) -> pd.DataFrame:
    """Table 1 rows of ``model``: final stage; no extension, no dense control, no ablation."""
    ablation = agg["method"].eq("flexigpt") & agg["variant"].isin(set(ABLATIONS) - {"default"})
    return agg[agg["model"].eq(model) & agg["stage"].eq("final")
               & ~agg["method"].eq("flexigpt_extend")
               & ~(agg["method"].eq("dense") & ~agg["variant"].eq("default")) & ~ablation]


def method_label(method: str, variant: str) -> str:
    """Display name: the method's label plus the variant when not "default"."""
    label = METHOD_LABELS.get(method, method)
    return label if variant == "default" else f"{label} [{variant}]"


def _order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    key = df["method"].map(lambda m: rank.get(m, len(rank)))
    return df.assign(_k=key).sort_values(["ratio", "_k", "method", "variant"]).drop(columns="_k")


def _notes(ours: pd.DataFrame) -> list[str]:
    """Footnotes on metrics, PPL text and eval limits, taken from the result files."""
    metrics = []
    for task in TASKS:
        col = f"metric:{task}"
        if col in ours and ours[col].notna().any():
            metrics.append(f"{TASK_HEADERS[task]} {'/'.join(sorted(set(ours[col].dropna())))}")
    notes = [f"Accuracies in % (0-shot; {', '.join(metrics) or 'no tasks'}); Avg = mean of the "
             "five tasks (– when one is missing)."]
    texts = sorted({f"{t} (seq_len {int(s)})" for t, s in zip(ours["ppl_text"], ours["ppl_seq_len"])
                    if isinstance(t, str) and t and not pd.isna(s)})
    if texts:
        notes.append(f"PPL on {', '.join(texts)}.")
    limits = sorted({int(v) for t in TASKS for v in ours.get(f"limit:{t}", pd.Series()).dropna()})
    if limits:
        notes.append(f"Tasks scored on at most {'/'.join(map(str, limits))} documents each "
                     "(lm-eval limit).")
    if (ours["n_seeds"] > 1).any():
        notes.append("Rows with Seeds > 1 are means over seeds.")
    return notes


def metric_frame(rows: pd.DataFrame, label: pd.Series, extra: dict[str, pd.Series]) -> pd.DataFrame:
    frame = pd.DataFrame({"Method": label.values, **{k: v.values for k, v in extra.items()}})
    frame["PPL"] = rows["ppl"].values
    for task in TASKS:
        frame[TASK_HEADERS[task]] = rows[task].values
    return frame


METRIC_KINDS = {"PPL": "ppl", **{c: "num" for c in _TASK_COLS}, "Avg": "num"}
METRIC_BEST = {"PPL": "min", **{c: "max" for c in _TASK_COLS}, "Avg": "max"}


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


def _deltas(ours: pd.DataFrame, pub: pd.DataFrame, tables: tuple[int, ...], model: str,
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


def _csv(ours: pd.DataFrame, label: pd.Series, deltas: pd.DataFrame, pub_rows: pd.DataFrame,
         keep: list[str]) -> pd.DataFrame:
    mine = ours[["model", "method", "variant", "ratio", "stage", *keep]].assign(
        source="ours", label=label.values).join(deltas)
    theirs = pub_rows.assign(source="paper")
    cols = ["source", "label", "model", "method", "variant", "ratio", "stage", *keep,
            "avg_recomputed", "citation", *deltas.columns]
    return pd.concat([mine, theirs], ignore_index=True).reindex(columns=cols)


def table1(agg: pd.DataFrame, pub: pd.DataFrame, model: str) -> Table | None:
    """Main results (paper Table 1 layout) for ``model``: final stage, one row per method ×
    ratio × non-ablation variant, with achieved ratio and layer count."""
    rows = main_rows(agg, model)
    if not (rows["method"] != "dense").any():
        log.info("table 1 for %s: no compressed results; skipped", model)
        return None
    ours = _order(rows).reset_index(drop=True)
    label = pd.Series([method_label(m, v) + ("*" if t else "")
                       for m, v, t in zip(ours["method"], ours["variant"], ours["trained"])])
    frame = metric_frame(ours, label, {"Ratio": ours["ratio"] * 100,
                                       "Achieved": ours["achieved_ratio"] * 100,
                                       "Layers": ours["num_layers"]})
    frame["Avg"] = ours["avg"].values
    kinds = {"Ratio": "pct0", "Achieved": "pct1", "Layers": "int", **METRIC_KINDS}
    if (ours["n_seeds"] > 1).any():
        frame["Seeds"], kinds["Seeds"] = ours["n_seeds"].values, "int"
    notes = _notes(ours) + ["Ratio = target; Achieved = 1 − params(compressed)/params(dense), "
                            "embeddings included. " + RECOVERY_NOTE +
                            " Best per column within each ratio group in bold."]
    blocks = [Block(f"Ours: {model}", frame, kinds, dict(METRIC_BEST), group="Ratio", notes=notes)]
    tables = (1, 2, 3)
    key, same = reference_model(model, pub, tables, "llama-2-7b")
    shown = tuple(t for t in tables if pub[pub["table"].eq(t) & pub["model"].eq(key)].shape[0])
    blocks.append(paper_block(pub, shown, key, paper_title(key, shown, same), PAPER_NOTES[1]))
    deltas, delta_block = _deltas(ours, pub, tables, model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    keep = ["achieved_ratio", "num_layers", "ppl", *TASKS, "avg", "avg_std", "n_seeds"]
    csv = _csv(ours, label, deltas, pub[pub["table"].isin(shown) & pub["model"].eq(key)], keep)
    return Table(f"table1_{slug(model)}", f"Table 1 — compression results, {model}", blocks, csv)


def table5(agg: pd.DataFrame, pub: pd.DataFrame, model: str) -> Table | None:
    """Model extension: base, base trained on the same tokens (control), extended variants."""
    rows = agg[agg["model"].eq(model) & agg["stage"].eq("final")
               & (agg["method"].eq("flexigpt_extend")
                  | (agg["method"].eq("dense") & agg["variant"].isin(["default", "trained"])))]
    if not (rows["method"].eq("flexigpt_extend") | rows["variant"].eq("trained")).any():
        log.info("table 5 for %s: no extension results; skipped", model)
        return None
    order = {k: i for i, k in enumerate(EXTENSION_LABELS)}
    ours = rows.assign(_k=[order.get((m, v), len(order))
                           for m, v in zip(rows["method"], rows["variant"])])
    ours = ours.sort_values(["_k", "variant"]).drop(columns="_k").reset_index(drop=True)
    label = pd.Series([EXTENSION_LABELS.get((m, v), method_label(m, v))
                       for m, v in zip(ours["method"], ours["variant"])])
    frame = metric_frame(ours, label, {"Layers": ours["num_layers"],
                                       "Params (M)": ours["params_compressed"] / 1e6})
    frame["Avg"] = ours["avg"].values
    kinds = {"Layers": "int", "Params (M)": "num", **METRIC_KINDS}
    notes = _notes(ours) + ["The control (base trained on the same tokens) is not in the paper. "
                            "Best per column in bold."]
    blocks = [Block(f"Ours: {model}, extension", frame, kinds, dict(METRIC_BEST), notes=notes)]
    key, same = reference_model(model, pub, (5,), "tinyllama-1.1b")
    blocks.append(paper_block(pub, (5,), key, paper_title(key, (5,), same), PAPER_NOTES[5],
                              extra=("Layers",)))
    deltas, delta_block = _deltas(ours, pub, (5,), model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    keep = ["num_layers", "params_compressed", "ppl", *TASKS, "avg", "n_seeds"]
    csv = _csv(ours, label, deltas, pub[pub["table"].eq(5) & pub["model"].eq(key)], keep)
    return Table(f"table5_extension_{slug(model)}", f"Table 5 — model extension, {model}",
                 blocks, csv)


def slug(name: str) -> str:
    """A file-name-safe form of a model id or path."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in str(name))
