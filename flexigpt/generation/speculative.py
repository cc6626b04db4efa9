"""Greedy decoding loops of our own: plain, and self-speculative with a weight-sharing draft.

Transformers' assisted generation calls the draft's whole ``generate`` once per round (its
set-up, logits processors and stopping criteria every time) and re-slices both caches; on a
small CPU model whose decode step is tens of milliseconds that overhead costs as much as the
speed-up the draft buys (measured: 48-50 % of the bound). These loops do only what the
method needs, on one sequence (batch 1) with a KV cache each for the model and the draft:

* :func:`greedy_decode` — one forward per token; the like-for-like baseline of
  :func:`speculative_decode` (same Python, same cache type);
* :func:`speculative_decode` — each round the draft proposes ``k`` tokens greedily (``k``
  forwards, the first feeding the 1-2 tokens it has not seen yet), the model scores the last
  accepted token and the ``k`` proposals in one forward of ``k + 1`` tokens, keeps the
  longest prefix it agrees with and appends its own next token; both caches are cropped back
  to the agreed prefix. The result is token for token the model's greedy decoding (up to the
  float rounding of a ``k + 1``-token forward against one-token forwards, which the tests
  check on tiny models and the benchmark on SmolLM2).

Cost per round: ``k`` draft forwards + one model forward, the ``(k·c + 1)`` of the bound
``(1 − α^(k+1)) / ((1 − α)(k·c + 1))`` (:func:`flexigpt.generation.speculative_bound`). The
bound assumes what holds for memory-bound decoding: a forward of ``k + 1`` tokens costs
about one of a single token, since every weight is read once either way. Which product
honours that depends on the CPU's BLAS: on the AMD EPYC measured first, ``F.linear`` with 2-8
input rows cost 1.5-2.8× the one-row call (SmolLM2's LM head 44.6 ms for 2 rows against
15.9 ms for one) while ``(W @ xᵀ)ᵀ`` streamed the weight once (12.4 ms for 2 rows); on an
Intel Xeon it is the reverse (LM head: ``F.linear`` 4.2 ms for 2 rows, 4.1 for one;
``(W @ xᵀ)ᵀ`` 9.4 ms). :func:`few_row_linears` therefore times both forms once per process
(:func:`mm_form_is_faster`) and routes 2-8-row calls to ``(W @ xᵀ)ᵀ`` only where it wins;
one-row calls, and prompts of more rows, keep ``F.linear``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: ``F.linear`` calls with more than one and at most this many input rows take the
#: ``(W @ xᵀ)ᵀ`` form inside :func:`few_row_linears` (where that form is faster)
FEW_ROWS = 8

_MM_FASTER: dict[int, bool] = {}  # torch thread count -> the timing's verdict


def mm_form_is_faster() -> bool:
    """Whether ``(W @ xᵀ)ᵀ`` beats ``F.linear`` by ≥ 10 % for a 2-row product with a weight
    streamed from memory (two 8192 × 1024 fp32 weights, 32 MB each, used in turn), on the
    CPU at the current torch thread count. Timed once per thread count and process (best of
    5 interleaved pairs, ~0.1 s)."""
    threads = torch.get_num_threads()
    if threads not in _MM_FASTER:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(8192, 1024, generator=gen) for _ in range(2)]
        x = torch.randn(2, 1024, generator=gen)
        best = {"linear": float("inf"), "mm": float("inf")}
        with torch.inference_mode():
            for i in range(6):
                for form in ("linear", "mm"):
                    w = weights[i % 2]
                    tic = time.perf_counter()
                    F.linear(x, w) if form == "linear" else torch.mm(w, x.t()).t().contiguous()
                    if i:  # the first pair warms up
                        best[form] = min(best[form], time.perf_counter() - tic)
        _MM_FASTER[threads] = best["mm"] < 0.9 * best["linear"]
    return _MM_FASTER[threads]


@contextlib.contextmanager
def few_row_linears(max_rows: int = FEW_ROWS, route: bool | None = None) -> Iterator[None]:
    """Within the block, ``torch.nn.functional.linear`` of an input ``x [..., in]`` with
    ``1 < rows ≤ max_rows`` (rows = all but the last dim) computes ``(W @ xᵀ)ᵀ + b``
    (mathematically ``F.linear``; equal up to float summation order) when ``route`` is
    true; ``route`` None = where :func:`mm_form_is_faster` says so on this machine, False =
    ``F.linear`` untouched. Every ``nn.Linear`` and the adapters of
    :class:`~flexigpt.methods.sharing.SharedLoRALinear` call ``F.linear``. Not thread-safe:
    it swaps the module attribute for the duration."""
    if not (mm_form_is_faster() if route is None else route):
        yield
        return
    original = F.linear

    def linear(x: torch.Tensor, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() > 1 else 1
        if not 1 < rows <= max_rows:
            return original(x, weight, bias)
        y = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t()
        if bias is not None:
            y = y + bias
        return y.contiguous().view(*x.shape[:-1], weight.shape[0])

    F.linear = linear
    try:
        yield
    finally:
        F.linear = original


@dataclass
class DecodeResult:
    """New token ids of one prompt and what producing them took.

    ``rounds``, ``drafted``, ``accepted``, ``rejections`` count verification rounds
    (speculative only: ``rejections`` = rounds in which the model disagreed with a drafted
    token); ``full_forwards`` / ``draft_forwards`` count forward passes; ``prefill_s`` is the
    time of the model's first forward (the draft's prompt forward is decode-side work).
    """

    tokens: list[int]
    wall_s: float = 0.0
    prefill_s: float = 0.0
    full_forwards: int = 0
    draft_forwards: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    accepted_per_round: list[int] = field(default_factory=list)


def _step(model: nn.Module, ids: list[int] | torch.Tensor, cache: Any,
          device: torch.device) -> tuple[torch.Tensor, Any]:
    """One cached forward of ``ids`` (1-D); returns ``(logits [len(ids), vocab], cache)``."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.tensor(ids, dtype=torch.long, device=device)
    out = model(input_ids=ids.view(1, -1), cache=cache, use_cache=True)
    return out.logits[0], out.cache


