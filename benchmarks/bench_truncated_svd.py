"""Exact vs randomized top-r SVD (:mod:`flexigpt.methods.truncated_svd`): time, error, and
whether FlexiGPT's choices change.

For a real model (``--model``, default the offline SmolLM2-135M) and, optionally, random
Llama shapes (``--shapes``, those of ``bench_scaling.py``), one process, nothing else running:

1. **Truncations** (base selection, Eq. 2–5): per linear name, the stack of every block's
   matrix, decomposed by both solvers at FlexiGPT's rank r = hidden/16; wall seconds of each
   and the *excess error* of the randomized truncation,
   ``(||A − Ã_r||_F − ||A − A_r||_F) / ||A − A_r||_F`` (max over blocks; 0 = optimal).
2. **SVD initialisation** (Eq. 7–8): the same for ``Δ = W_i − W_{i+1}`` of adjacent blocks.
3. **Choices** (real model only): FlexiGPT compression at each ``--ratios`` (policy
   ``matched``, one Block Influence pass shared by both solvers) with ``svd: exact`` and
   ``svd: randomized``: identical pruned blocks and base maps?, the largest relative
   difference of the block distances, and the stage times.

Prints a table and writes ``--out`` (JSON). Example::

    .venv/bin/python benchmarks/bench_truncated_svd.py --threads 2 \\
        --out results/reference/scaling/bench_truncated_svd.json --shapes tinyllama-1.1b
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flexigpt.calibration import token_windows  # noqa: E402
from flexigpt.methods.base_selection import truncations  # noqa: E402
from flexigpt.methods.surgery import default_rank  # noqa: E402
from flexigpt.methods.truncated_svd import top_svd  # noqa: E402
from flexigpt.models.adapters import get_adapter  # noqa: E402
from flexigpt.provenance import cpu_name  # noqa: E402

SOLVERS = ("exact", "randomized")


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def excess_error(a: torch.Tensor, rank: int) -> tuple[float, dict[str, float]]:
    """Max over the stack of the randomized truncation's relative excess Frobenius error,
    and each solver's wall seconds."""
    tops, seconds = {}, {}
    for solver in SOLVERS:
        tops[solver], seconds[solver] = timed(lambda s=solver: top_svd(a, rank, s))
    exact, approx = tops["exact"].tail.sqrt(), tops["randomized"].tail.sqrt()
    rel = ((approx - exact) / exact.clamp_min(1e-300)).max()
    return float(rel), {k: round(v, 4) for k, v in seconds.items()}


def matrix_figures(model: torch.nn.Module, label: str) -> list[dict[str, Any]]:
    """Steps 1 and 2 for every linear name of ``model``."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    config: Any = model.config  # an HF config
    rank = default_rank(config.hidden_size)
    rows = []
    for name in adapter.linear_names():
        w = torch.stack([adapter.block_linears(b)[name].weight.detach().float() for b in blocks])
        r = min(rank, *w.shape[-2:])
        trunc_err, trunc_s = excess_error(w, r)
        init_err, init_s = excess_error(w[:-1] - w[1:], r)
        _, t_exact = timed(lambda w=w, r=r: truncations(w, r, torch.float32, solver="exact"))
        _, t_rand = timed(lambda w=w, r=r: truncations(w, r, torch.float32,
                                                       solver="randomized"))
        rows.append({"model": label, "linear": name, "shape": list(w.shape), "rank": r,
                     "truncation_excess": trunc_err, "init_excess": init_err,
                     "truncations_s": {"exact": round(t_exact, 4), "randomized": round(t_rand, 4)},
                     "top_svd_s": trunc_s, "init_top_svd_s": init_s})
        print(f"{label:>16} {name:>16} {tuple(w.shape)!s:>18} r={r:<4} excess trunc "
              f"{trunc_err:.2e} init {init_err:.2e} | truncations exact {t_exact:7.2f} s "
              f"randomized {t_rand:7.2f} s", flush=True)
    return rows


def choices(model: torch.nn.Module, calib: torch.Tensor, ratios: list[float]) -> list[dict]:
    """Step 3: FlexiGPT's choices with each solver at each ratio."""
    import copy

    from flexigpt.block_influence import block_influence
    from flexigpt.methods.prune import FlexiGPTConfig, compress

    scores = [float(s) for s in block_influence(model, calib)]
    out = []
    for ratio in ratios:
        runs = {}
        for solver in SOLVERS:
            cfg = FlexiGPTConfig(ratio=ratio, policy="matched", svd=solver, bi_scores=scores)
            with torch.no_grad():
                result = compress(copy.deepcopy(model), None, None, cfg)
            runs[solver] = result.info
        d = {s: torch.tensor([[float("nan") if v is None else v for v in row]
                              for row in runs[s]["distance_matrix"]]) for s in SOLVERS}
        rel = ((d["randomized"] - d["exact"]).abs() / d["exact"].abs()).nan_to_num(0).max()
        row = {"ratio": ratio, "pruned_blocks": runs["exact"]["pruned_blocks"],
               "base_map": {s: runs[s]["base_map"] for s in SOLVERS},
               "same_pruned": runs["exact"]["pruned_blocks"] == runs["randomized"]["pruned_blocks"],
               "same_bases": runs["exact"]["base_map"] == runs["randomized"]["base_map"],
               "max_rel_distance_diff": float(rel),  # rechecked entries are exact
               "rechecked": runs["randomized"].get("svd_rechecked", {}),
               "timings": {s: runs[s]["timings"] for s in SOLVERS}}
        out.append(row)
        print(f"ratio {ratio}: same bases {row['same_bases']}, max rel. distance diff "
              f"{row['max_rel_distance_diff']:.2e}, rechecked {row['rechecked']}, timings "
              f"{row['timings']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resources/models/smollm2-135m")
    p.add_argument("--calibration", default="resources/text/wiki/train.txt")
    p.add_argument("--n-calibration", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.3, 0.4])
    p.add_argument("--shapes", nargs="*", default=[],
                   help="random-weight Llama shapes of bench_scaling.py (e.g. tinyllama-1.1b)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default="results/bench/bench_truncated_svd.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from bench_scaling import random_model  # the same random shapes

    from flexigpt.models.loading import load_model

    figures: dict[str, Any] = {"threads": args.threads, "cpu": cpu_name(),
                               "load_average_start": os.getloadavg(),
                               "args": vars(args), "matrices": [], "choices": []}
    model, tokenizer = load_model(args.model)
    model.eval()
    figures["matrices"] += matrix_figures(model, Path(args.model).name)
    calib = token_windows(args.calibration, tokenizer, args.seq_len, args.n_calibration, seed=0)
    figures["choices"] = choices(model, calib, args.ratios)
    del model
    for shape in args.shapes:
        figures["matrices"] += matrix_figures(random_model(shape, 0), shape)
    figures["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"wrote {out}; load average {figures['load_average_start']} -> "
          f"{figures['load_average_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
