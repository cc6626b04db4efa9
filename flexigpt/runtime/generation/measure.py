"""Decoding cost of several models on the same prompts, in one process (Tables 6/7, and
``benchmarks/bench_decode.py``).

Protocol (:func:`measure_decode`): every model is resident; the prompts are taken in chunks
of ``batch`` and, chunk after chunk, every model runs all of its measurements on that chunk
(repeat → chunk → model → run), so drifting machine load hits all models and all runs
alike, within a minute or so of each other; each run's figures are summed over the chunks
and the medians over ``repeats`` are reported. Per model:

* ``batch1``: greedy decoding of every prompt alone with transformers' ``generate``,
  ``new_tokens`` each (EOS ignored, so every model generates the same number of tokens):
  prefill time (the first forward), decode latency per token (time between the forwards
  after the first), tokens/s, peak RSS rise;
* ``batched``: the same prompts in batches of ``batch`` (left padding);
* FlexiGPT models (:data:`flexigpt.runtime.generation.SPECULATIVE_METHODS`), all with our lean
  greedy loops (:mod:`flexigpt.runtime.generation.speculative`), one prompt at a time: the model
  alone (``lean``, the baseline of the speed-up), the draft alone (its per-token latency
  over the model's is ``c``, the draft-to-full cost ratio of one decode step), then
  self-speculative decoding at each draft length ``k``: acceptance rate α, tokens per round,
  tokens/s, speed-up over the model's lean plain decoding (wall time ratio; also over
  transformers' batch-1 decoding), the expected speed-up
  ``(1 − α^(k+1)) / ((1 − α)(k·c + 1))`` (:func:`flexigpt.runtime.generation.figures.expected_speedup`;
  reported as ``bound``, which measurements can exceed), speed-up / bound, and whether its
  greedy tokens equal plain decoding's; ``few_row_route`` records the lean loops' few-row
  linear routing (:mod:`flexigpt.runtime.generation.few_rows`).

Peak RSS is process-wide (every model resident): ``peak_rss_delta_mb`` is the rise during a
run (KV cache, activations); ``weights_mb`` the distinct storage of a model's tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from flexigpt.core.devices import model_device
from flexigpt.runtime.generation.draft import DEFAULT_DRAFT_LENGTH
from flexigpt.runtime.generation.few_rows import few_row_route
from flexigpt.runtime.generation.figures import (
    decode_rates,
    expected_speedup,
    rss_bytes,
    weight_reads_per_token,
)
from flexigpt.runtime.generation.generator import Generator

#: the paper's figure: self-speculative decoding is 30.11 % faster than plain FlexiGPT decoding
PAPER_SPECULATIVE_SPEEDUP = 0.3011

PLAIN_KEYS = ("wall_s", "tokens_per_s", "per_token_ms", "decode_tokens_per_s", "prefill_s",
              "peak_rss_mb", "peak_rss_delta_mb")
SPEC_KEYS = ("wall_s", "tokens_per_s", "alpha", "accepted_fraction", "tokens_per_round",
             "draft_forwards", "full_forwards", "rounds", "peak_rss_mb", "peak_rss_delta_mb")


def default_prompts(path: str | os.PathLike, n: int, max_words: int = 40) -> list[str]:
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


def token_digest(token_ids: list[list[int]]) -> str:
    """A short digest of the new token ids of every prompt (equal digests: the same greedy
    output token for token)."""
    return hashlib.sha1(json.dumps(token_ids).encode()).hexdigest()[:16]


def median_of(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: statistics.median(r[k] for r in runs) for k in keys}


#: statistics that add up over chunks of prompts (everything else is derived or a max)
_SUMS = ("wall_s", "prefill_s", "decode_s", "decode_steps", "new_tokens", "prompts",
         "full_forwards", "draft_forwards", "rounds", "drafted", "accepted", "rejections")


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's statistics from its chunks' ``generate`` stats: sums of :data:`_SUMS`,
    maxima of the peak RSS figures, the ratios recomputed from the sums, and the first
    chunk's ``few_row_route`` where the chunks have one (lean runs)."""
    out = {k: sum(p[k] for p in parts) for k in _SUMS if k in parts[0]}
    for key in ("peak_rss_mb", "peak_rss_delta_mb"):
        out[key] = max(p[key] for p in parts)
    out.update(decode_rates(out, parts[0]["batch_size"]))
    if "few_row_route" in parts[0]:
        out["few_row_route"] = parts[0]["few_row_route"]
    return out


