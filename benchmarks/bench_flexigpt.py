"""FlexiGPT cost figures on one machine: pruning-stage times and forward latency vs dense.

Prints (1) the time of each pruning stage (Block Influence, SVD truncations, distances,
surgery + SVD init) and (2) forward latency of the compressed model relative to the dense
model on the same input in the same process, for every ``SharedLoRALinear`` forward mode
(:func:`flexigpt.methods.sharing.set_forward_mode`, set on the compressed model only),
for a prefill (``--batch × --tokens``) and for cached single-token decoding. Timings
alternate dense/compressed and report medians of CPU time (robust on a shared machine) and
of wall time. ``--compressed DIR`` times a saved model instead of compressing.

Example::

    python -m benchmarks.bench_flexigpt --model resources/models/smollm2-135m \\
        --calibration resources/text/wiki/train.txt --ratio 0.3 --threads 2
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from flexigpt.methods.calibration import token_windows
from flexigpt.methods.flexigpt.prune import FlexiGPTConfig, compress
from flexigpt.methods.sharing import FORWARD_MODES, set_forward_mode
from flexigpt.storage.artifacts import load_compressed
from flexigpt.storage.models.loading import load_model


def paired_medians(fn_a: Callable[[], object], fn_b: Callable[[], object],
                   repeats: int) -> dict[str, float]:
    """Median wall and CPU seconds of ``fn_a`` and ``fn_b``, run alternately (one warm-up each).

    CPU time (``time.process_time``) is the robust figure on a shared machine: it does not
    count the time the process waits to be scheduled.
    """
    fn_a(), fn_b()
    times: dict[str, list[float]] = {"a_wall": [], "b_wall": [], "a_cpu": [], "b_cpu": []}
    for _ in range(repeats):
        for fn, key in ((fn_a, "a"), (fn_b, "b")):
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[f"{key}_cpu"].append(time.process_time() - c0)
            times[f"{key}_wall"].append(time.perf_counter() - w0)
    return {k: statistics.median(v) for k, v in times.items()}


def report(label: str, t: dict[str, float], tokens: int | None = None) -> dict[str, float]:
    """Print one dense-vs-compressed line and return its figures."""
    fig = {"dense_wall_s": t["a_wall"], "compressed_wall_s": t["b_wall"],
           "dense_cpu_s": t["a_cpu"], "compressed_cpu_s": t["b_cpu"],
           "ratio_wall": t["b_wall"] / t["a_wall"], "ratio_cpu": t["b_cpu"] / t["a_cpu"]}
    extra = f"  {tokens / t['b_cpu']:,.0f} tok/cpu-s" if tokens else ""
    print(f"  {label:>7}: cpu dense {1e3 * t['a_cpu']:7.0f} ms compressed "
          f"{1e3 * t['b_cpu']:7.0f} ms ratio {fig['ratio_cpu']:.3f} | wall ratio "
          f"{fig['ratio_wall']:.3f}{extra}")
    return fig


def decode_fn(model: Any, prompt: torch.Tensor, steps: int) -> Callable[[], None]:  # HF LM: .config
    """Prefill ``prompt`` then greedily decode ``steps`` tokens one at a time with a KV cache."""
    from transformers import DynamicCache

    def run() -> None:
        cache = DynamicCache(config=model.config)
        out = model(input_ids=prompt, cache=cache, use_cache=True)
        for _ in range(steps):
            token = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=token, cache=cache, use_cache=True)

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resources/models/smollm2-135m")
    p.add_argument("--calibration", default="resources/text/wiki/train.txt")
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--n-calibration", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compressed", help="saved FlexiGPT model: skip compression, time only")
    p.add_argument("--json", help="also write the figures to this JSON file")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    dense, tok = load_model(args.model)
    calib = token_windows(args.calibration, tok, args.seq_len, args.n_calibration, seed=0)
    figures: dict[str, Any] = {"prefill": {}, "decode": {}}
    if args.compressed:  # latency only, on a model saved by `flexigpt compress`
        model = load_compressed(args.compressed).model
    else:
        model = copy.deepcopy(dense)
        t0 = time.perf_counter()
        with torch.no_grad():
            result = compress(model, tok, calib, FlexiGPTConfig(ratio=args.ratio))
        total = time.perf_counter() - t0
        stages = result.info["timings"]
        figures.update(stages_s=stages, compress_wall_s=round(total, 3))
        print(f"pruning stages on {args.model} (ratio {args.ratio}, {args.n_calibration}x"
              f"{args.seq_len} calibration tokens, {args.threads} thread(s)):")
        for key, value in stages.items():
            print(f"  {key:>16}: {value:8.2f} s")
        print(f"  {'wall':>16}: {total:8.2f} s   pruned {result.info['pruned_blocks']} "
              f"bases {result.info['base_map']}")

    ids = calib[: args.batch, : args.tokens]
    print(f"forward latency, compressed / dense, input {list(ids.shape)} "
          f"(median of {args.repeats}):")
    with torch.inference_mode():
        for mode in FORWARD_MODES:
            set_forward_mode(model, mode)
            t = paired_medians(lambda: dense(ids), lambda: model(ids), args.repeats)
            figures["prefill"][mode] = report(mode, t, ids.numel())
        print(f"cached decoding of {args.decode_steps} tokens after a 32-token prompt:")
        prompt = ids[:1, :32]
        for mode in ("naive", "addmm", "auto"):
            set_forward_mode(model, mode)
            t = paired_medians(decode_fn(dense, prompt, args.decode_steps),
                               decode_fn(model, prompt, args.decode_steps),
                               max(3, args.repeats // 2))
            figures["decode"][mode] = report(mode, t)
    set_forward_mode(model, "auto")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
