"""Paper Tables 1 and 5, the paper-protocol and KD tables (and the helpers the other tables
share) from evaluation rows.

Each builder takes the seed-aggregated frame (:func:`aggregate`), the published numbers
and one model id (plus an optional display name for titles), and returns a
:class:`~flexigpt.tables.render.Table` (or None when the results hold nothing for it).
Rows are assigned to tables by their ``table`` column (``labels.table`` of the result file,
else :func:`~flexigpt.tables.collect.classify`). Our rows come first; the paper's rows follow
as a separate block, labelled with the paper's model. A delta block (ours − paper) is added
only for settings the paper also reports (same model id, method, variant, ratio, stage).
"""

from __future__ import annotations

import logging

import pandas as pd

from flexigpt.registry import METHODS
from flexigpt.tables.collect import RECOVERY_COLUMNS, SETTING_KEYS, TASKS, classify
from flexigpt.tables.intervals import CI_COLUMNS, with_errors
from flexigpt.tables.published import PAPER_MODELS, match_published, paper_model
from flexigpt.tables.render import Block, Table, sci

log = logging.getLogger(__name__)

TASK_HEADERS = {"arc_easy": "ARC-e", "arc_challenge": "ARC-c", "piqa": "PIQA",
                "winogrande": "WinoG.", "hellaswag": "HellaS."}
METHOD_LABELS = {name: facts.label for name, facts in METHODS.items()}  # table order
METHOD_ORDER = list(METHOD_LABELS)
#: FlexiGPT variants that are Table 4 ablations (kept out of Table 1), in the paper's order.
ABLATIONS = {"no_lowrank": "Ablate high-rank prune (no low-rank truncation)",
             "no_outnorm": "Ablate output norm.", "no_svdinit": "Ablate LoRA SVD init.",
             "frobenius": "Frobenius-norm base (Fig. 2c)", "default": "Full method"}
#: Display names of non-default variants (others: "<Method> [<variant>]").
VARIANT_LABELS = {("flexigpt", "lora_all"): "FlexiGPT + LoRA on unpruned blocks",
                  ("slicegpt", "rft"): "SliceGPT + RFT",
                  ("llm_pruner", "lora"): "LLM-Pruner + LoRA"}
EXTENSION_LABELS = {("dense", "default"): "Base", ("dense", "trained"):
                    "Base trained on the same tokens (control)",
                    ("dense", "trained_lora"):
                    "Base + LoRA with the extension's trainable count (control)",
                    ("flexigpt_extend", "block"): "FlexiGPT (Block)",
                    ("flexigpt_extend", "sequential"): "FlexiGPT (Sequential)"}
RECOVERY_NOTE = "* = after recovery training (the evaluated model was trained)."
ONE_SHOT_NOTE = "(one-shot) = evaluated right after compression, never trained."
#: Methods that remove whole blocks (their achieved ratio / blocks gives the block step).
DEPTH_METHODS = ("shortgpt", "shortgpt_lora")
#: Columns of the matched / paper-protocol tables that are left out when every row lacks them.
_OPTIONAL = ("Blocks", "Trainable (M)", "Tokens", "LR")
COST_KINDS = {"Ratio": "pct0", "Achieved": "pct1", "Blocks": "int", "Layers": "int",
              "Trainable (M)": "num", "Tokens": "si", "LR": "text", "Seeds": "int"}
PAPER_NOTES = {
    1: "Paper: PPL on the MiniPile validation split; * = 1B-token SlimPajama recovery.",
    4: "Paper: LLaMA-2 7B at 30%, 1B-token recovery; PPL on the MiniPile validation split.",
    5: "Paper: 10B SlimPajama tokens; Base = the original TinyLlama (no extra training); "
       "PPL on the MiniPile validation split.",
}
AVG_NOTE = ("† the paper's reported average is not the mean of its five task scores; the "
            "recomputed mean is in the next column (docs/method-flexigpt.md §5 in the repository, Table 1 caveat).")