def measure_decode(gens: dict[str, Generator], prompts: list[str], new_tokens: int,
                   batch: int, draft_lengths: Sequence[int] = (DEFAULT_DRAFT_LENGTH,),
                   repeats: int = 1, on_round: Any = None,
                   speculative: Sequence[str] | None = None,
                   batched: bool = True) -> list[dict[str, Any]]:
    """Decoding cost of each generator (name → :class:`Generator`, the first is the
    reference, normally dense) on the same ``prompts``; see the module docstring.

    ``speculative`` names the models decoded self-speculatively too (default: every one
    that supports it); ``on_round(repeat, name, batch1_stats, seconds)`` is called after
    each model's turn on the last chunk of a repeat (with that repeat's batch-1 figures);
    ``batched=False`` skips the batched runs (``batched`` is then None; ``batch`` still sizes
    the chunks).

    Returns one entry per model, in order: ``name, method, weights_mb``, ``weight_reads_mb``
    (:func:`~flexigpt.runtime.generation.figures.weight_reads_per_token`), ``prefill_ms`` (per
    prompt), ``batch1`` / ``batched`` (medians of :data:`PLAIN_KEYS` + ``batch_size``),
    ``relative_decode_time`` (batch-1 per-token latency / the reference's),
    ``compiled_decode``, ``greedy_sha1`` (:func:`token_digest` of the batch-1 and batched
    outputs) and ``speculative`` (None, or ``c``, ``per_token_ms`` / ``draft_per_token_ms`` (lean
    loops), ``lean`` (medians of :data:`PLAIN_KEYS`), ``draft`` info, ``by_k``: {k: medians
    of :data:`SPEC_KEYS` + speedup, speedup_vs_transformers, bound, fraction_of_bound,
    identical}, ``best_k``, ``identical``, ``paper_faster_fraction``, ``few_row_route``).

    Raises:
        ValueError: no generators or prompts, or a non-positive size.
    """
    ks, chosen = _check_plan(gens, prompts, new_tokens, batch, repeats, draft_lengths,
                             speculative)
    for g in gens.values():  # the lean loops' one-time BLAS timing, outside every timed run
        few_row_route(model_device(g.model))
    drafts = {name: Generator((gens[name].draft(ks[0]), gens[name].tokenizer, None))
              for name in chosen}
    kinds = {name: ["b1"] + (["bb"] if batched else []) + (["lean", "draft"] + [f"k{k}" for k in ks]
                                   if name in drafts else []) for name in gens}
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    runs, tokens = _run_repeats(gens, drafts, kinds, chunks, new_tokens, batch, repeats,
                                on_round)
    return [_entry(name, g, runs[name], tokens[name], len(prompts), batch, ks,
                   ref=runs[next(iter(gens))]["b1"])
            for name, g in gens.items()]


def _check_plan(gens: dict[str, Generator], prompts: list[str], new_tokens: int, batch: int,
                repeats: int, draft_lengths: Sequence[int],
                speculative: Sequence[str] | None) -> tuple[list[int], list[str]]:
    """Validate :func:`measure_decode`'s arguments; returns the draft lengths and the names
    of the models decoded self-speculatively. Raises ValueError as it documents."""
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
    return ks, chosen


