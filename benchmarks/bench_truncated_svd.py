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
4. **Margins** (is a base choice decided at all?): for each pruned block of the exact run,
   the exact distances' *margin* (second best / best − 1) and *range* (worst / best − 1) over
   the candidates, against the randomized truncations' distance errors before any recheck
   (mean, standard deviation over the candidates, max) and their argmin; and the relative
   spectral gap ``σ_r / σ_{r+1} − 1`` of each linear of block 0. For the real model at each
   ratio, and (``--margin-shapes``) for random-weight shapes at ``--margin-ratio`` with
   ``bench_scaling.py``'s calibration tokens and policy: a margin below the randomized
   errors' spread is a close call the exact recheck must settle; a margin near the float32
   rounding of the distances (~1e-6) is a tie that no solver decides.

Prints a table and writes ``--out`` (JSON). Examples::

    .venv/bin/python -m benchmarks.bench_truncated_svd --threads 2 \\
        --out results/reference/scaling/bench_truncated_svd.json --shapes tinyllama-1.1b
    .venv/bin/python -m benchmarks.bench_truncated_svd --threads 2 \\
        --margin-shapes tinyllama-1.1b --out results/reference/scaling/svd_margins.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from flexigpt.core.fileio import atomic_write_text  # noqa: E402
from flexigpt.core.provenance import cpu_name  # noqa: E402
from flexigpt.methods.calibration import token_windows  # noqa: E402
from flexigpt.methods.flexigpt.base_selection import candidate_distances, truncations  # noqa: E402
from flexigpt.methods.surgery import default_rank  # noqa: E402
from flexigpt.methods.truncated_svd import top_svd  # noqa: E402
from flexigpt.storage.models.adapters import get_adapter  # noqa: E402

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


def margins(model: torch.nn.Module, info: dict[str, Any], label: str) -> dict[str, Any]:
    """Step 4 for one exact FlexiGPT run (``info``: its compression info, on a copy of
    ``model``): per pruned block the exact margin and range, the randomized distances'
    relative errors before any recheck and their argmin, and block 0's spectral gaps."""
    adapter = get_adapter(model)
    blocks = adapter.layers(model)
    pruned = info["pruned_blocks"]
    candidates = [j for j in range(len(blocks)) if j not in pruned]
    ranks = info["distance_ranks"]
    approx, _ = candidate_distances(blocks, adapter, pruned, candidates, ranks,
                                    solver="randomized", progress=False)
    exact = torch.tensor([[info["distance_matrix"][i][j] for j in candidates] for i in pruned],
                         dtype=torch.float64)
    rows = []
    for row, i in enumerate(pruned):
        e, a = exact[row], approx[row]
        ordered = e.sort().values
        err = (a - e) / e
        rows.append({"block": i, "exact_base": candidates[int(e.argmin())],
                     "randomized_base": candidates[int(a.argmin())],
                     "margin": float(ordered[1] / ordered[0] - 1),
                     "range": float(ordered[-1] / ordered[0] - 1),
                     "error_mean": float(err.mean()), "error_sd": float(err.std()),
                     "error_max": float(err.abs().max())})
    gaps: dict[str, float | None] = {}
    for name, lin in adapter.block_linears(blocks[0]).items():
        s = torch.linalg.svdvals(lin.weight.detach().float())
        r = ranks[name]  # None: the truncation keeps every singular value, no gap
        gaps[name] = float(s[r - 1] / s[r] - 1) if r < len(s) else None
    margin = sorted(r["margin"] for r in rows)
    sd = sorted(r["error_sd"] for r in rows)
    agree = sum(r["exact_base"] == r["randomized_base"] for r in rows)
    print(f"{label:>16} margins: min {margin[0]:.1e}, median {margin[len(margin) // 2]:.1e}; "
          f"randomized error sd median {sd[len(sd) // 2]:.1e}; argmin agrees on {agree} of "
          f"{len(rows)} before the recheck; spectral gaps "
          f"{ {k: None if v is None else f'{v:.1e}' for k, v in gaps.items()} }", flush=True)
    return {"model": label, "pruned_blocks": pruned, "rows": rows, "spectral_gap": gaps,
            "randomized_argmin_agrees": agree}


def shape_margins(shape: str, ratio: float) -> dict[str, Any]:
    """Step 4 on a random-weight ``shape`` with ``bench_scaling.py``'s calibration tokens and
    FlexiGPT's default policy (the pruned blocks of its ``--svd exact`` run)."""
    import copy

    from benchmarks.bench_scaling import SHAPES, random_model
    from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, compress

    model = random_model(shape, 0)
    calib = torch.randint(SHAPES[shape][5], (4, 256), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        info = compress(copy.deepcopy(model), None, calib,
                        FlexiGPTConfig(ratio=ratio, svd="exact")).info
    return {"ratio": ratio, **margins(model, info, shape)}


def choices(model: torch.nn.Module, calib: torch.Tensor, ratios: list[float]) -> list[dict]:
    """Step 3: FlexiGPT's choices with each solver at each ratio."""
    import copy

    from flexigpt.methods.block_influence import block_influence
    from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, compress

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
               "timings": {s: runs[s]["timings"] for s in SOLVERS},
               "margins": margins(model, runs["exact"], f"ratio {ratio}")}
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
    p.add_argument("--margin-shapes", nargs="*", default=[],
                   help="random-weight shapes for step 4 only (margins of the base choices)")
    p.add_argument("--margin-ratio", type=float, default=0.3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default="results/bench/bench_truncated_svd.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from benchmarks.bench_scaling import random_model  # the same random shapes
    from flexigpt.storage.models.loading import load_model

    figures: dict[str, Any] = {"threads": args.threads, "cpu": cpu_name(),
                               "load_average_start": os.getloadavg(),
                               "args": vars(args), "matrices": [], "choices": [],
                               "shape_margins": []}
    model, tokenizer = load_model(args.model)
    model.eval()
    figures["matrices"] += matrix_figures(model, Path(args.model).name)
    calib = token_windows(args.calibration, tokenizer, args.seq_len, args.n_calibration, seed=0)
    figures["choices"] = choices(model, calib, args.ratios)
    del model
    for shape in args.shapes:
        figures["matrices"] += matrix_figures(random_model(shape, 0), shape)
    for shape in args.margin_shapes:
        figures["shape_margins"].append(shape_margins(shape, args.margin_ratio))
    figures["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    atomic_write_text(out, json.dumps(figures, indent=1) + "\n")
    print(f"wrote {out}; load average {figures['load_average_start']} -> "
          f"{figures['load_average_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
