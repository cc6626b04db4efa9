"""ReplaceMe's span rule against its authors' code (``benchmarks.check_official``).

The official pipeline cannot run end to end on a CPU (``lstsq.py`` allocates its normal
equations with ``device='cuda'``), but its metric functions do (``ReplaceMe/utils.py``:
``get_last_non_padded_tokens``, ``compute_block_distances``, ``select_non_overlapping_blocks``).
They are imported from a checkout given on the command line (nothing of them is copied
here) and driven by the loop of ``ReplaceMe/distance.py`` restated in :func:`official_span`
(batch, hidden states, last token, mean over batches).
"""

from __future__ import annotations

import contextlib
import io
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines.replaceme.span import angular_distances, choose_span, last_token_outputs


def _stub_missing(*names: str) -> None:
    """Empty modules for imports the span functions never use (``torchmin``, ``termcolor``)."""
    for name in names:
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.minimize = stub.colored = lambda *a, **k: None  # type: ignore[attr-defined]
            sys.modules[name] = stub


def official_span(checkout: Path, model: Any, windows: torch.Tensor, span: int,
                  batch_size: int) -> tuple[tuple[int, int], list[float]]:
    """``distance.py``'s loop with the official metric functions, then the block choice of
    ``lstsq.py`` (one transform, consecutive blocks merged)."""
    _stub_missing("torchmin", "termcolor")
    sys.path.insert(0, str(checkout))
    from ReplaceMe import utils as official

    per_batch: list[list[float]] = [[] for _ in range(model.config.num_hidden_layers - span)]
    for start in range(0, len(windows), batch_size):
        ids = windows[start:start + batch_size]
        mask = torch.ones_like(ids)
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        last = official.get_last_non_padded_tokens(hidden, mask)[1:]
        for i, d in enumerate(official.compute_block_distances(last, span)):
            per_batch[i].append(d)
    distances = [float(np.mean(d)) for d in per_batch]
    with contextlib.redirect_stdout(io.StringIO()):
        (block,) = official.select_non_overlapping_blocks(distances, span, num_blocks=1,
                                                          merge_consecutive=True)
    return (int(block[0]), int(block[1])), distances


def check(checkout: Path, model: Any, windows: torch.Tensor, span: int,
          batch_size: int) -> dict[str, Any]:
    """Both chosen block ranges on ``model`` and ``windows`` ([N, T] token ids), whether they
    agree, and the largest difference between the per-start distances."""
    block, dist = official_span(checkout, model, windows, span, batch_size)
    ours = angular_distances(last_token_outputs(model, windows, batch_size), span)
    mine = choose_span(ours, span)
    return {"official_blocks": list(block), "ours_blocks": list(mine),
            "same_span": tuple(block) == tuple(mine),
            "max_abs_distance_diff": max(abs(a - b) for a, b in zip(dist, ours.tolist()))}
