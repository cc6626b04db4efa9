"""Columns and footnotes shared by the result tables (Table 1, paper protocol, KD, Table 5):
the metric columns, the recovery-cost columns and the notes that explain them."""

from __future__ import annotations

import pandas as pd

from flexigpt.storage.registry import METHODS, ROLES
from flexigpt.tables.collect import TASKS
from flexigpt.tables.facts import ACHIEVED, basis_note
from flexigpt.tables.labels import TASK_HEADERS, lm_variant, method_label, row_label
from flexigpt.tables.render import sci
from flexigpt.tables.rows import column_or_nan, is_reference, optional_float

RECOVERY_NOTE = "* = after recovery training (the evaluated model was trained)."
ONE_SHOT_NOTE = "(one-shot) = evaluated right after compression, never trained."
#: the second achieved ratio's column (:func:`flexigpt.tables.facts.non_embedding_ratio`)
NON_EMB = "Achieved (non-emb.)"
#: Columns of the matched / paper-protocol tables that are left out when every row lacks them.
_OPTIONAL = ("Blocks", "Trainable (M)", "Tokens", "LR")
COST_KINDS = {"Ratio": "pct0", "Achieved": "pct1", NON_EMB: "pct1", "Blocks": "int", "Layers": "int",
              "Trainable (M)": "num", "Tokens": "si", "LR": "text", "Seeds": "int"}
_TASK_COLS = [TASK_HEADERS[t] for t in TASKS]
#: metric column of the frame → displayed header (for the ± half-widths).
METRIC_HEADERS = {"ppl": "PPL", **TASK_HEADERS, "avg": "Avg"}
METRIC_KINDS = {"PPL": "ppl", **{c: "num" for c in _TASK_COLS}, "Avg": "num"}
METRIC_BEST = {"PPL": "min", **{c: "max" for c in _TASK_COLS}, "Avg": "max"}


def _lr_text(lr, gamma) -> str | None:
    if optional_float(lr) is None:
        return None
    gamma_text = f" (γ {sci(float(gamma))})" if optional_float(gamma) is not None else ""
    return sci(float(lr)) + gamma_text


def cost_frame(ours: pd.DataFrame, label: pd.Series, layers: bool = False) -> tuple[
        pd.DataFrame, dict[str, str]]:
    """Method, Ratio, Achieved (+ Achieved (non-emb.) where the model's embedding count is
    known), Blocks, Trainable (M), Tokens, LR, metrics, Avg (+ Seeds).

    Optional columns every row lacks are left out; without any ``blocks_pruned`` (older
    files) the layer count stands in for Blocks, as before, when ``layers``."""
    blocks = column_or_nan(ours, "blocks_pruned")
    extra = {"Ratio": ours["ratio"] * 100, "Achieved": ours["achieved_ratio"] * 100}
    non_embedding = column_or_nan(ours, ACHIEVED)
    if non_embedding.notna().any():  # the model's facts are known (flexigpt.tables.facts)
        extra[NON_EMB] = non_embedding * 100
    if blocks.notna().any() or not layers:
        extra["Blocks"] = blocks
    else:
        extra["Layers"] = ours["num_layers"]
    extra["Trainable (M)"] = column_or_nan(ours, "trainable_params") / 1e6
    extra["Tokens"] = column_or_nan(ours, "tokens")
    extra["LR"] = pd.Series([_lr_text(a, b) for a, b in zip(column_or_nan(ours, "lr"),
                                                           column_or_nan(ours, "gamma_lr"))],
                            index=ours.index, dtype=object)
    frame = metric_frame(ours, label, extra)
    frame["Avg"] = ours["avg"].values
    kinds = {**COST_KINDS, **METRIC_KINDS}
    if (ours["n_seeds"] > 1).any():
        frame["Seeds"] = ours["n_seeds"].values
    drop = [c for c in _OPTIONAL if c in frame and frame[c].isna().all()]
    return frame.drop(columns=drop), kinds


def blocks_note(ours: pd.DataFrame) -> str:
    """What the Blocks column counts for the methods of ``ours``: blocks taken out, and what
    each method puts in their place (:attr:`flexigpt.storage.registry.MethodFacts.replacement`)."""
    strategies: dict[str, list[str]] = {}
    width = []
    for method in dict.fromkeys(ours["method"]):
        facts = METHODS[method]
        if facts.replacement is not None:
            strategies.setdefault(facts.replacement, []).append(facts.label)
        elif method != ROLES.reference:
            width.append(facts.label)
    put = "; ".join(f"{what}: {', '.join(labels)}" for what, labels in strategies.items())
    text = "Blocks = transformer blocks taken out" + (f" (in their place, {put})" if put else "")
    dash = f"width methods ({', '.join(width)}) and the dense model" if width else "the dense model"
    return f"{text}; – for {dash}."


def cost_notes(frame: pd.DataFrame, ours: pd.DataFrame) -> list[str]:
    """What Achieved (non-emb.) / Blocks / Trainable / Tokens / LR mean, for the columns
    shown."""
    parts = []
    if NON_EMB in frame and (note := basis_note(ours)):
        parts.append(note)
    if "Blocks" in frame:
        parts.append(blocks_note(ours))
    if "Trainable (M)" in frame:
        parts.append("Trainable = parameters trained in recovery (millions).")
    if "Tokens" in frame:
        parts.append("Tokens = recovery training tokens.")
    if "LR" in frame:
        parts.append("LR = the recovery learning rate, chosen on the tuning split by the run's "
                     "LR sweep unless the CSV's lr_source says otherwise; γ = the learning rate "
                     "of FlexiGPT's output-norm gains.")
    notes = [" ".join(parts)] if parts else []
    budget = ours[column_or_nan(ours, "budget_target").notna()]
    if len(budget):
        err = budget["budget_rel_error"].abs().max()
        labels = ", ".join(dict.fromkeys(method_label(m, v) for m, v in zip(
            budget["method"], budget["variant"])))
        notes.append(f"Trainable counts matched to a parameter budget ({labels}): largest "
                     f"|relative error| {100 * err:.2f}%.")
    return notes


def marks_note(ours: pd.DataFrame) -> str:
    compressed = ours[~is_reference(ours)]
    marks = []
    if ours["trained"].astype(bool).any():
        marks.append(RECOVERY_NOTE)
    if (~compressed["trained"].astype(bool)).any():
        marks.append(ONE_SHOT_NOTE)
    return " ".join(marks)


def result_notes(ours: pd.DataFrame) -> list[str]:
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


def ordered_labels(ours: pd.DataFrame, base: bool = False) -> pd.Series:
    """Row labels with the trained / one-shot marks; ``base``: the method's label for the
    variant it stands in for (paper → default, ``*_kd`` → its LM variant)."""
    def shown(m: str, v: str) -> str | None:
        if not base:
            return None
        return method_label(m, "default" if v == "paper" else lm_variant(v))
    return pd.Series([row_label(m, v, bool(t), shown(m, v))
                      for m, v, t in zip(ours["method"], ours["variant"], ours["trained"])])
