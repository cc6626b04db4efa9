"""Recovery curves of the Table 1 runs and "tokens to reach the baseline's final value".

A training log belongs to the run whose directory holds it, in the DAG layout
``<model>/<method>/<variant>/<setting>/trained/train_log.csv`` (other logs are ignored
here). The curve is the **tuning-split perplexity** the trainer records every
``training.eval_every_tokens`` tokens (column ``ppl``: held-out documents, never the test
split) when the log has it at three or more points (start, at least one point inside the
run, end; :func:`tune_curve`). Older logs without such a curve fall back to the LM training
loss on batches each seen for the first time (training covers < 1 epoch, so a held-out
estimate), smoothed by a running mean over :data:`WINDOW` steps (:func:`smoothed`). The
runs compared in one figure or one "tokens to reach" cell use one metric: the tune PPL when
every one of them has a curve, else the training loss (axis and notes say which). KD runs
are excluded (their loss is not the LM loss).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import pandas as pd

from flexigpt.storage.registry import ROLES
from flexigpt.tables.labels import method_label, slug
from flexigpt.tables.render import si
from flexigpt.tables.row_intervals import setting_key
from flexigpt.tables.rows import is_reference, main_rows

log = logging.getLogger(__name__)

WINDOW = 3
NEVER = "—"
#: finite tune-PPL points a log needs to be read as a curve (start, inside, end).
MIN_PPL_POINTS = 3
PPL, LOSS = "ppl", "loss"
REACH_NOTE = ("Tokens to SG+LoRA loss = first recovery token count at which FlexiGPT's "
              "training LM loss (on unseen batches, running mean over 3 steps) is ≤ the "
              "final smoothed loss of ShortGPT + LoRA at the same ratio; — = never reached "
              "(training logs without tune-split PPL curves).")
REACH_NOTE_PPL = ("Tokens to SG+LoRA PPL = first recovery token count at which FlexiGPT's "
                  "tuning-split perplexity (recorded every training.eval_every_tokens "
                  "tokens, so resolved to that spacing) is ≤ the final tuning-split "
                  "perplexity of ShortGPT + LoRA at the same ratio; — = never reached.")
CURVE_NOTE = ("LM training loss on batches seen once (< 1 epoch: a held-out estimate), "
              "running mean over 3 steps (logs without tune-split PPL curves); KD runs "
              "excluded")
CURVE_NOTE_PPL = ("perplexity on the tuning split (held-out documents used for every "
                  "recovery choice; never the test split), recorded every "
                  "training.eval_every_tokens tokens; KD runs excluded")
#: y-axis label of each curve metric.
AXIS = {PPL: "tuning-split PPL (log)", LOSS: "LM training loss (smoothed)"}


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


def tune_curve(df: pd.DataFrame) -> pd.DataFrame | None:
    """``tokens``, ``ppl``: the tuning-split perplexity points of a train log (sorted by
    tokens), or None when it has fewer than :data:`MIN_PPL_POINTS` finite ones (a log
    written before periodic evaluation: only its start and end)."""
    d = df.dropna(subset=["ppl", "tokens"])
    d = d[d["ppl"].map(math.isfinite)].sort_values("tokens")
    if len(d) < MIN_PPL_POINTS:
        return None
    return pd.DataFrame({"tokens": d["tokens"].values, PPL: d["ppl"].values})


def metric_of(curve: pd.DataFrame) -> str:
    """The value column of a curve: :data:`PPL` or :data:`LOSS`."""
    return PPL if PPL in curve else LOSS


def common_curves(logs: dict[tuple, pd.DataFrame]) -> tuple[str, dict[tuple, pd.DataFrame]]:
    """One metric for all ``logs``: (``"ppl"``, their :func:`tune_curve`) when every log has
    one, else (``"loss"``, their :func:`smoothed` training loss)."""
    tune = {key: tune_curve(df) for key, df in logs.items()}
    if all(c is not None for c in tune.values()):
        return PPL, tune
    return LOSS, {key: smoothed(df) for key, df in logs.items()}


def tokens_to_reach(curve: pd.DataFrame, target: float) -> float | None:
    """First token count whose curve value (tune PPL, else smoothed loss) is ≤ ``target``
    (None: never)."""
    column = metric_of(curve)
    hit = curve[curve[column] <= target]
    return float(hit["tokens"].iloc[0]) if len(hit) else None


def _setting(ratio: float) -> str:
    return f"r{ratio:g}"


def run_logs(agg: pd.DataFrame, logs: dict[str, pd.DataFrame], model: str,
             ) -> dict[tuple, pd.DataFrame]:
    """Training logs (as read) of the recovered (LM-loss) Table 1 runs of ``model``, by
    setting key."""
    by_key = {k[1:]: df for label, df in logs.items()
              if (k := log_key(label)) is not None and k[0] in (None, model)}
    out = {}
    rows = main_rows(agg, model)
    rows = rows[rows["trained"].astype(bool) & ~rows["loss"].eq("kd")
                & ~is_reference(rows)]
    for _, r in rows.iterrows():
        df = by_key.get((r["method"], r["variant"], _setting(r["ratio"])))
        if df is not None:
            out[setting_key(r)] = df
    return out


def add_reach(agg: pd.DataFrame, logs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """``agg`` plus ``tokens_to_baseline`` (text: SI count or :data:`NEVER`) and
    ``tokens_to_baseline_metric`` (``ppl`` | ``loss``: :func:`common_curves` of the pair) on
    FlexiGPT's Table 1 rows whose ShortGPT + LoRA run at the same ratio has a log."""
    agg = agg.copy()
    for col in ("tokens_to_baseline", "tokens_to_baseline_metric"):
        agg[col] = pd.Series([None] * len(agg), index=agg.index, dtype=object)
    for model in dict.fromkeys(agg["model"]):
        raw = run_logs(agg, logs, model)
        for i, r in main_rows(agg, model).iterrows():
            key = setting_key(r)
            base = (model, ROLES.comparator, "default", key[3], "final")
            if r["method"] != ROLES.subject or key not in raw or base not in raw:
                continue
            metric, pair = common_curves({key: raw[key], base: raw[base]})
            hit = tokens_to_reach(pair[key], float(pair[base][metric].iloc[-1]))
            agg.at[i, "tokens_to_baseline"] = NEVER if hit is None else si(hit)
            agg.at[i, "tokens_to_baseline_metric"] = metric
    return agg


