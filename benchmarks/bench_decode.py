"""Decoding cost of saved models: prefill, per-token decode latency, tokens/s, peak memory,
and self-speculative decoding of FlexiGPT models against its bound.

All models are loaded into one process and measured interleaved (repeat → model → run), so
machine drift hits every model alike. Per model and repeat:

* ``batch1``: greedy decoding of every prompt alone (``--max-new-tokens`` each, EOS
  ignored so every model generates the same number of tokens): prefill time (first forward),
  per-token decode latency (time between forwards after the first), tokens/s, peak RSS.
* ``batched``: the same prompts in batches of ``--batch-size`` (left padding).
* FlexiGPT models (``flexigpt``, ``flexigpt_extend``): the draft alone at batch 1 (its
  per-token latency over the full model's is ``c``, the draft-to-full cost ratio of one
  decode step), then self-speculative decoding for each ``--draft-lengths`` k: acceptance
  rate α, tokens per round, draft/full forwards, speed-up over plain batch-1 decoding of the
  same model, and the bound ``(1 − α^(k+1)) / ((1 − α)(k·c + 1))`` with the ratio
  speed-up / bound; ``identical`` says the greedy tokens equal plain decoding's.

Figures are medians over ``--repeats``. Peak RSS is process-wide (all models are resident);
``peak_rss_delta_mb`` is the rise during the run (KV cache, activations). The load average
is printed at the start and end and written to the JSON.

Default prompts: the first sentences of the first ``--n-prompts`` documents of
``resources/text/wiki/validation.test.txt`` (held-out; else ``validation.txt``).

Example::

    python benchmarks/bench_decode.py results/smollm2-135m/dense/.../compressed \\
        results/smollm2-135m/flexigpt/.../trained --labels dense flexigpt --threads 2 \\
        --out results/bench_decode.json
    python benchmarks/bench_decode.py DIR ... --quick   # seconds: a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flexigpt.artifacts import LoadedModel, atomic_write_text  # noqa: E402
from flexigpt.generation import Generator, speculative_bound  # noqa: E402

#: the paper's figure: self-speculative decoding is 30.11 % faster than plain FlexiGPT decoding
PAPER_SPECULATIVE_SPEEDUP = 0.3011
WIKI = ROOT / "resources" / "text" / "wiki"


def default_prompts(n: int, max_words: int = 40) -> list[str]:
    """First sentences of the first ``n`` held-out documents."""
    for name in ("validation.test.txt", "validation.txt"):
        path = WIKI / name
        if path.is_file():
            break
    else:
        raise FileNotFoundError(f"no held-out text under {WIKI}; pass --prompts-file")
    prompts = []
    for doc in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        doc = " ".join(doc.split())
        if not doc:
            continue
        first = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", doc, maxsplit=1)[0]
        prompts.append(" ".join(first.split()[:max_words]))
        if len(prompts) == n:
            break
    if len(prompts) < n:
        raise ValueError(f"{path} has only {len(prompts)} documents, {n} prompts asked")
    return prompts


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples the process RSS every ``interval`` s in a thread; ``peak`` after exit."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.start = self.peak = 0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def weight_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


def timed(gen: Generator, prompts: list[str], args: argparse.Namespace, **opts: Any):
    with PeakRSS() as mem:
        out = gen.generate(prompts, max_new_tokens=args.max_new_tokens, ignore_eos=True,
                           **opts)
    out.stats["peak_rss_mb"] = mem.peak / 2**20
    out.stats["peak_rss_delta_mb"] = (mem.peak - mem.start) / 2**20
    return out


PLAIN_KEYS = ("wall_s", "tokens_per_s", "per_token_ms", "decode_tokens_per_s", "prefill_s",
              "peak_rss_mb", "peak_rss_delta_mb")
SPEC_KEYS = ("wall_s", "tokens_per_s", "alpha", "accepted_fraction", "tokens_per_round",
             "draft_forwards", "full_forwards", "rounds", "peak_rss_mb", "peak_rss_delta_mb")


def median_of(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="saved model directories")
    p.add_argument("--labels", nargs="+", help="one label per model (default: dir names)")
    p.add_argument("--prompts-file", help="one prompt per line (default: held-out wiki)")
    p.add_argument("--n-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="the larger batch")
    p.add_argument("--draft-lengths", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--merged", action="store_true",
                   help="also time each FlexiGPT model with merged replacement weights")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 3 prompts, 8 new tokens, batch 2, 1 repeat")
    p.add_argument("--out", help="JSON output path")
    args = p.parse_args(argv)
    if args.quick:
        args.n_prompts, args.max_new_tokens = min(args.n_prompts, 3), 8
        args.batch_size, args.repeats = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    labels = args.labels or [Path(m).name for m in args.models]
    if len(labels) != len(args.models):
        raise SystemExit("--labels needs one label per model")
    if args.prompts_file:
        from flexigpt.generation import read_prompts
        prompts = read_prompts(args.prompts_file)[:args.n_prompts]
    else:
        prompts = default_prompts(args.n_prompts)
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} "
          f"{load_start[2]:.2f} ({os.cpu_count()} cpus, {torch.get_num_threads()} threads)")

    gens: dict[str, Generator] = {}
    dirs: dict[str, str | None] = {}
    for label, model_dir in zip(labels, args.models):
        gens[label] = Generator(model_dir, dtype=args.dtype)
        dirs[label] = str(model_dir)
        if args.merged and gens[label].supports_speculative():
            import copy

            from flexigpt.generation.lean import merge_replacement_linears
            g = gens[label]
            merged_model = copy.deepcopy(g.model)
            info = merge_replacement_linears(merged_model)
            gens[f"{label}+merged"] = Generator(LoadedModel(merged_model, g.tokenizer,
                                                            g.manifest))
            gens[f"{label}+merged"].merge_info = info  # type: ignore[attr-defined]
            dirs[f"{label}+merged"] = str(model_dir)
    drafts = {label: Generator(LoadedModel(g.draft(), g.tokenizer, None))
              for label, g in gens.items() if g.supports_speculative()}

    runs: dict[str, dict[str, list]] = {label: {"b1": [], "bb": [], "draft": [],
                                                **{f"k{k}": [] for k in args.draft_lengths}}
                                        for label in gens}
    tokens: dict[str, dict[str, list]] = {label: {} for label in gens}
    for rep in range(args.repeats):
        for label, g in gens.items():
            t0 = time.perf_counter()
            b1 = timed(g, prompts, args, batch_size=1)
            runs[label]["b1"].append(b1.stats)
            tokens[label]["plain"] = b1.token_ids
            runs[label]["bb"].append(timed(g, prompts, args, batch_size=args.batch_size).stats)
            if label in drafts:
                runs[label]["draft"].append(timed(drafts[label], prompts, args,
                                                  batch_size=1).stats)
                for k in args.draft_lengths:
                    sp = timed(g, prompts, args, speculative=True, draft_length=k)
                    runs[label][f"k{k}"].append(sp.stats)
                    tokens[label][f"k{k}"] = sp.token_ids
            print(f"[repeat {rep + 1}/{args.repeats}] {label}: "
                  f"{b1.stats['per_token_ms']:.2f} ms/token at batch 1 "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)

    models = []
    for label, g in gens.items():
        r = runs[label]
        b1 = median_of(r["b1"], PLAIN_KEYS)
        bb = median_of(r["bb"], PLAIN_KEYS)
        b1["batch_size"], bb["batch_size"] = 1, args.batch_size
        entry: dict[str, Any] = {
            "label": label, "dir": dirs[label],
            "method": g.method, "weights_mb": weight_bytes(g.model) / 2**20,
            "prefill_ms": 1e3 * b1["prefill_s"] / len(prompts), "batch1": b1, "batched": bb}
        if hasattr(g, "merge_info"):
            entry["merged"] = g.merge_info
        if label in drafts:
            d = median_of(r["draft"], PLAIN_KEYS)
            c = d["per_token_ms"] / b1["per_token_ms"]
            by_k = {}
            for k in args.draft_lengths:
                sp = median_of(r[f"k{k}"], SPEC_KEYS)
                speedup = b1["wall_s"] / sp["wall_s"]
                bound = speculative_bound(sp["alpha"], k, c)
                by_k[str(k)] = {**sp, "k": k, "speedup": speedup, "bound": bound,
                                "fraction_of_bound": speedup / bound,
                                "identical": tokens[label][f"k{k}"] == tokens[label]["plain"]}
            best = max(by_k, key=lambda k: by_k[k]["speedup"])
            entry["speculative"] = {
                "c": c, "draft_per_token_ms": d["per_token_ms"], "draft": g.draft_info,
                "by_k": by_k, "best_k": int(best),
                "identical": all(v["identical"] for v in by_k.values()),
                "paper_faster_fraction": PAPER_SPECULATIVE_SPEEDUP}
        models.append(entry)

    load_end = os.getloadavg()
    print(f"\n{len(prompts)} prompts × {args.max_new_tokens} new tokens, "
          f"{args.repeats} repeat(s), batch {args.batch_size}")
    print(f"{'model':<24}{'prefill ms':>11}{'ms/tok b1':>11}{'tok/s b1':>10}"
          f"{'tok/s bB':>10}{'peak MB':>9}")
    for e in models:
        print(f"{e['label']:<24}{e['prefill_ms']:>11.1f}{e['batch1']['per_token_ms']:>11.2f}"
              f"{e['batch1']['tokens_per_s']:>10.1f}{e['batched']['tokens_per_s']:>10.1f}"
              f"{e['batch1']['peak_rss_mb']:>9.0f}")
        if "speculative" in e:
            s = e["speculative"]
            for k, v in s["by_k"].items():
                print(f"  speculative k={k}: alpha {v['alpha']:.3f}, c {s['c']:.3f}, "
                      f"speed-up {v['speedup']:.3f} (bound {v['bound']:.3f}, "
                      f"{100 * v['fraction_of_bound']:.0f}% of it; paper: "
                      f"{100 * PAPER_SPECULATIVE_SPEEDUP:.2f}% faster), "
                      f"identical {v['identical']}")
    print(f"load average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
          f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    result = {"config": {"n_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                         "batch_size": args.batch_size, "draft_lengths": args.draft_lengths,
                         "repeats": args.repeats, "threads": torch.get_num_threads(),
                         "dtype": args.dtype, "quick": args.quick},
              "loadavg": {"start": list(load_start), "end": list(load_end)},
              "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "prompts": prompts, "models": models}
    try:
        from flexigpt.provenance import provenance
        result["provenance"] = provenance()
    except Exception as err:  # noqa: BLE001 - provenance is best effort in a benchmark
        result["provenance"] = {"error": repr(err)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