_TASK_COLS = [TASK_HEADERS[t] for t in TASKS]
#: metric column of the frame → displayed header (for the ± half-widths).
METRIC_HEADERS = {"ppl": "PPL", **TASK_HEADERS, "avg": "Avg"}
#: Table 1 column from the recovery curves (flexigpt.tables.curves.add_reach), by the
#: metric its curves were compared in (tune-split PPL; training loss for older logs).
REACH_COLS = {"ppl": "Tokens to SG+LoRA PPL", "loss": "Tokens to SG+LoRA loss"}


def aggregate(df: pd.DataFrame) -> pd.DataFrame:
    """Mean over seeds per setting; adds ``avg`` (mean of the five tasks in %, NaN when a
    task is missing), ``avg_std`` (over seeds) and ``n_seeds``. Per-task metric / limit
    metadata keeps the first file's."""
    df = df.copy()
    df["avg"] = df[list(TASKS)].mean(axis=1).where(df[list(TASKS)].notna().all(axis=1))
    tasks = [c.split(":", 1)[1] for c in df.columns if c.startswith("metric:")]
    numeric = ["num_layers", "params_dense", "params_compressed", "achieved_ratio", "ppl",
               *TASKS, *[t for t in tasks if t not in TASKS], "avg"]
    meta = [c for c in df.columns if ":" in c or c in ("ppl_text", "ppl_seq_len", "trained")
            or c in RECOVERY_COLUMNS]
    groups = df.groupby(list(SETTING_KEYS), dropna=False, sort=False)
    out = groups[numeric].mean()
    out["n_seeds"] = groups.size()
    out["avg_std"] = groups["avg"].std()  # over seeds; NaN for a single seed
    out = out.join(groups[meta].first()).reset_index()
    return out


def table_of(agg: pd.DataFrame) -> pd.Series:
    """Each row's table: the ``table`` column, else :func:`classify` (older frames)."""
    fallback = pd.Series([classify(m, v) for m, v in zip(agg["method"], agg["variant"])],
                         index=agg.index, dtype=object)
    return agg["table"].where(agg["table"].notna(), fallback) if "table" in agg else fallback


def _dense_default(agg: pd.DataFrame) -> pd.Series:
    return agg["method"].eq("dense") & agg["variant"].eq("default")


def table_rows(agg: pd.DataFrame, model: str, table: str, dense: bool = True) -> pd.DataFrame:
    """Final-stage rows of ``model`` in ``table`` (never a dense control), plus the dense
    reference (dense/default) when ``dense``."""
    ours = agg["model"].eq(model) & agg["stage"].eq("final")
    pick = table_of(agg).eq(table) & ~agg["method"].eq("dense")
    return agg[ours & (pick | (_dense_default(agg) if dense else False))]


def main_rows(agg: pd.DataFrame, model: str) -> pd.DataFrame:
    """Table 1 rows of ``model``: final stage, table "main" and the dense reference; no
    extension, dense control, ablation, paper-protocol or KD row."""
    return table_rows(agg, model, "main")


def method_label(method: str, variant: str) -> str:
    """Display name: the method's label plus the variant when not "default" (named variants
    from :data:`VARIANT_LABELS`; ``paper`` → "(paper protocol)", ``*kd`` → "(KD)")."""
    label = METHOD_LABELS.get(method, method)
    if (method, variant) in VARIANT_LABELS:
        return VARIANT_LABELS[(method, variant)]
    if variant == "default":
        return label
    if variant == "paper":
        return f"{label} (paper protocol)"
    if variant == "kd" or variant.endswith("_kd"):
        return f"{method_label(method, lm_variant(variant))} (KD)"
    return f"{label} [{variant}]"


def lm_variant(variant: str) -> str:
    """The LM-loss counterpart of a KD variant: ``kd`` → ``default``, ``rft_kd`` → ``rft``."""
    if variant == "kd":
        return "default"
    return variant[:-3] if variant.endswith("_kd") else variant


