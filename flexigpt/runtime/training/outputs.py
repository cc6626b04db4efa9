"""What a training run leaves next to the model: ``train_log.csv`` and ``loss_curve.png``."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

#: Columns of ``train_log.csv`` (``ppl`` is blank where held-out perplexity was not run;
#: ``loss``/``lr`` are blank on the step-0 row, the evaluation before training).
LOG_COLUMNS = ("step", "tokens", "loss", "lr", "ppl")


def log_csv(rows: list[dict[str, Any]]) -> str:
    """The log rows as CSV text with :data:`LOG_COLUMNS`."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=LOG_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in LOG_COLUMNS})
    return buf.getvalue()


def plot_loss_curve(rows: list[dict[str, Any]], path: str | os.PathLike,
                    title: str = "") -> None:
    """Training loss against tokens, with held-out perplexity on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in rows if r.get("loss") is not None]
    evals = [r for r in rows if r.get("ppl") is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot([r["tokens"] for r in train], [r["loss"] for r in train], color="tab:blue",
            lw=1.2, label="train loss")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("train loss (nats/token)", color="tab:blue")
    if evals:
        ax2 = ax.twinx()
        ax2.plot([r["tokens"] for r in evals], [r["ppl"] for r in evals], "o-",
                 color="tab:red", lw=1.0, ms=3, label="held-out ppl")
        ax2.set_ylabel("held-out perplexity", color="tab:red")
        ax2.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=120)
    plt.close(fig)
