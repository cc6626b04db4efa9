"""Decoding cost of saved models: prefill, per-token decode latency, tokens/s, peak memory,
and self-speculative decoding of FlexiGPT models against its bound.

The protocol is :func:`flexigpt.runtime.generation.measure.measure_decode` (the one the DAG's
``inference_cost`` rule uses for Tables 6/7, here at full size): all models resident in one
process, measured interleaved (repeat → chunk of ``--batch-size`` prompts → model → run),
medians over ``--repeats``; per model greedy decoding at batch 1 and ``--batch-size`` (EOS
ignored, every model generates the same number of tokens), for FlexiGPT models with our lean
loops the model and the draft alone (``c`` = the draft's per-token latency over the model's)
and self-speculative decoding at each of ``--draft-lengths``: α, speed-up over the lean
plain batch-1 decoding of the same model (and over transformers' ``generate``), the bound ``(1 − α^(k+1)) / ((1 − α)(k·c +
1))``, speed-up / bound, and whether the greedy tokens equal plain decoding's. ``--merged``
adds each FlexiGPT model with merged replacement weights (the opt-in merged-weights path,
:mod:`flexigpt.runtime.generation.merged`), decoded plainly. ``--compile`` adds every model (merged
copies included) with a compiled decode step (``<label>+compiled``: the same weights, a static
KV cache and ``torch.compile``, :func:`flexigpt.runtime.generation.generator.decode_compile_kwargs`),
warmed up (compiled) before anything is timed; the table then also gives each compiled model's
per-token latency over the first model's compiled one, and every variant says whether its
greedy tokens equal its eager model's. The load average is printed at the start
and end and written to the JSON.

Default prompts: the first sentences of the first ``--n-prompts`` documents of
``resources/text/wiki/validation.test.txt`` (held-out; else ``validation.txt``).

Example::

    python -m benchmarks.bench_decode results/smollm2-135m/dense/.../compressed \\
        results/smollm2-135m/flexigpt/.../trained --labels dense flexigpt --threads 2 \\
        --out results/bench_decode.json
    python -m benchmarks.bench_decode DIR ... --quick   # seconds: a smoke run
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

from flexigpt.core.fileio import atomic_write_text  # noqa: E402
from flexigpt.core.provenance import provenance  # noqa: E402
from flexigpt.runtime.generation import Generator, read_prompts  # noqa: E402
from flexigpt.runtime.generation.measure import (  # noqa: E402
    PAPER_SPECULATIVE_SPEEDUP,
    default_prompts,
    measure_decode,
)
from flexigpt.runtime.generation.merged import merge_replacement_linears  # noqa: E402
from flexigpt.storage.artifacts import LoadedModel  # noqa: E402

WIKI = ROOT / "resources" / "text" / "wiki"


def held_out_text() -> Path:
    """The held-out wiki text the default prompts come from (test split, else the whole)."""
    for name in ("validation.test.txt", "validation.txt"):
        if (WIKI / name).is_file():
            return WIKI / name
    raise FileNotFoundError(f"no held-out text under {WIKI}; pass --prompts-file")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (``--quick`` already applied)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="saved model directories")
    p.add_argument("--labels", nargs="+", help="one label per model (default: dir names)")
    p.add_argument("--prompts-file", help="one prompt per line (default: held-out wiki)")
    p.add_argument("--n-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8, help="the larger batch")
    p.add_argument("--no-batched", action="store_true",
                   help="skip the batched runs (--batch-size still sizes the interleaved "
                        "chunks of prompts)")
    p.add_argument("--draft-lengths", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--merged", action="store_true",
                   help="also time each FlexiGPT model with merged replacement weights")
    p.add_argument("--no-speculative", action="store_true",
                   help="skip the lean loops and self-speculative decoding")
    p.add_argument("--compile", action="store_true",
                   help="also time every model with a compiled decode step (static cache)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 3 prompts, 8 new tokens, batch 2, 1 repeat")
    p.add_argument("--out", help="JSON output path")
    args = p.parse_args(argv)
    if args.quick:
        args.n_prompts, args.max_new_tokens = min(args.n_prompts, 3), 8
        args.batch_size, args.repeats = 2, 1
    return args


def load_generators(args: argparse.Namespace,
                    labels: list[str]) -> tuple[dict[str, Generator], dict[str, str]]:
    """label → :class:`Generator` of each model (plus ``<label>+merged`` copies of the
    FlexiGPT models with ``--merged``, their merge info as ``merge_info``), and label →
    model directory."""
    gens: dict[str, Generator] = {}
    dirs: dict[str, str] = {}
    for label, model_dir in zip(labels, args.models):
        gens[label] = Generator(model_dir, dtype=args.dtype)
        dirs[label] = str(model_dir)
        if args.merged and gens[label].supports_speculative():
            g = gens[label]
            merged_model = copy.deepcopy(g.model)
            info = merge_replacement_linears(merged_model)
            gens[f"{label}+merged"] = Generator(LoadedModel(merged_model, g.tokenizer,
                                                            g.manifest))
            gens[f"{label}+merged"].merge_info = info  # type: ignore[attr-defined]
            dirs[f"{label}+merged"] = str(model_dir)
    if args.compile:
        for label in list(gens):
            g = gens[label]
            compiled = Generator(LoadedModel(g.model, g.tokenizer, g.manifest),
                                 compile_decode=True)
            if hasattr(g, "merge_info"):
                compiled.merge_info = g.merge_info  # type: ignore[attr-defined]
            gens[f"{label}+compiled"] = compiled
            dirs[f"{label}+compiled"] = dirs[label]
    return gens, dirs


def warm_up(gens: dict[str, Generator], prompts: list[str], batch_size: int,
            batched: bool) -> dict[str, float]:
    """Compile the decode step of every compiled generator before anything is timed (two
    batch-1 calls of different prompt lengths, then one of ``batch_size`` prompts, 8 new
    tokens each: the shapes the timed runs will see); returns label → seconds."""
    seconds = {}
    for label, g in gens.items():
        if not g.compile_decode:
            continue
        tic = time.perf_counter()
        g.generate(prompts[:2], max_new_tokens=8, ignore_eos=True, batch_size=1,
                   engine="transformers")
        if batched:
            g.generate(prompts[:batch_size], max_new_tokens=8, ignore_eos=True,
                       batch_size=batch_size, engine="transformers")
        seconds[label] = time.perf_counter() - tic
        print(f"compiled {label}'s decode step in {seconds[label]:.1f} s", flush=True)
    return seconds


def eager_label(label: str) -> str:
    """The eager model (unmerged, as loaded) a ``+compiled`` / ``+merged`` variant derives
    from."""
    return label.split("+", 1)[0]


def print_comparisons(models: list[dict[str, Any]]) -> None:
    """Each compiled model's latency over the first compiled model's, and whether every
    variant decodes the same greedy tokens as its eager model."""
    by_name = {e["label"]: e for e in models}
    first = models[0]
    print("weight bytes read per decode step (the latency ratio's floor where decoding "
          "streams its weights):")
    for e in models:
        if not e["compiled_decode"]:
            print(f"  {e['label']:<30} {e['weight_reads_mb']:8.1f} MB "
                  f"(× {e['weight_reads_mb'] / first['weight_reads_mb']:.3f})")
    compiled = [e for e in models if e["compiled_decode"]]
    if compiled:
        ref = compiled[0]
        print(f"compiled decode step, relative to {ref['label']}:")
        for e in compiled:
            bb = (e["batched"]["per_token_ms"] / ref["batched"]["per_token_ms"]
                  if e["batched"] and ref["batched"] else math.nan)
            print(f"  {e['label']:<30} batch 1 {e['batch1']['per_token_ms']:7.2f} ms/token "
                  f"(× {e['batch1']['per_token_ms'] / ref['batch1']['per_token_ms']:.3f}), "
                  f"batched × {bb:.3f}")
    for e in models:
        base = by_name.get(eager_label(e["label"]))
        if base is not None and base is not e:
            same = {k: e["greedy_sha1"].get(k) == base["greedy_sha1"].get(k)
                    for k in e["greedy_sha1"]}
            e["greedy_identical_to_eager"] = same
            print(f"  {e['label']}: greedy tokens identical to {base['label']}: {same}")


def print_models(models: list[dict[str, Any]]) -> None:
    """The table of :func:`measure_decode`'s entries, and each FlexiGPT model's lean and
    speculative figures."""
    print(f"{'model':<24}{'prefill ms':>11}{'ms/tok b1':>11}{'× ref':>7}{'tok/s b1':>10}"
          f"{'tok/s bB':>10}{'peak MB':>9}")
    for e in models:
        print(f"{e['label']:<24}{e['prefill_ms']:>11.1f}{e['batch1']['per_token_ms']:>11.2f}"
              f"{e['relative_decode_time']:>7.3f}"
              f"{e['batch1']['tokens_per_s']:>10.1f}"
              f"{e['batched']['tokens_per_s'] if e['batched'] else math.nan:>10.1f}"
              f"{e['batch1']['peak_rss_mb']:>9.0f}")
        if e["speculative"]:
            s = e["speculative"]
            print(f"  lean loops: model {s['per_token_ms']:.2f} ms/token, draft "
                  f"{s['draft_per_token_ms']:.2f} (c {s['c']:.3f}, "
                  f"{s['draft']['draft_blocks']} of {s['draft']['full_blocks']} blocks)")
            for k, v in s["by_k"].items():
                print(f"  speculative k={k}: alpha {v['alpha']:.3f}, speed-up "
                      f"{v['speedup']:.3f} over lean plain decoding (bound {v['bound']:.3f}, "
                      f"{100 * v['fraction_of_bound']:.0f}% of it), "
                      f"{v['speedup_vs_transformers']:.3f} over transformers' generate "
                      f"(paper: {100 * PAPER_SPECULATIVE_SPEEDUP:.2f}% faster), "
                      f"identical {v['identical']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    labels = args.labels or [Path(m).name for m in args.models]
    if len(labels) != len(args.models):
        raise SystemExit("--labels needs one label per model")
    if args.prompts_file:
        prompts = read_prompts(args.prompts_file)[:args.n_prompts]
    else:
        prompts = default_prompts(held_out_text(), args.n_prompts)
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} "
          f"{load_start[2]:.2f} ({os.cpu_count()} cpus, {torch.get_num_threads()} threads)")
    gens, dirs = load_generators(args, labels)

    def progress(rep: int, label: str, b1: dict[str, Any], seconds: float) -> None:
        print(f"[repeat {rep + 1}/{args.repeats}] {label}: {b1['per_token_ms']:.2f} ms/token "
              f"at batch 1 ({seconds:.1f} s)", flush=True)

    # merged copies decode plainly only: their draft is the unmerged model's (same blocks)
    compile_s = warm_up(gens, prompts, args.batch_size, not args.no_batched)
    spec = [label for label, g in gens.items()
            if g.supports_speculative() and not hasattr(g, "merge_info")
            and not g.compile_decode and not args.no_speculative]
    models = measure_decode(gens, prompts, args.max_new_tokens, args.batch_size,
                            args.draft_lengths, args.repeats, on_round=progress,
                            speculative=spec, batched=not args.no_batched)
    for e in models:
        e["label"], e["dir"] = e["name"], dirs[e["name"]]
        gen = gens[e["name"]]
        if hasattr(gen, "merge_info"):
            e["merged"] = gen.merge_info
    load_end = os.getloadavg()
    print(f"\n{len(prompts)} prompts × {args.max_new_tokens} new tokens, "
          f"{args.repeats} repeat(s), batch {args.batch_size}")
    print_models(models)
    print_comparisons(models)
    print(f"load average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; "
          f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    result = {"config": {"n_prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
                         "batch_size": args.batch_size, "batched": not args.no_batched,
                         "draft_lengths": args.draft_lengths,
                         "repeats": args.repeats, "threads": torch.get_num_threads(),
                         "dtype": args.dtype, "quick": args.quick,
                         "compile": args.compile},
              "compile_s": compile_s,
              "loadavg": {"start": list(load_start), "end": list(load_end)},
              "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "prompts": prompts, "models": models}
    try:
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
