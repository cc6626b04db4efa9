"""Reports of ``bench_scaling.py``'s figures: the JSON and Markdown files, the Markdown tables
(measured stages per size; the extrapolation to the target model) and the time / memory vs
size plot. Pure functions of the figures dict, so ``bench_scaling.py --from-json`` redoes them
without measuring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import atomic_write_text


def write_outputs(path: Path, figures: dict[str, Any]) -> None:
    """``path`` (JSON) and its ``.md`` sibling, each written atomically."""
    atomic_write_text(path, json.dumps(figures, indent=1))
    atomic_write_text(path.with_suffix(".md"), markdown(figures))


def markdown(fig: dict[str, Any]) -> str:
    """The measured rows and the extrapolation as Markdown tables."""
    rows = fig["sizes"]
    if not rows:
        return "no size measured yet\n"
    stages = [s for s in rows[0]["stages"] if s != "load"]
    head = "| stage | " + " | ".join(f"{r['shape']} ({r['params'] / 1e6:.0f} M) s / MiB"
                                     for r in rows) + " |"
    lines = [f"Measured on {fig.get('cpu', 'this machine')} ({fig['threads']} threads, load average "
             f"{fig['load_average_start']} at start, {fig['load_average_end']} at end; fp32 "
             f"matmul peak {fig['cpu_peak_fp32'] / 1e9:.0f} GFLOP/s). Wall seconds / peak RSS "
             "rise (MiB) per stage:", "", head,
             "|---|" + "---|" * len(rows)]
    for s in stages:
        cells = []
        for r in rows:
            st = r["stages"].get(s)
            mem = st.get("peak_rise_mib") if st else None
            cells.append("—" if st is None else
                         f"{st['wall_s']:.2f} / " + ("—" if mem is None else f"{mem:.0f}"))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    ext = fig.get("extrapolation")
    if ext:
        lines += ["", f"Extrapolated to {ext['target']} ({ext['target_params'] / 1e9:.2f} B "
                  "parameters) at paper.yaml's token counts (calibration 500 × 2048, training "
                  "1B tokens, full task splits at ~64 tokens a request). CPU: the power-law "
                  f"fit. GPU: k·P FLOP a token at {fig['gpu_peak'] / 1e12:.0f} TFLOP/s × "
                  f"{ext['mfu']:.0%} utilisation (matmul-bound stages only; — = decomposition-"
                  "bound, see the CPU figure). Peak: the fitted RSS rise (the train step's "
                  "scaled to 2 × 2048 tokens) plus the bf16 weights:", "",
                  "| stage | time ∝ P^b | CPU h | GPU h | rise GiB | job peak GiB |",
                  "|---|---|---|---|---|---|"]
        for s in stages:
            e = ext.get(s)
            if not e:
                continue
            gpu = f"{e['gpu_s_paper'] / 3600:.2f}" if "gpu_s_paper" in e else "—"
            rise = f"{e['peak_rise_gib']:.1f}" if "peak_rise_gib" in e else "—"
            peak = (f"{e['job_peak_gib_bf16_weights']:.1f}" if "job_peak_gib_bf16_weights" in e
                    else "—")
            lines.append(f"| {s} | {e['time_fit']['b']:.2f} | {e['cpu_s_paper'] / 3600:.2f} | "
                         f"{gpu} | {rise} | {peak} |")
    return "\n".join(lines) + "\n"


def plot(fig: dict[str, Any], path: Path) -> None:
    """Time (FlexiGPT by stage) and RSS rise (FlexiGPT as a whole) vs size, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows = fig["sizes"]
    stages = [s for s in rows[0]["stages"] if s != "load"]
    colours = dict(zip(stages, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    fig_, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.4))
    for s in stages:
        have = [(r["params"], r["stages"][s]) for r in rows if s in r["stages"]]
        if s != "flexigpt_total":
            ax_t.plot([p for p, _ in have], [st["wall_s"] for _, st in have], "o-",
                      color=colours[s], label=s)
        if all(st.get("peak_rise_mib") for _, st in have):
            ax_m.plot([p for p, _ in have], [st["peak_rise_mib"] for _, st in have], "o-",
                      color=colours[s], label=s)
    for ax, what in ((ax_t, "wall seconds (benchmark tokens)"), (ax_m, "peak RSS rise (MiB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("dense parameters")
        ax.set_ylabel(what)
        ax.set_xticks([r["params"] for r in rows], [r["shape"] for r in rows])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig_.suptitle(f"Stage cost vs model size (random-weight Llamas, {fig['threads']} CPU threads)")
    fig_.tight_layout()
    fig_.savefig(path, dpi=110)
