"""Paper Tables 1 and 5 and the paper-protocol and KD tables from evaluation rows.

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

from flexigpt.storage.registry import METHODS, ROLES
from flexigpt.tables.collect import RECOVERY_COLUMNS, SETTING_KEYS, TASKS, classify
from flexigpt.tables.columns import (
    METRIC_BEST,
    METRIC_HEADERS,
    METRIC_KINDS,
    cost_frame,
    cost_notes,
    marks_note,
    metric_frame,
    ordered_labels,
    result_notes,
)
from flexigpt.tables.curves import LOSS, PPL, REACH_NOTE, REACH_NOTE_PPL
from flexigpt.tables.facts import ACHIEVED
from flexigpt.tables.labels import (
    EXTENSION_LABELS,
    display_name,
    lm_variant,
    method_label,
    row_label,
    slug,
)
from flexigpt.tables.paper_blocks import (
    PAPER_NOTES,
    ours_and_paper_csv,
    paper_block,
    paper_deltas,
    paper_title,
    reference_model,
)
from flexigpt.tables.render import Block, Table
from flexigpt.tables.row_intervals import CI_COLUMNS, with_errors
from flexigpt.tables.rows import (
    block_step,
    column_or_nan,
    is_reference,
    main_rows,
    order_rows,
    table_of,
    table_rows,
)

log = logging.getLogger(__name__)

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


def _block_rule_note(agg: pd.DataFrame, model: str, ours: pd.DataFrame) -> str | None:
    """The block step of ``model`` and, for the matched protocol, the shared rule."""
    step = block_step(agg, model)
    parts = []
    if step is not None:
        parts.append(f"One block of this model ≈ {step:.2f} points of the parameter ratio "
                     "(from the ShortGPT rows: achieved ratio / blocks removed).")
    labelled = (column_or_nan(ours, "labels_table").notna()
                | column_or_nan(ours, "protocol").eq("matched"))
    if labelled.any():
        subject = METHODS[ROLES.subject].label
        others = ", ".join(METHODS[m].label for m in dict.fromkeys(ours["method"])
                           if METHODS[m].replacement is not None and m != ROLES.subject)
        parts.append(f"All rows of one ratio target the same achieved compression; {subject} "
                     f"and its like-for-like baselines ({others}) share the "
                     "block-count rule (flexigpt/methods/block_count.py, policy 'matched'): each "
                     f"baseline targets the achieved ratio of the {subject} model it is "
                     "compared with, so they land within half a block step of it.")
    return " ".join(parts) or None


def table1(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
           display: str | None = None) -> Table | None:
    """Main results (paper Table 1 layout) for ``model``: final stage, one row per method ×
    ratio × variant of table "main" (every method at the same achieved compression), with
    achieved ratio, blocks, recovery cost and chosen LR."""
    name = display_name(model, display)
    rows = main_rows(agg, model)
    if is_reference(rows).all():
        log.info("table 1 for %s: no compressed results; skipped", model)
        return None
    ours = order_rows(rows).reset_index(drop=True)
    label = ordered_labels(ours)
    frame, kinds = cost_frame(ours, label, layers=True)
    notes = result_notes(ours) + [
        "Ratio = target; Achieved = 1 − params(compressed)/params(dense), embeddings "
        "included. " + marks_note(ours) + " Best per column within each ratio group in bold."]
    notes += cost_notes(frame, ours)
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
    deltas, delta_block = paper_deltas(ours, pub, tables, model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    csv = ours_and_paper_csv(ours, label, deltas,
                             pub[pub["table"].isin(shown) & pub["model"].eq(key)], csv_keep(ours))
    return Table(f"table1_{slug(model)}", f"Table 1 — compression results, {name}", blocks, csv)


def _reach_column(ours: pd.DataFrame) -> tuple[str, list[str | None], list[str]]:
    """Header, cells and notes of Table 1's "tokens to reach" column: one metric's header
    when every cell used it (tune PPL, or training loss for older logs), else the PPL header
    with "(loss)" after the cells read from the training loss."""
    metric = column_or_nan(ours, "tokens_to_baseline_metric").fillna(LOSS)
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


def csv_keep(ours: pd.DataFrame) -> list[str]:
    """:data:`_CSV_KEEP`, with the non-embedding achieved ratio after the achieved ratio where
    the model's facts gave one (:mod:`flexigpt.tables.facts`)."""
    return ["achieved_ratio", *([ACHIEVED] if ACHIEVED in ours else []), *_CSV_KEEP[1:]]


