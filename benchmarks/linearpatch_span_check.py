"""What does each part of LinearPatch do to one span of one model? Skip vs diagonal vs rotated.

For the span ``[start, end)`` (e.g. the one a run chose: its manifest's ``info.span``), prints
and writes as JSON the perplexity on ``--test-windows`` windows of the validation text of:
the unpruned model; the span skipped (nothing in its place); the diagonal patch (``rotate``
false: per-channel scales); the rotated patch (``P = H diag(s) Hᵀ``, the default). Scales are
measured on ``--windows`` calibration windows with the method's own functions; the largest
input magnitudes at the span's two ends (the "massive activations" a rotation spreads over
every channel) are listed beside them. Used to tell a defect of the code from a property of
the method on a model (Gemma 3 270M: results/reference/gemma3-270m/RUN.md)::

    python -m benchmarks.linearpatch_span_check --model resources/models/gemma3-270m \\
        --start 5 --end 11 --json results/reference/gemma3-270m/linearpatch_span_check.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

from baselines.linearpatch.replay import LinearPatchLayer
from baselines.linearpatch.span import block_inputs, channel_scales, patch_matrix
from flexigpt.methods.calibration import token_windows
from flexigpt.storage.models.adapters import get_adapter
from flexigpt.storage.models.loading import load_model


def perplexity(model: nn.Module, windows: torch.Tensor) -> float:
    """exp of the mean next-token loss over ``windows`` ``[N, T]``."""
    with torch.no_grad():
        return math.exp(float(model(input_ids=windows, labels=windows).loss))


def with_span(model: nn.Module, start: int, end: int, patch: nn.Module | None) -> nn.Module:
    """A copy of ``model`` with blocks ``start … end − 1`` replaced by ``patch`` (or nothing)."""
    out = copy.deepcopy(model)
    adapter = get_adapter(out)
    blocks = list(adapter.layers(out))
    adapter.set_layers(out, [*blocks[:start], *([patch] if patch else []), *blocks[end:]])
    return out


def patch_of(model: nn.Module, calib: torch.Tensor, start: int, end: int,
             rotate: bool) -> tuple[nn.Module, torch.Tensor]:
    """The method's patch for the span, its scales measured on ``calib``."""
    scales = channel_scales(model, calib, start, end, rotate, batch_size=4)
    config: Any = model.config  # an HF config
    patch = LinearPatchLayer(int(config.hidden_size), rotate)
    with torch.no_grad():
        if rotate:
            patch.patch.weight.copy_(patch_matrix(scales, rotate=True))
        else:
            patch.scale.copy_(scales)
    return patch, scales


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--start", type=int, required=True)
    p.add_argument("--end", type=int, required=True, help="first block kept after the span")
    p.add_argument("--calibration", default="resources/text/wiki/train.txt")
    p.add_argument("--test", default="resources/text/wiki/validation.txt")
    p.add_argument("--windows", type=int, default=8, help="calibration windows for the scales")
    p.add_argument("--test-windows", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--bos", action="store_true", help="BOS first in every window (Gemma)")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    torch.set_num_threads(1)
    model, tok = load_model(args.model)
    calib = token_windows(args.calibration, tok, args.seq_len, n_windows=args.windows, seed=0)
    test = token_windows(args.test, tok, args.seq_len, n_windows=args.test_windows)
    bos = getattr(tok, "bos_token_id", None)
    if args.bos and bos is not None:
        calib[:, 0], test[:, 0] = bos, bos
    ends: dict[str, Any] = {}
    for states in block_inputs(model, [args.start, args.end], calib[:2], 2):
        for name, block in (("start", args.start), ("end", args.end)):
            top = states[block].double().abs().amax(dim=(0, 1)).topk(3)
            ends[name] = {"block": block, "channels": top.indices.tolist(),
                          "max_abs": [round(v, 1) for v in top.values.tolist()],
                          "mean_abs": round(float(states[block].double().abs().mean()), 3)}
    report: dict[str, Any] = {"model": args.model, "span": [args.start, args.end],
                              "test_windows": args.test_windows, "seq_len": args.seq_len,
                              "calibration_windows": args.windows, "bos": args.bos,
                              "inputs": ends, "machine": platform.processor() or platform.machine(),
                              "ppl": {"unpruned": perplexity(model, test),
                                      "skip": perplexity(with_span(model, args.start, args.end,
                                                                   None), test)}}
    for name, rotate in (("diagonal", False), ("rotated", True)):
        patch, scales = patch_of(model, calib, args.start, args.end, rotate)
        report["ppl"][name] = perplexity(with_span(model, args.start, args.end, patch), test)
        report[f"{name}_scale_range"] = [round(float(scales.min()), 4),
                                         round(float(scales.max()), 4)]
    report["ppl"] = {k: float(f"{v:.4g}") for k, v in report["ppl"].items()}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