def recovery_by_ratio(agg: pd.DataFrame, logs: dict[str, pd.DataFrame], model: str,
                      out_dir: str | os.PathLike, display: str | None = None) -> list[Path]:
    """``fig_recovery_<model>_r<ratio>``: tune-split PPL (log axis; else the smoothed
    training loss, :func:`common_curves`) vs tokens of each recovered Table 1 run at that
    ratio; dotted line = ShortGPT + LoRA's final value."""
    from matplotlib.figure import Figure

    from flexigpt.tables.plots import log_y, save_figure

    raw = run_logs(agg, logs, model)
    written: list[Path] = []
    for ratio in sorted({k[3] for k in raw}):
        metric, curves = common_curves({k: df for k, df in raw.items() if k[3] == ratio})
        fig = Figure(figsize=(6.5, 4))
        ax = fig.subplots()
        for key, c in sorted(curves.items(), key=lambda kc: kc[0][1:3]):
            (line,) = ax.plot(c["tokens"] / 1e6, c[metric], lw=1.5,
                              marker="o" if metric == PPL else None, ms=3,
                              label=method_label(key[1], key[2]) + "*")
            if key[1:3] == (ROLES.comparator, "default"):
                ax.axhline(float(c[metric].iloc[-1]), color=line.get_color(), ls=":", lw=1)
        if metric == PPL:
            log_y(ax)
        ax.set(xlabel="recovery tokens (M)", ylabel=AXIS[metric],
               title=f"{display or model}, ratio {100 * ratio:.0f}%: recovery curves")
        ax.text(0.0, -0.2, CURVE_NOTE_PPL if metric == PPL else CURVE_NOTE,
                transform=ax.transAxes, fontsize=7, va="top")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        written += save_figure(fig, out_dir, f"fig_recovery_{slug(model)}_r{ratio:g}")
    if not raw:
        log.info("recovery curves for %s: no Table 1 run logs; skipped", model)
    return written