def paper_protocol_table(agg: pd.DataFrame, pub: pd.DataFrame, model: str,
                         display: str | None = None) -> Table | None:
    """FlexiGPT / ShortGPT / ShortGPT + LoRA with the same number of removed blocks,
    int(ratio·L), as the paper did (table "paper_protocol"), plus the dense model."""
    name = display_name(model, display)
    rows = table_rows(agg, model, "paper_protocol")
    if is_reference(rows).all():
        log.info("paper-protocol table for %s: no paper-protocol results; skipped", model)
        return None
    ours = order_rows(rows).reset_index(drop=True)
    label = ordered_labels(ours, base=True)
    frame, kinds = cost_frame(ours, label)
    dense_layers = ours.loc[is_reference(ours), "num_layers"].dropna()
    n_blocks = f" (L = {int(dense_layers.iloc[0])} here)" if len(dense_layers) else ""
    notes = result_notes(ours) + [
        "Paper protocol: FlexiGPT, ShortGPT and ShortGPT + LoRA each remove/replace the same "
        f"number of blocks, int(ratio·L){n_blocks}, as the paper did, so their achieved ratios "
        "differ (Achieved); Table 1 compares every method at the same achieved compression "
        "instead.",
        "Ratio = target; Achieved = 1 − params(compressed)/params(dense), embeddings included. "
        + marks_note(ours) + " Best per column within each ratio group in bold."]
    notes += cost_notes(frame, ours)
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
    deltas, delta_block = paper_deltas(as_paper, pub, tables, model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    csv = ours_and_paper_csv(ours, label, deltas,
                             pub[pub["table"].isin(shown) & pub["model"].eq(key)], csv_keep(ours))
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
    for _, row in order_rows(kd).iterrows():
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
    notes = result_notes(ours) + [
        "Each KD row follows the LM-loss row of the same method, variant and ratio (same "
        "compression, recovery recipe and token budget): LM = next-token loss, KD = "
        "knowledge-distillation loss. " + marks_note(ours) +
        " Best per column within each ratio group in bold."]
    notes += cost_notes(frame, ours)
    if missing:
        notes.append(f"No LM-loss counterpart in the results for: {', '.join(missing)}.")
    blocks = [with_errors(Block(f"Ours: {name}, LM vs KD recovery loss", frame, kinds,
                                dict(METRIC_BEST), group="Ratio", notes=notes), ours,
                          METRIC_HEADERS)]
    keep = [c for c in csv_keep(ours) if c != "loss"]
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
               & ((ext & ~is_reference(agg))
                  | (is_reference(agg) & agg["variant"].isin(_EXT_DENSE)))]
    controls = is_reference(rows) & ~rows["variant"].eq("default")
    if not (rows["method"].eq(ROLES.extension) | controls).any():
        log.info("table 5 for %s: no extension results; skipped", model)
        return None
    order = {k: i for i, k in enumerate(EXTENSION_LABELS)}
    ours = rows.assign(_k=[order.get((m, v), len(order))
                           for m, v in zip(rows["method"], rows["variant"])])
    ours = ours.sort_values(["_k", "variant"]).drop(columns="_k").reset_index(drop=True)
    label = pd.Series([EXTENSION_LABELS.get((m, v), method_label(m, v))
                       for m, v in zip(ours["method"], ours["variant"])])
    extra = {"Layers": ours["num_layers"], "Params (M)": ours["params_compressed"] / 1e6}
    trainable = column_or_nan(ours, "trainable_params") / 1e6
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
    notes = result_notes(ours) + [control + " Best per column in bold."]
    if "Trainable (M)" in frame:
        notes.append("Trainable = parameters trained in recovery / continued training "
                     "(millions; – = not trained).")
    blocks = [with_errors(Block(f"Ours: {name}, extension", frame, kinds, dict(METRIC_BEST),
                                notes=notes), ours, METRIC_HEADERS)]
    key, same = reference_model(model, pub, (5,), "tinyllama-1.1b")
    blocks.append(paper_block(pub, (5,), key, paper_title(key, (5,), same), PAPER_NOTES[5],
                              extra=("Layers",)))
    deltas, delta_block = paper_deltas(ours, pub, (5,), model, label)
    if delta_block is not None:
        blocks.append(delta_block)
    keep = ["num_layers", "params_compressed", "trained", "recipe", "trainable_params", "tokens",
            "lr", "ppl", *TASKS, "avg", "n_seeds", *CI_COLUMNS]
    csv = ours_and_paper_csv(ours, label, deltas, pub[pub["table"].eq(5) & pub["model"].eq(key)],
                             keep)
    return Table(f"table5_extension_{slug(model)}", f"Table 5 — model extension, {name}",
                 blocks, csv)


