"""LLM-Streamline's span rule against its authors' code (``benchmarks.check_official``).

``LLM_Streamline/get_cosine.py:get_cosine_similarity`` runs on a CPU as it is; it is imported
from a checkout given on the command line (nothing of it is copied here), its random window
subset replaced by every window, and its printed similarities compared with
:func:`baselines.streamline.span.span_similarities`.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path
from typing import Any

import torch

from baselines.streamline.span import choose_span, span_similarities


def official_span(checkout: Path, model: Any, windows: torch.Tensor,
                  span: int) -> tuple[int, list[float]]:
    """``get_cosine_similarity`` on every window; returns its best hidden-state index and the
    similarities it prints (4 decimals)."""
    sys.path.insert(0, str(checkout))
    import LLM_Streamline.get_cosine as official

    official.generate_unique_index = lambda start, end, length: list(range(length))
    data = [{"input_ids": w.tolist()} for w in windows] + [{"input_ids": windows[0].tolist()}]
    layers = model.config.num_hidden_layers
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        best = official.get_cosine_similarity(model, data, len(windows), "cpu", span, layers)
    sims = [float(v) for v in re.findall(r"and hidden_states \d+ is ([0-9.]+)", out.getvalue())]
    return int(best), sims


def check(checkout: Path, model: Any, windows: torch.Tensor, span: int,
          batch_size: int) -> dict[str, Any]:
    """Both span starts on ``model`` and ``windows`` ([N, T] token ids), whether they agree,
    and the largest difference between the per-start similarities."""
    best, sims = official_span(checkout, model, windows, span)
    ours = span_similarities(model, windows, span, batch_size)
    start, _ = choose_span(ours, span)
    return {"official_start": best, "ours_start": start, "same_span": best == start,
            "max_abs_similarity_diff": max(abs(a - b) for a, b in zip(sims, ours.tolist()))}
