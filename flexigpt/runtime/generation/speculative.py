"""Greedy decoding loops of our own: plain, and self-speculative with a weight-sharing draft.

Transformers' assisted generation calls the draft's whole ``generate`` once per round (its
set-up, logits processors and stopping criteria every time) and re-slices both caches; on a
small CPU model whose decode step is tens of milliseconds that overhead costs as much as the
speed-up the draft buys (measured: 48-50 % of the expected speed-up). These loops do only what the
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

Cost per round: ``k`` draft forwards + one model forward, the ``(k·c + 1)`` of the
expected speed-up ``(1 − α^(k+1)) / ((1 − α)(k·c + 1))``
(:func:`flexigpt.runtime.generation.figures.expected_speedup`), which assumes that a forward of
``k + 1`` tokens costs about one of a single token. Where the CPU's BLAS breaks that for
``F.linear`` of a few rows, the loops route the few-row products of the model's (and the
draft's) own linears to ``(W @ xᵀ)ᵀ`` for the duration of the call
(:func:`flexigpt.runtime.generation.few_rows.routed_linears`): the decision is the ``route``
argument (default: :func:`~flexigpt.runtime.generation.few_rows.few_row_route` of the prompt's
device, never on CUDA) and is recorded in ``DecodeResult.few_row_route``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from flexigpt.runtime.generation.few_rows import few_row_route, routed_linears


@dataclass
class DecodeResult:
    """New token ids of one prompt and what producing them took.

    ``rounds``, ``drafted``, ``accepted``, ``rejections`` count verification rounds
    (speculative only: ``rejections`` = rounds in which the model disagreed with a drafted
    token); ``full_forwards`` / ``draft_forwards`` count forward passes; ``prefill_s`` is the
    time of the model's first forward (the draft's prompt forward is decode-side work);
    ``few_row_route`` is the loops' few-row linear routing decision
    (:mod:`flexigpt.runtime.generation.few_rows`).
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
    few_row_route: bool = False


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


def _finish(tokens: list[int], max_new_tokens: int,
            eos_ids: set[int] | frozenset[int]) -> tuple[list[int], bool]:
    """``tokens`` cut at ``max_new_tokens`` and after the first EOS; whether decoding ends."""
    for i, tok in enumerate(tokens[:max_new_tokens]):
        if tok in eos_ids:
            return tokens[:i + 1], True
    return tokens[:max_new_tokens], len(tokens) >= max_new_tokens


def _decide(route: bool | None, device: torch.device) -> bool:
    """The few-row routing of a decode call: ``route`` as given, else :func:`few_row_route`
    of ``device``."""
    return few_row_route(device) if route is None else bool(route)


@torch.inference_mode()
def greedy_decode(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
                  eos_ids: set[int] | frozenset[int] = frozenset(),
                  suppress_ids: set[int] | frozenset[int] = frozenset(),
                  route: bool | None = None) -> DecodeResult:
    """Plain greedy decoding of one prompt (``prompt_ids``: 1-D token ids) with a KV cache;
    ``eos_ids`` end it, ``suppress_ids`` are never generated. ``route``: whether the model's
    few-row linears take ``(W @ xᵀ)ᵀ`` (:func:`~flexigpt.runtime.generation.few_rows.routed_linears`;
    None: :func:`~flexigpt.runtime.generation.few_rows.few_row_route` of the prompt's device)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    route = _decide(route, prompt_ids.device)
    with routed_linears([model], route):
        res = _greedy(model, prompt_ids, max_new_tokens, eos_ids, suppress_ids)
    res.few_row_route = route
    return res


def _greedy(model: nn.Module, prompt_ids: torch.Tensor, max_new_tokens: int,
            eos_ids: set[int] | frozenset[int],
            suppress_ids: set[int] | frozenset[int]) -> DecodeResult:
    """The loop of :func:`greedy_decode`."""
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
def speculative_decode(model: nn.Module, draft: nn.Module, prompt_ids: torch.Tensor,
                       max_new_tokens: int, draft_length: int,
                       eos_ids: set[int] | frozenset[int] = frozenset(),
                       suppress_ids: set[int] | frozenset[int] = frozenset(),
                       route: bool | None = None) -> DecodeResult:
    """Greedy self-speculative decoding of one prompt (``prompt_ids``: 1-D token ids).

    ``draft`` is a causal LM over the same vocabulary (here: the model without its shared
    blocks, :func:`flexigpt.runtime.generation.draft.build_draft`); it proposes ``draft_length``
    tokens per round, the model verifies them in one forward. Returns the model's greedy
    continuation (cut after EOS / at ``max_new_tokens``; ``suppress_ids`` never generated,
    by the model or the draft) with the round statistics. ``route`` as in
    :func:`greedy_decode`, for the model's and the draft's linears.
    """
    if max_new_tokens < 1 or draft_length < 1:
        raise ValueError(f"max_new_tokens and draft_length must be ≥ 1, got "
                         f"{max_new_tokens}, {draft_length}")
    route = _decide(route, prompt_ids.device)
    with routed_linears([model, draft], route):
        res = _speculative(model, draft, prompt_ids, max_new_tokens, int(draft_length),
                           eos_ids, suppress_ids)
    res.few_row_route = route
    return res


def _speculative(model: nn.Module, draft: nn.Module, prompt_ids: torch.Tensor,
                 max_new_tokens: int, k: int, eos_ids: set[int] | frozenset[int],
                 suppress_ids: set[int] | frozenset[int]) -> DecodeResult:
    """The loop of :func:`speculative_decode` (``k``: the draft length)."""
    device = prompt_ids.device
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
