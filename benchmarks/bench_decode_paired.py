"""Paired, interleaved rounds of a compiled decode step: each model's per-token latency over
the first (reference) model's, with a 95 % interval over rounds.

``bench_decode.py --compile`` takes a median over a few long repeats; on a shared machine one
slow stretch moves a whole repeat, and its three repeats of the same pair gave 1.025, 1.131
and 1.109. Here every **round** decodes the same ``--n-prompts`` prompts once with every
model (compiled decode step, :func:`flexigpt.runtime.generation.generator.decode_compile_kwargs`;
greedy, EOS ignored, ``--max-new-tokens`` each), the order reversed every other round, so a
slow stretch hits both sides of a pair. Per batch size and model: the median over rounds of
the per-round ratio ``ms/token(model) / ms/token(reference)``, its 95 % percentile bootstrap
interval over rounds, the ratio of the per-model medians, and whether the greedy tokens
equal the model's own eager decoding (same prompts, same batch size). Every compiled graph is
built before the first timed round (``bench_decode.warm_up``: two prompt lengths at batch 1,
then the batch size). Prints a table and writes ``--out`` (JSON, with every round's figures
and the load average at start and end).

Example (the default run's reference models)::

    python -m benchmarks.bench_decode_paired results/smollm2-135m/dense/default/full/compressed \\
        results/smollm2-135m/flexigpt/default/r0.3/trained --labels dense flexigpt \\
        --rounds 30 --batch-sizes 1 4 --threads 2 --out results/bench_decode_paired.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.bench_decode import held_out_text, warm_up  # noqa: E402
from flexigpt.core.fileio import atomic_write_text  # noqa: E402
from flexigpt.core.provenance import cpu_name  # noqa: E402
from flexigpt.runtime.generation import Generator, read_prompts  # noqa: E402
from flexigpt.runtime.generation.measure import default_prompts  # noqa: E402
from flexigpt.storage.artifacts import load_compressed  # noqa: E402


def paired_ratio(reference: list[float], other: list[float], n_boot: int = 10000,
                 seed: int = 0, level: float = 0.95) -> dict[str, float]:
    """Median over rounds of ``other[i] / reference[i]`` with its percentile bootstrap
    interval (rounds resampled), and the ratio of the two medians.

    Raises:
        ValueError: the lists differ in length or are empty.
    """
    if len(reference) != len(other) or not reference:
        raise ValueError(f"need equally many rounds on both sides, got {len(reference)} and "
                         f"{len(other)}")
    ratios = np.asarray(other, dtype=float) / np.asarray(reference, dtype=float)
    rng = np.random.default_rng(seed)
    boot = np.median(ratios[rng.integers(0, len(ratios), (n_boot, len(ratios)))], axis=1)
    tail = (1 - level) / 2
    return {"median_ratio": float(np.median(ratios)),
            "low": float(np.quantile(boot, tail)), "high": float(np.quantile(boot, 1 - tail)),
            "ratio_of_medians": float(np.median(other) / np.median(reference)),
            "rounds": len(ratios)}


def rounds(gens: dict[str, Generator], prompts: list[str], batch_size: int, new_tokens: int,
           n_rounds: int) -> dict[str, list[float]]:
    """label → per-token ms of each round (every model once per round, alternating order)."""
    ms: dict[str, list[float]] = {label: [] for label in gens}
    labels = list(gens)
    for i in range(n_rounds):
        for label in labels if i % 2 == 0 else labels[::-1]:
            out = gens[label].generate(prompts, max_new_tokens=new_tokens, ignore_eos=True,
                                       batch_size=batch_size)
            ms[label].append(out.stats["per_token_ms"])
    return ms


def same_as_eager(eager: Generator, compiled: Generator, prompts: list[str], batch_size: int,
                  new_tokens: int) -> bool:
    """Whether the compiled decode step's greedy tokens equal the eager model's."""
    kw: dict[str, Any] = {"max_new_tokens": new_tokens, "ignore_eos": True,
                          "batch_size": batch_size}
    return compiled.generate(prompts, **kw).token_ids == eager.generate(prompts, **kw).token_ids


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="saved model directories; the first is the "
                                             "reference")
    p.add_argument("--labels", nargs="+", help="one label per model (default: dir names)")
    p.add_argument("--prompts-file", help="one prompt per line (default: held-out wiki)")
    p.add_argument("--n-prompts", type=int, default=2, help="prompts per round")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--out", help="JSON output path")
    args = p.parse_args(argv)
    labels = args.labels or [Path(m).name for m in args.models]
    if len(labels) != len(args.models) or len(args.models) < 2:
        p.error("give at least two models and one label per model")
    if args.threads:
        torch.set_num_threads(args.threads)
    n = max(args.n_prompts, *args.batch_sizes)
    prompts = (read_prompts(args.prompts_file)[:n] if args.prompts_file
               else default_prompts(held_out_text(), n))
    load_start = os.getloadavg()
    eager = {label: Generator(load_compressed(m)) for label, m in zip(labels, args.models)}
    gens = {label: Generator((g.model, g.tokenizer, g.manifest), compile_decode=True)
            for label, g in eager.items()}
    result: dict[str, Any] = {"cpu": cpu_name(), "threads": torch.get_num_threads(),
                              "args": vars(args), "labels": labels, "by_batch": {}}
    for b in args.batch_sizes:
        warm_up(gens, prompts, b, batched=b > 1)  # this batch size's graphs, before any timing
        batch_prompts = prompts[:max(args.n_prompts, b)]
        ms = rounds(gens, batch_prompts, b, args.max_new_tokens, args.rounds)
        row: dict[str, Any] = {"per_token_ms": ms, "models": {}}
        for label in labels:
            stats = paired_ratio(ms[labels[0]], ms[label])
            stats["median_ms"] = float(np.median(ms[label]))
            stats["greedy_same_as_eager"] = same_as_eager(eager[label], gens[label],
                                                          batch_prompts, b, args.max_new_tokens)
            row["models"][label] = stats
            print(f"batch {b} {label:>12}: {stats['median_ms']:7.2f} ms/token, × "
                  f"{stats['median_ratio']:.3f} [{stats['low']:.3f}, {stats['high']:.3f}] "
                  f"(ratio of medians {stats['ratio_of_medians']:.3f}); greedy = eager: "
                  f"{stats['greedy_same_as_eager']}", flush=True)
        result["by_batch"][str(b)] = row
    result["loadavg"] = {"start": list(load_start), "end": list(os.getloadavg())}
    print(f"load average {load_start[0]:.2f} → {result['loadavg']['end'][0]:.2f}")
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
