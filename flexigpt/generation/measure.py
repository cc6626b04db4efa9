"""Decoding cost of several models on the same prompts, in one process (Tables 6/7, and
``benchmarks/bench_decode.py``).

Protocol (:func:`measure_decode`): every model is resident; ``repeats`` rounds in which the
models take turns (repeat → model), so drifting machine load hits all of them alike; figures
are medians over the rounds. Per model and round:

* ``batch1``: greedy decoding of every prompt alone, ``new_tokens`` each (EOS ignored, so
  every model generates the same number of tokens): prefill time (the first forward), decode
  latency per token (time between the forwards after the first), tokens/s, peak RSS rise;
* ``batched``: the same prompts in batches of ``batch`` (left padding);
* FlexiGPT models (:data:`flexigpt.generation.SPECULATIVE_METHODS`): the draft alone at
  batch 1 (its per-token latency over the model's is ``c``, the draft-to-full cost ratio of
  one decode step), then self-speculative decoding at each draft length ``k``: acceptance
  rate α, tokens per round, tokens/s, speed-up over the model's plain batch-1 decoding (wall
  time ratio), the bound ``(1 − α^(k+1)) / ((1 − α)(k·c + 1))``, speed-up / bound, and whether
  its greedy tokens equal plain decoding's.

Peak RSS is process-wide (every model resident): ``peak_rss_delta_mb`` is the rise during a
run (KV cache, activations); ``weights_mb`` the distinct storage of a model's tensors.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from flexigpt.generation import DEFAULT_DRAFT_LENGTH, Generator, rss_bytes, speculative_bound

#: the paper's figure: self-speculative decoding is 30.11 % faster than plain FlexiGPT decoding
PAPER_SPECULATIVE_SPEEDUP = 0.3011

PLAIN_KEYS = ("wall_s", "tokens_per_s", "per_token_ms", "decode_tokens_per_s", "prefill_s",
              "peak_rss_mb", "peak_rss_delta_mb")
SPEC_KEYS = ("wall_s", "tokens_per_s", "alpha", "accepted_fraction", "tokens_per_round",
             "draft_forwards", "full_forwards", "rounds", "peak_rss_mb", "peak_rss_delta_mb")


def default_prompts(path: str | Path, n: int, max_words: int = 40) -> list[str]:
    """The first sentence (at most ``max_words`` words) of each of the first ``n`` documents
    (blank-line separated) of a text file.

    Raises:
        FileNotFoundError: no such file; ValueError: fewer than ``n`` documents.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt text not found: {path}")
    prompts = []
    for doc in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
        doc = " ".join(doc.split())
        if not doc:
            continue
        first = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(])", doc, maxsplit=1)[0]
        prompts.append(" ".join(first.split()[:max_words]))
        if len(prompts) == n:
            return prompts
    raise ValueError(f"{path} has only {len(prompts)} documents, {n} prompts asked")


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
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct storages of a model's parameters and buffers (shared once)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total += t.untyped_storage().nbytes()
    return total


def timed(gen: Generator, prompts: list[str], new_tokens: int, **opts: Any):
    """``gen.generate`` of exactly ``new_tokens`` per prompt, with its peak RSS in stats."""
    with PeakRSS() as mem:
        out = gen.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True, **opts)
    out.stats["peak_rss_mb"] = mem.peak / 2**20
    out.stats["peak_rss_delta_mb"] = (mem.peak - mem.start) / 2**20
    return out