def _pick(logits: torch.Tensor, suppress: set[int] | frozenset[int]) -> torch.Tensor:
    """Greedy token(s) of ``logits [..., vocab]``, never one of ``suppress``."""
    if suppress:
        logits = logits.clone()
        logits[..., sorted(suppress)] = float("-inf")
    return logits.argmax(-1)


def _crop(cache: Any, length: int) -> None:
    """Drop every cached position from ``length`` on."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _finish(tokens: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """``tokens`` cut at ``max_new_tokens`` and after the first EOS; whether decoding ends."""
    for i, tok in enumerate(tokens[:max_new_tokens]):
        if tok in eos_ids:
            return tokens[:i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


@torch.inference_mode()
@few_row_linears()
def greedy_decode(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
                  eos_ids: set[int] | frozenset[int] = frozenset(),
                  suppress_ids: set[int] | frozenset[int] = frozenset()) -> DecodeResult:
    """Plain greedy decoding of one prompt (``prompt_ids``: 1-D token ids) with a KV cache;
    ``eos_ids`` end it, ``suppress_ids`` are never generated."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    device = prompt_ids.device
    tic = time.perf_counter()
    logits, cache = _step(model, prompt_ids, None, device)
    res = DecodeResult(tokens=[int(_pick(logits[-1], suppress_ids))], full_forwards=1)
    res.prefill_s = time.perf_counter() - tic
    done = res.tokens[0] in eos_ids or max_new_tokens == 1
    while not done:
        logits, cache = _step(model, res.tokens[-1:], cache, device)
        res.full_forwards += 1
        res.tokens.append(int(_pick(logits[-1], suppress_ids)))
        done = res.tokens[-1] in eos_ids or len(res.tokens) >= max_new_tokens
    res.wall_s = time.perf_counter() - tic
    return res


@torch.inference_mode()
@few_row_linears()
def speculative_decode(model: nn.Module, draft: nn.Module, prompt_ids: torch.Tensor,
                       max_new_tokens: int, draft_length: int,
                       eos_ids: set[int] | frozenset[int] = frozenset(),
                       suppress_ids: set[int] | frozenset[int] = frozenset()) -> DecodeResult:
    """Greedy self-speculative decoding of one prompt (``prompt_ids``: 1-D token ids).

    ``draft`` is a causal LM over the same vocabulary (here: the model without its shared
    blocks, :func:`flexigpt.generation.draft.build_draft`); it proposes ``draft_length``
    tokens per round, the model verifies them in one forward. Returns the model's greedy
    continuation (cut after EOS / at ``max_new_tokens``; ``suppress_ids`` never generated,
    by the model or the draft) with the round statistics.
    """
    if max_new_tokens < 1 or draft_length < 1:
        raise ValueError(f"max_new_tokens and draft_length must be ≥ 1, got "
                         f"{max_new_tokens}, {draft_length}")
    device = prompt_ids.device
    k = int(draft_length)
    tic = time.perf_counter()
    logits, full_cache = _step(model, prompt_ids, None, device)
    res = DecodeResult(tokens=[int(_pick(logits[-1], suppress_ids))], full_forwards=1)
    res.prefill_s = time.perf_counter() - tic
    n_prompt = int(prompt_ids.shape[0])
    draft_cache = None
    pending: list[int] | torch.Tensor = prompt_ids  # what the draft has not seen yet
    res.tokens, done = _finish(res.tokens, max_new_tokens, eos_ids)
    while not done:
        # the draft proposes k tokens after everything generated so far
        if draft_cache is None:  # first round: the prompt and the first token at once
            pending = torch.cat([prompt_ids, prompt_ids.new_tensor(res.tokens)])
        proposal: list[int] = []
        for _ in range(k):
            d_logits, draft_cache = _step(draft, pending, draft_cache, device)
            pending = [int(_pick(d_logits[-1], suppress_ids))]
            proposal.append(pending[0])
        res.draft_forwards += k
        # the model scores the last accepted token and the k proposals in one forward
        v_logits, full_cache = _step(model, res.tokens[-1:] + proposal, full_cache, device)
        res.full_forwards += 1
        verdict = _pick(v_logits, suppress_ids).tolist()  # the model's next token per position
        n = 0
        while n < k and proposal[n] == verdict[n]:
            n += 1
        res.rounds += 1
        res.drafted += k
        res.accepted += n
        res.rejections += int(n < k)
        res.accepted_per_round.append(n)
        seen = n_prompt + len(res.tokens)  # sequence length before this round's tokens
        res.tokens, done = _finish(res.tokens + proposal[:n] + [verdict[n]], max_new_tokens,
                                   eos_ids)
        # the model's cache keeps the agreed prefix: everything but the new last token
        _crop(full_cache, seen + n)
        # the draft's cache holds the sequence before this round + proposal[:k-1]
        kept = min(n, k - 1)
        _crop(draft_cache, seen + kept)
        pending = res.tokens[seen - n_prompt + kept:] if not done else []
    res.wall_s = time.perf_counter() - tic
    return res
