"""Figures (PNG + PDF) from collected results, training logs and FlexiGPT manifests.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend state).
Every plotting function returns the files it wrote and returns ``[]`` with a log line
when its inputs are absent, so partial result trees still build.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from flexigpt.tables.collect import TASKS
from flexigpt.tables.labels import TASK_HEADERS, method_label
from flexigpt.tables.render import sci
from flexigpt.tables.rows import is_reference, main_rows
from flexigpt.tables.sweep import order_trials, sweep_label

log = logging.getLogger(__name__)

_MARKERS = "osD^v<>ph*"


def save_figure(fig: Figure, out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """Write ``<stem>.png`` (150 dpi) and ``<stem>.pdf``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    paths = []
    formats: tuple[tuple[str, dict[str, Any]], ...] = (("png", {"dpi": 150}), ("pdf", {}))
    for ext, kwargs in formats:
        path = out / f"{stem}.{ext}"
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format=ext, bbox_inches="tight", **kwargs)
        os.replace(tmp, path)
        paths.append(path)
    log.info("wrote %s.{png,pdf}", out / stem)
    return paths


def log_y(ax: Any) -> None:
    """Log-scale y axis with plain-number tick labels (20, 50, 100 rather than 2×10¹)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(  # label only the 2× and 5× minor ticks
        lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v))) in (2, 5)
        else ""))
    ax.tick_params(axis="y", which="minor", labelsize=7)


def ci_yerr(rows: pd.DataFrame, col: str) -> np.ndarray | None:
    """``[2, n]`` error-bar lengths (value − lo, hi − value) from ``<col>_lo/_hi`` (0 where
    a row has no interval); None when no row has one."""
    lo, hi = rows.get(f"{col}_lo"), rows.get(f"{col}_hi")
    if lo is None or hi is None or not (lo.notna() & hi.notna()).any():
        return None
    v = rows[col].to_numpy(float)
    below = np.nan_to_num(v - lo.to_numpy(float), nan=0.0).clip(min=0)
    above = np.nan_to_num(hi.to_numpy(float) - v, nan=0.0).clip(min=0)
    return np.vstack([below, above])


def accuracy_vs_ratio(agg: pd.DataFrame, model: str, out_dir: str | os.PathLike,
                      stem: str, display: str | None = None) -> list[Path]:
    """Avg, per-task accuracy and PPL (log scale) against the achieved compression ratio,
    one line per method (final stage, main variants) with 95 % bootstrap error bars where
    the rows carry ``<col>_lo/_hi``; dense is a dashed reference line (its interval shaded)."""
    rows = main_rows(agg, model)
    dense = rows[is_reference(rows)]
    comp = rows[~is_reference(rows)]
    if comp.empty:
        log.info("accuracy-vs-ratio plot for %s: no compressed results; skipped", model)
        return []
    x = (comp["achieved_ratio"].fillna(comp["ratio"]) * 100).rename("x")
    comp = comp.assign(x=x)
    panels = [("avg", "Avg of 5 tasks (%)"), *[(t, f"{TASK_HEADERS[t]} (%)") for t in TASKS],
              ("ppl", "PPL (log)")]
    fig = Figure(figsize=(13, 6.2))
    axes = fig.subplots(2, 4).ravel()
    handles: dict[str, Any] = {}
    for ax, (col, title) in zip(axes, panels):
        for i, ((method, variant), g) in enumerate(comp.groupby(["method", "variant"], sort=True)):
            g = g.dropna(subset=[col]).sort_values("x")
            if g.empty:
                continue
            bars = ax.errorbar(g["x"], g[col], yerr=ci_yerr(g, col),
                               marker=_MARKERS[i % len(_MARKERS)], ms=5, capsize=2, lw=1.2,
                               label=method_label(method, variant))
            handles.setdefault(method_label(method, variant), bars.lines[0])
        if not dense.empty and not dense[col].isna().all():
            ref = ax.axhline(dense[col].mean(), color="0.4", ls="--", lw=1, label="Dense")
            handles.setdefault("Dense", ref)
            lo, hi = dense.get(f"{col}_lo"), dense.get(f"{col}_hi")
            if lo is not None and hi is not None and lo.notna().any() and hi.notna().any():
                ax.axhspan(float(lo.mean()), float(hi.mean()), color="0.4", alpha=0.12, lw=0)
        if col == "ppl" and comp["ppl"].notna().any():
            log_y(ax)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("achieved compression (% params)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[-1].axis("off")
    axes[-1].legend(list(handles.values()), list(handles), loc="center", fontsize=9, frameon=False)
    fig.suptitle(f"{display or model}: accuracy and perplexity vs compression ratio"
                 + (" (95% bootstrap CI)" if any(ci_yerr(comp, c) is not None
                                                  for c, _ in panels) else ""),
                 fontsize=12)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def recovery_curves(logs: dict[str, pd.DataFrame], out_dir: str | os.PathLike,
                    stem: str = "fig_recovery_loss") -> list[Path]:
    """Training loss (and the tuning-split PPL the trainer logged, if any) vs tokens, one
    line per ``train_log.csv``."""
    if not logs:
        log.info("recovery-loss plot: no train_log.csv files; skipped")
        return []
    with_ppl = any(df["ppl"].notna().any() for df in logs.values())
    fig = Figure(figsize=(11 if with_ppl else 6.5, 4))
    axes = fig.subplots(1, 2 if with_ppl else 1, squeeze=False).ravel()
    for label, full in sorted(logs.items()):
        df = full.dropna(subset=["loss"])
        x = df["tokens"] / 1e6
        window = max(1, len(df) // 50)
        (line,) = axes[0].plot(x, df["loss"], alpha=0.25 if window > 1 else 1.0, lw=1)
        if window > 1:
            axes[0].plot(x, df["loss"].rolling(window, min_periods=1).mean(),
                         color=line.get_color(), lw=1.5, label=label)
        else:
            line.set_label(label)
        if with_ppl:
            p = full.dropna(subset=["ppl"])  # step 0 (before training) has no loss
            axes[1].plot(p["tokens"] / 1e6, p["ppl"], marker="o", ms=3, color=line.get_color())
    axes[0].set(xlabel="tokens (M)", ylabel="training loss", title="Recovery training loss")
    axes[0].legend(fontsize=7)
    if with_ppl:
        axes[1].set(xlabel="tokens (M)", ylabel="tuning-split PPL",
                    title="Tuning-split PPL (recovery choices; never the test split)")
        log_y(axes[1])
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def block_influence(rec: dict[str, Any], out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """BI score per block; pruned blocks in red, annotated with their base block (→j)."""
    scores = np.asarray(rec["block_influence"], dtype=float)
    if scores.size == 0:
        log.info("BI plot %s: empty block_influence; skipped", stem)
        return []
    pruned = set(rec["pruned_blocks"])
    colors = ["tab:red" if i in pruned else "tab:blue" for i in range(scores.size)]
    fig = Figure(figsize=(max(6.0, 0.28 * scores.size + 2), 3.6))
    ax = fig.subplots()
    ax.bar(range(scores.size), scores, color=colors)
    top = float(np.nanmax(scores)) if np.isfinite(scores).any() else 1.0
    for block, base in rec["base_map"].items():
        if 0 <= block < scores.size:
            ax.text(block, scores[block] + 0.02 * top, f"→{base}", ha="center", va="bottom",
                    fontsize=7, rotation=90)
    ax.set(xlabel="block index", ylabel="Block Influence (1 − cos)",
           title=f"{rec['model']} {rec['method']} ratio={rec['ratio']}: BI per block "
                 f"({len(pruned)} pruned, red; →base)")
    ax.set_xticks(range(0, scores.size, 1 if scores.size <= 40 else 2))
    ax.tick_params(labelsize=7)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def distance_heatmap(rec: dict[str, Any], out_dir: str | os.PathLike, stem: str) -> list[Path]:
    """The base-selection distance matrix, pruned rows only (null = invalid candidate,
    grey); the chosen base of each row is marked with a white ×."""
    matrix = rec.get("distance_matrix")
    rows = sorted(rec["pruned_blocks"])
    if matrix is None or not rows:
        log.info("distance heat map %s: no distance matrix or no pruned blocks; skipped", stem)
        return []
    full = np.array([[math.nan if v is None else float(v) for v in r] for r in matrix])
    data = np.ma.masked_invalid(full[rows])
    if data.mask.all():
        log.info("distance heat map %s: every entry is null; skipped", stem)
        return []
    n = full.shape[1]
    fig = Figure(figsize=(max(6.0, 0.25 * n + 2.5), max(2.5, 0.3 * len(rows) + 1.6)))
    ax = fig.subplots()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    im = ax.imshow(data, aspect="auto", cmap=cmap, interpolation="nearest")
    fig.colorbar(im, ax=ax, label="low-rank distance")
    for r, block in enumerate(rows):
        base = rec["base_map"].get(block)
        if base is not None:
            ax.plot(base, r, marker="x", color="white", ms=7, mew=2)
    ax.set_yticks(range(len(rows)), [str(b) for b in rows])
    ax.set_xticks(range(0, n, 1 if n <= 40 else 2))
    ax.tick_params(labelsize=7)
    ax.set(xlabel="candidate base block", ylabel="pruned block",
           title=f"{rec['model']} ratio={rec['ratio']}: base-selection distances (× = chosen)")
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def lr_sweep(sel: pd.DataFrame, model: str, out_dir: str | os.PathLike, stem: str,
             display: str | None = None) -> list[Path]:
    """Tune PPL vs learning rate (log-log), one panel per ratio plus one for the other
    settings (extension, full); one line per run, and per γ LR where a run sweeps it; the
    chosen trial is ringed. Diverged (non-finite) trials are left out of the lines."""
    rows = sel[sel["model"].eq(model)]
    if rows.empty:
        log.info("LR sweep plot for %s: no selection records; skipped", model)
        return []
    rows = order_trials(rows)
    ratios = sorted(rows["ratio"].dropna().unique())
    panels = [(f"ratio {100 * r:g}%", rows[rows["ratio"].eq(r)]) for r in ratios]
    other = rows[rows["ratio"].isna()]
    if len(other):
        panels.append((f"other settings ({', '.join(dict.fromkeys(other['setting']))})", other))
    n = len(panels)
    cols = min(n, 3)
    fig = Figure(figsize=(5.2 * cols, 4.0 * math.ceil(n / cols)))
    axes = np.atleast_1d(fig.subplots(math.ceil(n / cols), cols, squeeze=False).ravel())
    for ax, (title, g) in zip(axes, panels):
        _sweep_panel(ax, title, g)
    for ax in axes[n:]:
        ax.axis("off")
    fig.suptitle(f"{display or model}: recovery LR sweeps (ringed = chosen)", fontsize=12)
    fig.tight_layout()
    return save_figure(fig, out_dir, stem)


def _sweep_panel(ax: Any, title: str, g: pd.DataFrame) -> None:
    """One panel of :func:`lr_sweep`: tune PPL vs LR of the ordered trials ``g`` (one line
    per run and γ LR, the chosen trial ringed, diverged trials as red × at the top)."""
    with_setting = g["ratio"].isna().all()
    for i, (key, line) in enumerate(g.groupby(["method", "variant", "setting", "gamma_lr"],
                                              dropna=False, sort=False)):
        method, variant, setting, gamma = key
        label = sweep_label(method, variant) + (f" @ {setting}" if with_setting else "")
        if not pd.isna(gamma):
            label += f", γ LR {sci(float(gamma))}"
        pts = line[line["tune_ppl"].map(math.isfinite) & line["lr"].notna()
                   & ~line["diverged"]].sort_values("lr")
        if pts.empty:
            continue
        (drawn,) = ax.plot(pts["lr"], pts["tune_ppl"], marker=_MARKERS[i % len(_MARKERS)],
                           ms=4, label=label)
        pick = pts[pts["chosen"]]
        if len(pick):
            ax.plot(pick["lr"], pick["tune_ppl"], marker="o", ms=12, mfc="none", mew=2,
                    color=drawn.get_color(), ls="none")
    diverged = g[(g["diverged"] | ~g["tune_ppl"].map(math.isfinite)) & g["lr"].notna()]
    if len(diverged):
        ax.plot(diverged["lr"], [0.97] * len(diverged), transform=ax.get_xaxis_transform(),
                marker="x", color="tab:red", ms=7, mew=2, ls="none",
                label="diverged (non-finite tune PPL)")
    ax.set_xscale("log")
    lrs = sorted(set(g["lr"].dropna()))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(lrs, [sci(v) for v in lrs])
    finite = g["tune_ppl"][g["tune_ppl"].map(math.isfinite) & g["tune_ppl"].gt(0)]
    if len(finite) and finite.max() / finite.min() > 3:
        log_y(ax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("learning rate (log)", fontsize=8)
    steps = g.dropna(subset=["rung_step", "steps"]) if "rung_step" in g else g.iloc[:0]
    at = (f" at step {int(steps['rung_step'].iloc[0])}/{int(steps['steps'].iloc[0])}"
          if len(steps) and steps["rung_step"].iloc[0] < steps["steps"].iloc[0] else "")
    ax.set_ylabel(f"tune PPL{at}", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.tick_params(labelsize=8)
    if ax.lines:
        ax.legend(fontsize=7)