def _run_repeats(gens: dict[str, Generator], drafts: dict[str, Generator],
                 kinds: dict[str, list[str]], chunks: list[list[str]], new_tokens: int,
                 batch: int, repeats: int, on_round: Any
                 ) -> tuple[dict[str, dict[str, list]], dict[str, dict[str, list]]]:
    """Every model's measurements of ``kinds``, repeat → chunk → model → run (see the module
    docstring). Returns, per model and kind, the combined stats of each repeat and the token
    ids of the last repeat."""
    runs: dict[str, dict[str, list]] = {name: {kind: [] for kind in kinds[name]} for name in gens}
    tokens: dict[str, dict[str, list]] = {name: {} for name in gens}
    for rep in range(repeats):
        parts: dict[str, dict[str, list]] = {name: {kind: [] for kind in kinds[name]}
                                             for name in gens}
        ids: dict[str, dict[str, list]] = {name: {kind: [] for kind in kinds[name]}
                                           for name in gens}
        seconds = {name: 0.0 for name in gens}
        for chunk in chunks:
            for name, g in gens.items():
                tic = time.perf_counter()
                for kind in kinds[name]:
                    out = _run(g, drafts.get(name), kind, chunk, new_tokens, batch)
                    parts[name][kind].append(out.stats)
                    ids[name][kind].extend(out.token_ids)
                seconds[name] += time.perf_counter() - tic
        for name in gens:
            for kind in kinds[name]:
                runs[name][kind].append(combine(parts[name][kind]))
            tokens[name] = ids[name]
            if on_round is not None:
                on_round(rep, name, runs[name]["b1"][-1], seconds[name])
    return runs, tokens


def _run(g: Generator, draft: Generator | None, kind: str, prompts: list[str],
         new_tokens: int, batch: int):
    """One measurement of ``kind`` (b1, bb, lean, draft, k<k>) on ``prompts``."""
    if kind == "b1":
        return timed(g, prompts, new_tokens, batch_size=1, engine="transformers")
    if kind == "bb":
        return timed(g, prompts, new_tokens, batch_size=batch, engine="transformers")
    if kind == "lean":
        return timed(g, prompts, new_tokens, engine="lean")
    if kind == "draft":
        assert draft is not None  # "draft" is measured only for models with a draft
        return timed(draft, prompts, new_tokens, engine="lean")
    return timed(g, prompts, new_tokens, speculative=True, draft_length=int(kind[1:]),
                 engine="lean")


def _entry(name: str, g: Generator, r: dict[str, list], tokens: dict[str, list],
           n_prompts: int, batch: int, ks: list[int], ref: list[dict]) -> dict[str, Any]:
    """The reported entry of one model from its runs (see :func:`measure_decode`)."""
    b1 = {**median_of(r["b1"], PLAIN_KEYS), "batch_size": 1}
    bb = {**median_of(r["bb"], PLAIN_KEYS), "batch_size": batch} if "bb" in r else None
    ref_ms = median_of(ref, ("per_token_ms",))["per_token_ms"]
    entry: dict[str, Any] = {
        "name": name, "method": g.method, "weights_mb": weight_bytes(g.model) / 2**20,
        "weight_reads_mb": weight_reads_per_token(g.model) / 2**20,
        "prefill_ms": 1e3 * b1["prefill_s"] / n_prompts, "batch1": b1, "batched": bb,
        "relative_decode_time": b1["per_token_ms"] / ref_ms, "speculative": None,
        "compiled_decode": g.compile_decode,
        "greedy_sha1": {kind: token_digest(tokens[kind]) for kind in ("b1", "bb")
                        if kind in tokens}}
    if "lean" not in r:
        return entry
    lean = median_of(r["lean"], PLAIN_KEYS)
    d = median_of(r["draft"], PLAIN_KEYS)
    c = d["per_token_ms"] / lean["per_token_ms"]
    by_k = {}
    for k in ks:
        sp = median_of(r[f"k{k}"], SPEC_KEYS)
        speedup = lean["wall_s"] / sp["wall_s"]
        bound = expected_speedup(sp["alpha"], k, c)
        by_k[str(k)] = {**sp, "k": k, "speedup": speedup,
                        "speedup_vs_transformers": b1["wall_s"] / sp["wall_s"],
                        "bound": bound, "fraction_of_bound": speedup / bound,
                        "identical": tokens[f"k{k}"] == tokens["b1"] == tokens["lean"]}
    best = max(by_k, key=lambda key: by_k[key]["speedup"])
    entry["speculative"] = {
        "c": c, "per_token_ms": lean["per_token_ms"], "draft_per_token_ms": d["per_token_ms"],
        "lean": lean, "draft": g.draft_info, "by_k": by_k, "best_k": int(best),
        "identical": all(v["identical"] for v in by_k.values()),
        "paper_faster_fraction": PAPER_SPECULATIVE_SPEEDUP,
        "few_row_route": r["lean"][0]["few_row_route"]}
    return entry