def median_of(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def measure_decode(gens: dict[str, Generator], prompts: list[str], new_tokens: int,
                   batch: int, draft_lengths: Sequence[int] = (DEFAULT_DRAFT_LENGTH,),
                   repeats: int = 1, on_round: Any = None,
                   speculative: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Decoding cost of each generator (name → :class:`Generator`, the first is the
    reference, normally dense) on the same ``prompts``; see the module docstring.

    ``speculative`` names the models decoded self-speculatively too (default: every one
    that supports it); ``on_round(repeat, name, batch1_stats, seconds)`` is called after
    each model's turn.

    Returns one entry per model, in order: ``name, method, weights_mb, prefill_ms`` (per
    prompt), ``batch1`` / ``batched`` (medians of :data:`PLAIN_KEYS` + ``batch_size``),
    ``relative_decode_time`` (batch-1 per-token latency / the reference's) and
    ``speculative`` (None, or ``c``, ``draft_per_token_ms``, ``draft`` info, ``by_k``:
    {k: medians of :data:`SPEC_KEYS` + speedup, bound, fraction_of_bound, identical},
    ``best_k``, ``identical``, ``paper_faster_fraction``).

    Raises:
        ValueError: no generators or prompts, or a non-positive size.
    """
    if not gens or not prompts:
        raise ValueError("measure_decode needs at least one model and one prompt")
    for what, value in (("new_tokens", new_tokens), ("batch", batch), ("repeats", repeats)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive int, got {value!r}")
    if not draft_lengths or any(int(k) < 1 for k in draft_lengths):
        raise ValueError(f"draft lengths must be positive ints, got {list(draft_lengths)!r}")
    ks = [int(k) for k in draft_lengths]
    chosen = [n for n, g in gens.items() if g.supports_speculative()] if speculative is None \
        else list(speculative)
    bad = [n for n in chosen if n not in gens or not gens[n].supports_speculative()]
    if bad:
        raise ValueError(f"no self-speculative draft for {bad} (FlexiGPT models only)")
    drafts = {name: Generator((gens[name].draft(ks[0]), gens[name].tokenizer, None))
              for name in chosen}
    runs: dict[str, dict[str, list]] = {
        name: {"b1": [], "bb": [], "draft": [], **{f"k{k}": [] for k in ks}} for name in gens}
    tokens: dict[str, dict[str, Any]] = {name: {} for name in gens}
    for rep in range(repeats):
        for name, g in gens.items():
            tic = time.perf_counter()
            b1 = timed(g, prompts, new_tokens, batch_size=1)
            runs[name]["b1"].append(b1.stats)
            tokens[name]["plain"] = b1.token_ids
            runs[name]["bb"].append(timed(g, prompts, new_tokens, batch_size=batch).stats)
            if name in drafts:
                runs[name]["draft"].append(timed(drafts[name], prompts, new_tokens,
                                                 batch_size=1).stats)
                for k in ks:
                    sp = timed(g, prompts, new_tokens, speculative=True, draft_length=k)
                    runs[name][f"k{k}"].append(sp.stats)
                    tokens[name][f"k{k}"] = sp.token_ids
            if on_round is not None:
                on_round(rep, name, b1.stats, time.perf_counter() - tic)
    entries, ref = [], None
    for name, g in gens.items():
        r = runs[name]
        b1 = {**median_of(r["b1"], PLAIN_KEYS), "batch_size": 1}
        bb = {**median_of(r["bb"], PLAIN_KEYS), "batch_size": batch}
        ref = b1["per_token_ms"] if ref is None else ref
        entry: dict[str, Any] = {
            "name": name, "method": g.method, "weights_mb": weight_bytes(g.model) / 2**20,
            "prefill_ms": 1e3 * b1["prefill_s"] / len(prompts), "batch1": b1, "batched": bb,
            "relative_decode_time": b1["per_token_ms"] / ref, "speculative": None}
        if name in drafts:
            d = median_of(r["draft"], PLAIN_KEYS)
            c = d["per_token_ms"] / b1["per_token_ms"]
            by_k = {}
            for k in ks:
                sp = median_of(r[f"k{k}"], SPEC_KEYS)
                speedup = b1["wall_s"] / sp["wall_s"]
                bound = speculative_bound(sp["alpha"], k, c)
                by_k[str(k)] = {**sp, "k": k, "speedup": speedup, "bound": bound,
                                "fraction_of_bound": speedup / bound,
                                "identical": tokens[name][f"k{k}"] == tokens[name]["plain"]}
            best = max(by_k, key=lambda key: by_k[key]["speedup"])
            entry["speculative"] = {
                "c": c, "draft_per_token_ms": d["per_token_ms"], "draft": g.draft_info,
                "by_k": by_k, "best_k": int(best),
                "identical": all(v["identical"] for v in by_k.values()),
                "paper_faster_fraction": PAPER_SPECULATIVE_SPEEDUP}
        entries.append(entry)
    return entries
