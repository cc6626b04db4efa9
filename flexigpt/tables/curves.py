"""Recovery curves of the Table 1 runs and "tokens to reach the baseline's final loss".

A training log belongs to the run whose directory holds it, in the DAG layout
``<model>/<method>/<variant>/<setting>/trained/train_log.csv`` (other logs are ignored
here). The curve is the LM training loss on batches each seen for the first time (training
covers < 1 epoch, so a held-out estimate), smoothed by a running mean over
:data:`WINDOW` steps; KD runs are excluded (their loss is not the LM loss).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd

from flexigpt.tables.build import main_rows, method_label, slug
from flexigpt.tables.intervals import setting_key
from flexigpt.tables.render import si

log = logging.getLogger(__name__)

WINDOW = 3
NEVER = "—"
REACH_NOTE = ("Tokens to SG+LoRA loss = first recovery token count at which FlexiGPT's "
              "training LM loss (on unseen batches, running mean over 3 steps) is ≤ the "
              "final smoothed loss of ShortGPT + LoRA at the same ratio; — = never reached.")
CURVE_NOTE = ("LM training loss on batches seen once (< 1 epoch: a held-out estimate), "
              "running mean over 3 steps; KD runs excluded")


def log_key(label: str) -> tuple[str | None, str, str, str] | None:
    """(model, method, variant, setting) of a log directory label ending in ``/trained``;
    model None when the label starts below the model directory."""
    parts = Path(label).parts
    if len(parts) < 4 or parts[-1] != "trained":
        return None
    return (parts[-5] if len(parts) >= 5 else None, *parts[-4:-1])  # type: ignore[return-value]


def smoothed(df: pd.DataFrame, window: int = WINDOW) -> pd.DataFrame:
    """``tokens``, ``loss`` (running mean over ``window`` logged steps) of a train log."""
    d = df.dropna(subset=["loss", "tokens"]).sort_values("tokens")
    return pd.DataFrame({"tokens": d["tokens"].values,
                         "loss": d["loss"].rolling(window, min_periods=1).mean().values})


def tokens_to_reach(curve: pd.DataFrame, target: float) -> float | None:
    """First token count with smoothed loss ≤ ``target`` (None: never)."""
    hit = curve[curve["loss"] <= target]
    return float(hit["tokens"].iloc[0]) if len(hit) else None


def _setting(ratio: float) -> str:
    return f"r{ratio:g}"


def run_logs(agg: pd.DataFrame, logs: dict[str, pd.DataFrame], model: str,
             ) -> dict[tuple, pd.DataFrame]:
    """Smoothed curves of the recovered (LM-loss) Table 1 runs of ``model``, by setting key."""
    by_key = {k[1:]: df for label, df in logs.items()
              if (k := log_key(label)) is not None and k[0] in (None, model)}
    out = {}
    rows = main_rows(agg, model)
    rows = rows[rows["trained"].astype(bool) & ~rows["loss"].eq("kd")
                & ~rows["method"].eq("dense")]
    for _, r in rows.iterrows():
        df = by_key.get((r["method"], r["variant"], _setting(r["ratio"])))
        if df is not None:
            out[setting_key(r)] = smoothed(df)
    return out


def add_reach(agg: pd.DataFrame, logs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """``agg`` plus ``tokens_to_baseline`` (text: SI count or :data:`NEVER`) on FlexiGPT's
    Table 1 rows whose ShortGPT + LoRA run at the same ratio has a log."""
    agg = agg.copy()
    agg["tokens_to_baseline"] = pd.Series([None] * len(agg), index=agg.index, dtype=object)
    for model in dict.fromkeys(agg["model"]):
        curves = run_logs(agg, logs, model)
        for i, r in main_rows(agg, model).iterrows():
            key = setting_key(r)
            base = (model, "shortgpt_lora", "default", key[3], "final")
            if r["method"] != "flexigpt" or key not in curves or base not in curves:
                continue
            hit = tokens_to_reach(curves[key], float(curves[base]["loss"].iloc[-1]))
            agg.at[i, "tokens_to_baseline"] = NEVER if hit is None else si(hit)
    return agg


def recovery_by_ratio(agg: pd.DataFrame, logs: dict[str, pd.DataFrame], model: str,
                      out_dir: str | os.PathLike, display: str | None = None) -> list[Path]:
    """``fig_recovery_<model>_r<ratio>``: smoothed loss vs tokens of each recovered Table 1
    run at that ratio; dotted line = ShortGPT + LoRA's final smoothed loss."""
    from matplotlib.figure import Figure

    from flexigpt.tables.plots import save_figure

    curves = run_logs(agg, logs, model)
    written: list[Path] = []
    for ratio in sorted({k[3] for k in curves}):
        fig = Figure(figsize=(6.5, 4))
        ax = fig.subplots()
        for key, c in sorted(((k, c) for k, c in curves.items() if k[3] == ratio),
                             key=lambda kc: kc[0][1:3]):
            (line,) = ax.plot(c["tokens"] / 1e6, c["loss"], lw=1.5,
                              label=method_label(key[1], key[2]) + "*")
            if key[1:3] == ("shortgpt_lora", "default"):
                ax.axhline(float(c["loss"].iloc[-1]), color=line.get_color(), ls=":", lw=1)
        ax.set(xlabel="recovery tokens (M)", ylabel="LM loss (smoothed)",
               title=f"{display or model}, ratio {100 * ratio:.0f}%: recovery curves")
        ax.text(0.0, -0.2, CURVE_NOTE, transform=ax.transAxes, fontsize=7, va="top")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        written += save_figure(fig, out_dir, f"fig_recovery_{slug(model)}_r{ratio:g}")
    if not curves:
        log.info("recovery curves for %s: no Table 1 run logs; skipped", model)
    return written
