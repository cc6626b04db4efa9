"""The paper's published numbers (``flexigpt/data/published_results.csv``), transcribed once.

One row per (table, model, method, variant, ratio, stage). Accuracies, averages and
relative time/throughput are in % exactly as printed; ratio is a fraction (blank = not
stated); PPL printed as ``1.4e4`` is stored as 14000. Table 4's start/final PPL are two
rows (stage ``start`` / ``final``). Blank ``variant``/``ratio``/``stage`` mean "not
stated" and match any value in :func:`match_published`.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pandas as pd

from flexigpt.tables.collect import TASKS
from flexigpt.tables.schema import ResultFileError

log = logging.getLogger(__name__)

PUBLISHED_CSV = Path(__file__).resolve().parent.parent / "data" / "published_results.csv"
COLUMNS = ("table", "model", "label", "method", "variant", "ratio", "stage", "layers", "ppl",
           *TASKS, "avg", "relative_time", "relative_throughput", "citation", "note")
_TEXT = ("model", "label", "method", "variant", "stage", "citation", "note")
#: Display names of the paper's models.
PAPER_MODELS = {"llama-2-7b": "Llama-2-7B", "llama-3-8b": "Llama-3-8B", "opt-6.7b": "OPT-6.7B",
                "opt-1.3b": "OPT-1.3B", "tinyllama-1.1b": "TinyLlama-1.1B"}
#: Tolerance on |reported avg − mean of the five tasks| (the paper rounds to 0.01).
AVG_TOLERANCE = 0.011


def load_published(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Read and check the published-numbers CSV; adds ``avg_recomputed`` and
    ``avg_mismatch`` (reported average differs from the mean of the five tasks)."""
    path = Path(path) if path is not None else PUBLISHED_CSV
    if not path.is_file():
        raise FileNotFoundError(f"published results file not found: {path}")
    df = pd.read_csv(path, dtype={c: str for c in _TEXT})
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ResultFileError(path, f"missing column(s) {missing}")
    for col in _TEXT:
        df[col] = df[col].fillna("").astype(str)
    for col in set(COLUMNS) - set(_TEXT):
        df[col] = pd.to_numeric(df[col], errors="raise")
    if df["citation"].eq("").any():
        rows = df.index[df["citation"].eq("")].tolist()
        raise ResultFileError(path, f"rows without a citation: {rows}")
    complete = df[list(TASKS)].notna().all(axis=1)
    df["avg_recomputed"] = df[list(TASKS)].mean(axis=1).where(complete).round(2)
    df["avg_mismatch"] = (df["avg"] - df["avg_recomputed"]).abs() > AVG_TOLERANCE
    return df


def avg_mismatches(pub: pd.DataFrame) -> pd.DataFrame:
    """Rows whose reported average is not the mean of their five task scores."""
    return pub[pub["avg_mismatch"]]


def normalise_model(name: str) -> str:
    """Map a model id/path to the paper's ids (``meta-llama/Llama-2-7b-hf`` → ``llama-2-7b``)."""
    base = str(name).rstrip("/").split("/")[-1].lower().replace("_", "-")
    base = re.sub(r"-hf$", "", base)
    base = re.sub(r"^llama(\d)", r"llama-\1", base)
    if base.startswith("tinyllama"):
        return "tinyllama-1.1b" if "1.1b" in base else base
    return base


def paper_model(name: str) -> str | None:
    """The paper's model id for ``name`` if the paper reports that model, else None."""
    key = normalise_model(name)
    return key if key in PAPER_MODELS else None


def match_published(pub: pd.DataFrame, tables: tuple[int, ...], model: str, method: str,
                    variant: str, ratio: float | None, stage: str | None) -> pd.Series | None:
    """The one published row of the same setting (same model, method, variant, ratio,
    stage; blanks in the CSV match anything), or None. Ambiguity is a ValueError."""
    key = paper_model(model)
    if key is None:
        return None
    rows = pub[pub["table"].isin(tables) & pub["model"].eq(key) & pub["method"].eq(method)]
    rows = rows[rows["variant"].isin(["", variant])]
    if stage is not None:
        rows = rows[rows["stage"].isin(["", stage])]
    if ratio is not None and not pd.isna(ratio):
        rows = rows[rows["ratio"].isna() | (rows["ratio"] - float(ratio)).abs().lt(1e-6)]
    if len(rows) > 1:
        raise ValueError(f"ambiguous published rows for {model}/{method}/{variant}/{ratio}/"
                         f"{stage}: {rows['label'].tolist()} (tables {tables})")
    return None if rows.empty else rows.iloc[0]
