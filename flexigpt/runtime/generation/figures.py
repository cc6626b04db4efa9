"""The figures a decoding run reports: rates from its sums, the expected speed-up of
speculative decoding, the weight bytes one decode step reads, and the process's resident
memory."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from torch import nn


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Expected speed-up of speculative decoding over plain decoding:
    ``(1 − α^(k+1)) / ((1 − α)(k·c + 1))`` (Leviathan et al. 2023, Thm 3.8), with α the
    per-token acceptance probability, k the draft length and c the draft/full cost ratio.

    An expectation under the analysis' assumptions (independent acceptances, a ``k + 1``
    token forward costing one token's), not an upper limit: measured speed-ups can exceed it.
    The measurements report it as ``bound`` (:func:`flexigpt.runtime.generation.measure.measure_decode`).
    """
    tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (k * c + 1)


def decode_rates(sums: Mapping[str, float], batch_size: int = 1) -> dict[str, float]:
    """The rates of a decoding run, from its sums (one home for every path that reports them:
    transformers' ``generate``, our lean loops, and chunked runs combined in
    :func:`flexigpt.runtime.generation.measure.combine`).

    ``sums`` holds ``new_tokens`` and ``wall_s``; plain runs add ``decode_s`` and
    ``decode_steps`` (forwards after the first, one token per sequence of the batch),
    speculative runs ``rounds``, ``drafted``, ``accepted`` and ``rejections``. Returns
    ``tokens_per_s``, then ``per_token_ms`` and ``decode_tokens_per_s`` (plain) or ``alpha``
    (accepted / (accepted + rejections): the per-token acceptance probability's
    maximum-likelihood estimate), ``accepted_fraction`` (of drafted tokens) and
    ``tokens_per_round`` (speculative); NaN where a count is 0."""
    def ratio(num: float, den: float, scale: float = 1.0) -> float:
        return scale * num / den if den > 0 else math.nan

    out = {"tokens_per_s": ratio(sums["new_tokens"], sums["wall_s"])}
    if "decode_steps" in sums:
        steps = sums["decode_steps"]
        out["per_token_ms"] = ratio(sums["decode_s"], steps, 1e3)
        out["decode_tokens_per_s"] = (ratio(steps * batch_size, sums["decode_s"]) if steps
                                      else math.nan)
    if "rounds" in sums:
        accepted = sums["accepted"]
        out["alpha"] = ratio(accepted, accepted + sums["rejections"])
        out["accepted_fraction"] = ratio(accepted, sums["drafted"])
        out["tokens_per_round"] = ratio(sums["new_tokens"], sums["rounds"])
    return out


def weight_reads_per_token(model: nn.Module) -> int:
    """Bytes of parameters one decode step of one sequence reads: every module's own
    parameters once per place the module is used (a base linear that also serves replacement
    blocks counts at each use, as the forward reads it again), an embedding one row (the
    token's; a tied LM head still reads the whole matrix as a linear). Buffers and the KV
    cache are left out. Where decoding streams its weights from memory, the ratio of two
    models' figures is the floor of their per-token latency ratio."""
    total = 0
    for _, module in model.named_modules(remove_duplicate=False):
        for param in module.parameters(recurse=False):
            if isinstance(module, nn.Embedding):
                total += param.shape[-1] * param.element_size()
            else:
                total += param.numel() * param.element_size()
    return total


def rss_bytes() -> int:
    """Resident set size of this process in bytes (0 where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0
