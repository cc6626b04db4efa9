"""LinearPatch's span rule and channel scales against its authors' code
(``benchmarks.check_official``).

``layer_select.py``'s ``get_pruned_layer_with_cosine`` and ``get_scale_params`` are imported
from a checkout given on the command line (nothing of them is copied here) and run on the
model in float16, as the official code computes its rotation in half precision, on
single-window batches (it divides by 128 whatever it is given). Compared: the span, the
per-start similarities, and the channel scales computed by :mod:`baselines.linearpatch.span`
with the official Hadamard matrix substituted for this folder's own (both are Hadamard
rotations but not the same matrix, so the patches differ in basis; the substitution checks
the arithmetic).
"""

from __future__ import annotations

import contextlib
import copy
import io
import sys
from pathlib import Path
from typing import Any

import torch

import baselines.linearpatch.span as ours


def official_span(checkout: Path, model: Any, windows: torch.Tensor, span: int,
                  ) -> tuple[int, list[float], torch.Tensor, torch.Tensor]:
    """The official span start, its per-start similarities (index 1 …), its channel scales
    on the chosen span, and its Hadamard matrix of the model's width."""
    sys.path.insert(0, str(checkout))
    import layer_select as official
    from rotate_utils.hadamard_utils import get_hadamard_matrix

    loader = [(w[None],) for w in windows]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        _, start, _, _ = official.get_pruned_layer_with_cosine(model, loader, span, "cpu")
        sims = [float(s) for s in _official_sims(official, model, loader, span)]
        scales = official.get_scale_params(model, loader, start, start + span, True, "cpu")
    h = get_hadamard_matrix(model.config.hidden_size, "cpu")
    return int(start), sims, scales.double().flatten(), h


def _official_sims(official: Any, model: Any, loader: list, span: int) -> list[float]:
    """The official similarities per start 1 … (its function returns only the maximum): the
    same hooks and sums, read from its ``cosine_similarity`` calls."""
    recorded: list[torch.Tensor] = []
    real = torch.cosine_similarity

    def spy(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        value = real(a, b, *args, **kwargs)
        recorded.append(value.mean().double())
        return value

    torch.cosine_similarity = spy  # type: ignore[assignment]
    try:
        official.get_pruned_layer_with_cosine(model, loader, span, "cpu")
    finally:
        torch.cosine_similarity = real
    starts = len(recorded) // len(loader)
    per = torch.stack(recorded).view(len(loader), starts)
    return (per.sum(0) / len(loader)).tolist()


def check(checkout: Path, model: Any, windows: torch.Tensor, span: int,
          batch_size: int) -> dict[str, Any]:
    """Both span starts on a float16 copy of ``model`` (the caller's model is left as it
    is), whether they agree, the largest difference between the per-start similarities, and
    the largest relative difference between the channel scales of the official span."""
    half = copy.deepcopy(model).half()
    best, sims, scales, h = official_span(checkout, half, windows, span)
    lp_sims = ours.span_similarities(half, windows, span, batch_size)
    lp_start, _ = ours.choose_span(lp_sims, span)
    own = ours.hadamard
    ours.hadamard = lambda n: h.double()
    try:
        lp_scales = ours.channel_scales(half, windows, best, best + span, True, batch_size)
    finally:
        ours.hadamard = own
    return {"official_start": best, "ours_start": lp_start, "same_span": best == lp_start,
            "max_abs_similarity_diff": max(abs(a - b) for a, b in zip(sims, lp_sims.values())),
            "max_rel_scale_diff": float(((lp_scales - scales).abs() / scales.abs()).max())}