def row_label(method: str, variant: str, trained: bool, shown: str | None = None) -> str:
    """``shown`` (default :func:`method_label`) + "*" when trained, + " (one-shot)" when a
    compressed model was never trained; the dense model is never marked."""
    text = shown if shown is not None else method_label(method, variant)
    if method == "dense" and not trained:
        return text
    return text + ("*" if trained else " (one-shot)")


def display_name(model: str, display: str | None) -> str:
    return display if display else model


def _order(df: pd.DataFrame) -> pd.DataFrame:
    rank = {m: i for i, m in enumerate(METHOD_ORDER)}
    key = df["method"].map(lambda m: rank.get(m, len(rank)))
    return df.assign(_k=key).sort_values(["ratio", "_k", "method", "variant"]).drop(columns="_k")


def _num(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def block_step(agg: pd.DataFrame, model: str) -> float | None:
    """Points of the parameter ratio one block is worth for ``model``: the median of
    ``achieved_ratio / blocks`` over its ShortGPT(+LoRA) rows (blocks = ``blocks_pruned``,
    else dense layers − layers), or None without such rows."""
    rows = agg[agg["model"].eq(model) & agg["method"].isin(DEPTH_METHODS)]
    dense = agg[agg["model"].eq(model) & agg["method"].eq("dense")]["num_layers"].dropna()
    steps = []
    for _, r in rows.iterrows():
        blocks = _num(r.get("blocks_pruned"))
        if blocks is None and len(dense):
            blocks = float(dense.iloc[0]) - float(r["num_layers"])
        achieved = _num(r["achieved_ratio"])
        if blocks and blocks > 0 and achieved is not None:
            steps.append(100.0 * achieved / blocks)
    return float(pd.Series(steps).median()) if steps else None


def _lr_text(lr, gamma) -> str | None:
    if _num(lr) is None:
        return None
    return sci(float(lr)) + (f" (γ {sci(float(gamma))})" if _num(gamma) is not None else "")


def _col(ours: pd.DataFrame, col: str) -> pd.Series:
    return ours[col] if col in ours else pd.Series(float("nan"), index=ours.index)


def cost_frame(ours: pd.DataFrame, label: pd.Series, layers: bool = False) -> tuple[
        pd.DataFrame, dict[str, str]]:
    """Method, Ratio, Achieved, Blocks, Trainable (M), Tokens, LR, metrics, Avg (+ Seeds).

    Optional columns every row lacks are left out; without any ``blocks_pruned`` (older
    files) the layer count stands in for Blocks, as before, when ``layers``."""
    blocks = _col(ours, "blocks_pruned")
    extra = {"Ratio": ours["ratio"] * 100, "Achieved": ours["achieved_ratio"] * 100}
    if blocks.notna().any() or not layers:
        extra["Blocks"] = blocks
    else:
        extra["Layers"] = ours["num_layers"]
    extra["Trainable (M)"] = _col(ours, "trainable_params") / 1e6
    extra["Tokens"] = _col(ours, "tokens")
    extra["LR"] = pd.Series([_lr_text(a, b) for a, b in zip(_col(ours, "lr"),
                                                           _col(ours, "gamma_lr"))],
                            index=ours.index, dtype=object)
    frame = metric_frame(ours, label, extra)
    frame["Avg"] = ours["avg"].values
    kinds = {**COST_KINDS, **METRIC_KINDS}
    if (ours["n_seeds"] > 1).any():
        frame["Seeds"] = ours["n_seeds"].values
    drop = [c for c in _OPTIONAL if c in frame and frame[c].isna().all()]
    return frame.drop(columns=drop), kinds


def _cost_notes(frame: pd.DataFrame, ours: pd.DataFrame) -> list[str]:
    """What Blocks / Trainable / Tokens / LR mean, for the columns shown."""
    parts = []
    if "Blocks" in frame:
        parts.append("Blocks = transformer blocks removed (ShortGPT) or replaced (FlexiGPT); "
                     "– for width methods (SliceGPT, LLM-Pruner) and the dense model.")
    if "Trainable (M)" in frame:
        parts.append("Trainable = parameters trained in recovery (millions).")
    if "Tokens" in frame:
        parts.append("Tokens = recovery training tokens.")
    if "LR" in frame:
        parts.append("LR = the recovery learning rate, chosen on the tuning split by the run's "
                     "LR sweep unless the CSV's lr_source says otherwise; γ = the learning rate "
                     "of FlexiGPT's output-norm gains.")
    notes = [" ".join(parts)] if parts else []
    budget = ours[_col(ours, "budget_target").notna()]
    if len(budget):
        err = budget["budget_rel_error"].abs().max()
        labels = ", ".join(dict.fromkeys(method_label(m, v) for m, v in zip(
            budget["method"], budget["variant"])))
        notes.append(f"Trainable counts matched to a parameter budget ({labels}): largest "
                     f"|relative error| {100 * err:.2f}%.")
    return notes


def _marks_note(ours: pd.DataFrame) -> str:
    compressed = ours[~ours["method"].eq("dense")]
    marks = []
    if ours["trained"].astype(bool).any():
        marks.append(RECOVERY_NOTE)
    if (~compressed["trained"].astype(bool)).any():
        marks.append(ONE_SHOT_NOTE)
    return " ".join(marks)


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
    mine = ours.reindex(columns=["model", "method", "variant", "ratio", "stage", *keep]).assign(
        source="ours", label=label.values).join(deltas)
    theirs = pub_rows.assign(source="paper")
    cols = ["source", "label", "model", "method", "variant", "ratio", "stage", *keep,
            "avg_recomputed", "citation", *deltas.columns]
    return pd.concat([mine, theirs], ignore_index=True).reindex(columns=cols)


def _ordered_labels(ours: pd.DataFrame, base: bool = False) -> pd.Series:
    """Row labels with the trained / one-shot marks; ``base``: the method's label for the
    variant it stands in for (paper → default, ``*_kd`` → its LM variant)."""
    def shown(m: str, v: str) -> str | None:
        if not base:
            return None
        return method_label(m, "default" if v == "paper" else lm_variant(v))
    return pd.Series([row_label(m, v, bool(t), shown(m, v))
                      for m, v, t in zip(ours["method"], ours["variant"], ours["trained"])])


def _block_rule_note(agg: pd.DataFrame, model: str, ours: pd.DataFrame) -> str | None:
    """The block step of ``model`` and, for the matched protocol, the shared rule."""
    step = block_step(agg, model)
    parts = []
    if step is not None:
        parts.append(f"One block of this model ≈ {step:.2f} points of the parameter ratio "
                     "(from the ShortGPT rows: achieved ratio / blocks removed).")
    labelled = _col(ours, "labels_table").notna() | _col(ours, "protocol").eq("matched")
    if labelled.any():
        parts.append("All rows of one ratio target the same achieved compression; FlexiGPT and "
                     "its like-for-like baselines (ShortGPT, ShortGPT + LoRA) share the "
                     "block-count rule (flexigpt/block_count.py, policy 'matched'): each "
                     "baseline targets the achieved ratio of the FlexiGPT model it is compared "
                     "with, so they land within half a block step of it.")
    return " ".join(parts) or None


def table1(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
           display: str | None = None) -> Table | None:
    """Main results (paper Table 1 layout) for ``model``: final stage, one row per method ×
    ratio × variant of table "main" (every method at the same achieved compression), with
    achieved ratio, blocks, recovery cost and chosen LR."""
    name = display_name(model, display)
    rows = main_rows(agg, model)
    if not (rows["method"] != "dense").any():
        log.info("table 1 for %s: no compressed results; skipped", model)
        return None
    ours = _order(rows).reset_index(drop=True)
    label = _ordered_labels(ours)
    frame, kinds = cost_frame(ours, label, layers=True)
    notes = _notes(ours) + ["Ratio = target; Achieved = 1 − params(compressed)/params(dense), "
                            "embeddings included. " + _marks_note(ours) +
                            " Best per column within each ratio group in bold."]
    notes += _cost_notes(frame, ours)
    rule = _block_rule_note(agg, model, ours)
    notes += [rule] if rule else []
    if "tokens_to_baseline" in ours and ours["tokens_to_baseline"].notna().any():
        header, cells, reach_notes = _reach_column(ours)
        frame.insert(frame.columns.get_loc("LR") + 1 if "LR" in frame else len(frame.columns),
                     header, cells)
        notes += reach_notes
    blocks = [with_errors(Block(f"Ours: {name}", frame, kinds, dict(METRIC_BEST), group="Ratio",
                                notes=notes), ours, METRIC_HEADERS)]
    tables = (1, 2, 3)
    key, same = reference_model(model, pub, tables, "llama-2-7b")
    shown = tuple(t for t in tables if pub[pub["table"].eq(t) & pub["model"].eq(key)].shape[0])
    blocks.append(paper_block(pub, shown, key, paper_title(key, shown, same), PAPER_NOTES[1]))
    deltas, delta_block = _deltas(ours, pub, tables, model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    csv = _csv(ours, label, deltas, pub[pub["table"].isin(shown) & pub["model"].eq(key)],
               _CSV_KEEP)
    return Table(f"table1_{slug(model)}", f"Table 1 — compression results, {name}", blocks, csv)


def _reach_column(ours: pd.DataFrame) -> tuple[str, list[str | None], list[str]]:
    """Header, cells and notes of Table 1's "tokens to reach" column: one metric's header
    when every cell used it (tune PPL, or training loss for older logs), else the PPL header
    with "(loss)" after the cells read from the training loss."""
    from flexigpt.tables.curves import LOSS, PPL, REACH_NOTE, REACH_NOTE_PPL

    metric = _col(ours, "tokens_to_baseline_metric").fillna(LOSS)
    cells = ours["tokens_to_baseline"]
    used = set(metric[cells.notna()])
    note = {PPL: REACH_NOTE_PPL, LOSS: REACH_NOTE}
    if len(used) == 1:
        (only,) = used
        return REACH_COLS[only], list(cells.values), [note[only]]
    marked = [None if pd.isna(c) else c + (" (loss)" if m == LOSS else "")
              for c, m in zip(cells, metric)]
    return REACH_COLS[PPL], marked, [note[PPL], note[LOSS]]


_CSV_KEEP = ["achieved_ratio", "num_layers", "blocks_pruned", "trained", "loss", "table",
             "protocol", "recipe", "trainable_params", "tokens", "lr", "gamma_lr", "lr_source",
             "budget_target", "budget_achieved", "budget_rel_error", "budget_source", "ppl",
             *TASKS, "avg", "avg_std", "n_seeds", "tokens_to_baseline", "tokens_to_baseline_metric",
             *CI_COLUMNS]


def paper_protocol_table(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
                         display: str | None = None) -> Table | None:
    """FlexiGPT / ShortGPT / ShortGPT + LoRA with the same number of removed blocks,
    int(ratio·L), as the paper did (table "paper_protocol"), plus the dense model."""
    name = display_name(model, display)
    rows = table_rows(agg, model, "paper_protocol")
    if not (rows["method"] != "dense").any():
        log.info("paper-protocol table for %s: no paper-protocol results; skipped", model)
        return None
    ours = _order(rows).reset_index(drop=True)
    label = _ordered_labels(ours, base=True)
    frame, kinds = cost_frame(ours, label)
    dense_layers = ours.loc[ours["method"].eq("dense"), "num_layers"].dropna()
    n_blocks = f" (L = {int(dense_layers.iloc[0])} here)" if len(dense_layers) else ""
    notes = _notes(ours) + [
        "Paper protocol: FlexiGPT, ShortGPT and ShortGPT + LoRA each remove/replace the same "
        f"number of blocks, int(ratio·L){n_blocks}, as the paper did, so their achieved ratios "
        "differ (Achieved); Table 1 compares every method at the same achieved compression "
        "instead.",
        "Ratio = target; Achieved = 1 − params(compressed)/params(dense), embeddings included. "
        + _marks_note(ours) + " Best per column within each ratio group in bold."]
    notes += _cost_notes(frame, ours)
    step = block_step(agg, model)
    if step is not None:
        notes.append(f"One block of this model ≈ {step:.2f} points of the parameter ratio.")
    blocks = [with_errors(Block(f"Ours: {name}, paper protocol", frame, kinds,
                                dict(METRIC_BEST), group="Ratio", notes=notes), ours,
                          METRIC_HEADERS)]
    tables = (1, 2, 3)
    key, same = reference_model(model, pub, tables, "llama-2-7b")
    shown = tuple(t for t in tables if pub[pub["table"].eq(t) & pub["model"].eq(key)].shape[0])
    blocks.append(paper_block(pub, shown, key, paper_title(key, shown, same), PAPER_NOTES[1]))
    # The paper's rows are its protocol: compare our "paper" variant with its default rows.
    as_paper = ours.assign(variant=ours["variant"].replace({"paper": "default"}))
    deltas, delta_block = _deltas(as_paper, pub, tables, model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    csv = _csv(ours, label, deltas, pub[pub["table"].isin(shown) & pub["model"].eq(key)],
               _CSV_KEEP)
    return Table(f"table1_paper_protocol_{slug(model)}",
                 f"Table 1 (paper protocol) — same number of removed blocks, {name}", blocks, csv)


def _loss_of(row: pd.Series) -> str | None:
    loss = row.get("loss")
    if isinstance(loss, str) and loss:
        return loss
    table = row.get("table")
    if (table if isinstance(table, str) else classify(row["method"], row["variant"])) == "kd":
        return "kd"
    return "lm" if bool(row["trained"]) else None


def kd_table(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
             display: str | None = None) -> Table | None:
    """Recovery with the knowledge-distillation loss (table "kd"), each row right after the
    same method's LM-loss row (same method, LM variant and ratio)."""
    del pub  # the paper has no KD rows
    name = display_name(model, display)
    kd = table_rows(agg, model, "kd", dense=False)
    if kd.empty:
        log.info("KD table for %s: no KD results; skipped", model)
        return None
    final = agg[agg["model"].eq(model) & agg["stage"].eq("final") & ~table_of(agg).eq("kd")]
    picked, missing = [], []
    for _, row in _order(kd).iterrows():
        lm = final[final["method"].eq(row["method"]) & final["variant"].eq(
            lm_variant(row["variant"])) & (final["ratio"] - row["ratio"]).abs().lt(1e-9)]
        if len(lm):
            picked.append(lm.iloc[0])
        else:
            missing.append(method_label(row["method"], row["variant"]))
        picked.append(row)
    ours = pd.DataFrame(picked).reset_index(drop=True).infer_objects()
    label = pd.Series([row_label(m, v, bool(t), method_label(m, lm_variant(v)))
                       for m, v, t in zip(ours["method"], ours["variant"], ours["trained"])])
    loss = pd.Series([(_loss_of(r) or "").upper() or None for _, r in ours.iterrows()],
                     dtype=object)
    frame, kinds = cost_frame(ours, label)
    frame = frame.drop(columns=[c for c in ("Blocks", "LR") if c in frame])
    frame.insert(2, "Loss", loss.values)
    notes = _notes(ours) + [
        "Each KD row follows the LM-loss row of the same method, variant and ratio (same "
        "compression, recovery recipe and token budget): LM = next-token loss, KD = "
        "knowledge-distillation loss. " + _marks_note(ours) +
        " Best per column within each ratio group in bold."]
    notes += _cost_notes(frame, ours)
    if missing:
        notes.append(f"No LM-loss counterpart in the results for: {', '.join(missing)}.")
    blocks = [with_errors(Block(f"Ours: {name}, LM vs KD recovery loss", frame, kinds,
                                dict(METRIC_BEST), group="Ratio", notes=notes), ours,
                          METRIC_HEADERS)]
    keep = [c for c in _CSV_KEEP if c != "loss"]
    csv = ours.reindex(columns=["model", "method", "variant", "ratio", "stage", *keep]).assign(
        source="ours", label=label.values, loss=[_loss_of(r) for _, r in ours.iterrows()])
    front = ["source", "label", "model", "method", "variant", "ratio", "stage", "loss"]
    csv = csv[front + [c for c in csv.columns if c not in front]]
    return Table(f"table_kd_{slug(model)}", f"Recovery loss — LM vs knowledge distillation, "
                 f"{name}", blocks, csv)


#: Dense variants that belong to Table 5 (the base and its trained controls).
_EXT_DENSE = ("default", "trained", "trained_lora")


def table5(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
           display: str | None = None) -> Table | None:
    """Model extension: base, the controls (base trained on the same tokens; base + LoRA with
    the extension's trainable count), extended variants."""
    name = display_name(model, display)
    ext = table_of(agg).eq("extension")
    rows = agg[agg["model"].eq(model) & agg["stage"].eq("final")
               & ((ext & ~agg["method"].eq("dense"))
                  | (agg["method"].eq("dense") & agg["variant"].isin(_EXT_DENSE)))]
    controls = rows["method"].eq("dense") & ~rows["variant"].eq("default")
    if not (rows["method"].eq("flexigpt_extend") | controls).any():
        log.info("table 5 for %s: no extension results; skipped", model)
        return None
    order = {k: i for i, k in enumerate(EXTENSION_LABELS)}
    ours = rows.assign(_k=[order.get((m, v), len(order))
                           for m, v in zip(rows["method"], rows["variant"])])
    ours = ours.sort_values(["_k", "variant"]).drop(columns="_k").reset_index(drop=True)
    label = pd.Series([EXTENSION_LABELS.get((m, v), method_label(m, v))
                       for m, v in zip(ours["method"], ours["variant"])])
    extra = {"Layers": ours["num_layers"], "Params (M)": ours["params_compressed"] / 1e6}
    trainable = _col(ours, "trainable_params") / 1e6
    if trainable.notna().any():
        extra["Trainable (M)"] = trainable
    frame = metric_frame(ours, label, extra)
    frame["Avg"] = ours["avg"].values
    kinds = {"Layers": "int", "Params (M)": "num", "Trainable (M)": "num", **METRIC_KINDS}
    if ours["variant"].eq("trained_lora").any():
        control = ("The controls (the base trained on the same tokens: all weights, or LoRA "
                   "with the extension's trainable count) are not in the paper.")
    else:
        control = "The control (base trained on the same tokens) is not in the paper."
    notes = _notes(ours) + [control + " Best per column in bold."]
    if "Trainable (M)" in frame:
        notes.append("Trainable = parameters trained in recovery / continued training "
                     "(millions; – = not trained).")
    blocks = [with_errors(Block(f"Ours: {name}, extension", frame, kinds, dict(METRIC_BEST),
                                notes=notes), ours, METRIC_HEADERS)]
    key, same = reference_model(model, pub, (5,), "tinyllama-1.1b")
    blocks.append(paper_block(pub, (5,), key, paper_title(key, (5,), same), PAPER_NOTES[5],
                              extra=("Layers",)))
    deltas, delta_block = _deltas(ours, pub, (5,), model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    keep = ["num_layers", "params_compressed", "trained", "recipe", "trainable_params", "tokens",
            "lr", "ppl", *TASKS, "avg", "n_seeds", *CI_COLUMNS]
    csv = _csv(ours, label, deltas, pub[pub["table"].eq(5) & pub["model"].eq(key)], keep)
    return Table(f"table5_extension_{slug(model)}", f"Table 5 — model extension, {name}",
                 blocks, csv)


def slug(name: str) -> str:
    """A file-name-safe form of a model id or path."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in str(name))
