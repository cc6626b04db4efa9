"""Check the ReplaceMe, LLM-Streamline and LinearPatch span rules against the official code.

The official repositories cannot run end to end here (ReplaceMe's ``lstsq.py`` allocates its
normal equations with ``device='cuda'``; both pipelines read calibration text from the
Hugging Face hub), but the functions that *choose the span* run on a CPU: LLM-Streamline's
``LLM_Streamline/get_cosine.py:get_cosine_similarity`` as it is, and ReplaceMe's metric
functions (``ReplaceMe/utils.py``: ``get_last_non_padded_tokens``, ``compute_block_distances``,
``select_non_overlapping_blocks``) driven by the loop of ``ReplaceMe/distance.py`` restated in
:func:`official_replaceme_span` (batch, hidden states, last token, mean over batches). This
script imports them from checkouts given on the command line (nothing of theirs is copied
into this repository), runs them and this harness's ``span.py`` on the same random tiny
models and windows, and prints per family whether the chosen spans agree and how far the
per-span scores differ. LinearPatch (``layer_select.py``: ``get_pruned_layer_with_cosine``,
``get_scale_params``, run on the model in float16 as the official code computes its
rotation in half precision, on 128 single-window batches: it divides by 128 whatever it is
given): the span, the per-start similarities, and the channel scales computed by this
harness with the official Hadamard matrix substituted for its own (both are Hadamard
rotations but not the same matrix, so the patches differ in basis; the substitution checks
the arithmetic).

Example::

    python -m benchmarks.check_official --replaceme ../ReplaceMe --streamline ../LLM-Streamline \\
        --families llama qwen2 mistral opt model --json results/reference/check_official.json
    python -m benchmarks.check_official --linearpatch ../LinearPatch --families llama qwen2 \\
        --windows 128 --json results/reference/check_official_linearpatch.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent

import baselines.linearpatch.span as linearpatch  # noqa: E402
from baselines.replaceme.span import angular_distances, last_token_outputs  # noqa: E402
from baselines.replaceme.span import choose_span as replaceme_span  # noqa: E402
from baselines.streamline.span import choose_span as streamline_span  # noqa: E402
from baselines.streamline.span import span_similarities  # noqa: E402
from flexigpt.storage.models.tiny import make_model  # noqa: E402


def _stub_missing(*names: str) -> None:
    """Empty modules for imports the span functions never use (``torchmin``, ``termcolor``)."""
    for name in names:
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.minimize = stub.colored = lambda *a, **k: None  # type: ignore[attr-defined]
            sys.modules[name] = stub


def official_streamline_span(checkout: Path, model: Any, windows: torch.Tensor,
                             span: int) -> tuple[int, list[float]]:
    """``get_cosine_similarity`` on every window (its random subset replaced by all of them);
    returns its best hidden-state index and the similarities it prints (4 decimals)."""
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


def official_replaceme_span(checkout: Path, model: Any, windows: torch.Tensor, span: int,
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


def official_linearpatch(checkout: Path, model: Any, windows: torch.Tensor, span: int,
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
        sims = [float(official_sim) for official_sim in _official_sims(official, model, loader,
                                                                        span)]
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


def _model_and_windows(family: str, args: argparse.Namespace) -> tuple[Any, torch.Tensor]:
    """A random tiny model of ``family`` and random token windows, or (``family`` = ``model``)
    the checkpoint ``--model`` and windows of ``--text``."""
    if family == "model":
        from flexigpt.methods.calibration import token_windows
        from flexigpt.storage.models.loading import load_model

        model, tok = load_model(args.model)
        return model, token_windows(args.text, tok, args.seq_len, args.windows, seed=args.seed)
    model = make_model(family=family, layers=args.layers, seed=args.seed)
    g = torch.Generator().manual_seed(args.seed)
    return model, torch.randint(3, 300, (args.windows, args.seq_len), generator=g)


def check(family: str, args: argparse.Namespace) -> dict[str, Any]:
    model, windows = _model_and_windows(family, args)
    span = args.model_span if family == "model" else args.span
    row: dict[str, Any] = {"family": family if family != "model" else Path(args.model).name,
                           "layers": model.config.num_hidden_layers, "span": span,
                           "windows": len(windows), "seq_len": windows.shape[1], "seed": args.seed}
    if args.streamline:
        best, sims = official_streamline_span(Path(args.streamline), model, windows, span)
        ours = span_similarities(model, windows, span, args.batch_size)
        start, _ = streamline_span(ours, span)
        row["streamline"] = {"official_start": best, "ours_start": start,
                             "same_span": best == start,
                             "max_abs_similarity_diff": max(abs(a - b) for a, b in
                                                            zip(sims, ours.tolist()))}
    if args.linearpatch:
        model = model.half()
        best, sims, scales, h = official_linearpatch(Path(args.linearpatch), model, windows, span)
        lp_sims = linearpatch.span_similarities(model, windows, span, args.batch_size)
        lp_start, _ = linearpatch.choose_span(lp_sims, span)
        own = linearpatch.hadamard
        linearpatch.hadamard = lambda n: h.double()
        try:
            lp_scales = linearpatch.channel_scales(model, windows, best, best + span, True,
                                                   args.batch_size)
        finally:
            linearpatch.hadamard = own
        row["linearpatch"] = {"official_start": best, "ours_start": lp_start,
                              "same_span": best == lp_start,
                              "max_abs_similarity_diff": max(abs(a - b) for a, b in
                                                             zip(sims, lp_sims.values())),
                              "max_rel_scale_diff": float(((lp_scales - scales).abs()
                                                           / scales.abs()).max())}
    if args.replaceme:
        block, dist = official_replaceme_span(Path(args.replaceme), model, windows, span,
                                              args.batch_size)
        ours = angular_distances(last_token_outputs(model, windows, args.batch_size), span)
        mine = replaceme_span(ours, span)
        row["replaceme"] = {"official_blocks": list(block), "ours_blocks": list(mine),
                            "same_span": tuple(block) == tuple(mine),
                            "max_abs_distance_diff": max(abs(a - b) for a, b in
                                                         zip(dist, ours.tolist()))}
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replaceme", help="a checkout of github.com/mts-ai/ReplaceMe")
    p.add_argument("--streamline", help="a checkout of github.com/RUCKBReasoning/LLM-Streamline")
    p.add_argument("--linearpatch", help="a checkout of github.com/chenxinrui-tsinghua/LinearPatch")
    p.add_argument("--families", nargs="+", default=["llama", "qwen2", "mistral", "opt"],
                   help="tiny random models of these families; 'model' = the checkpoint --model")
    p.add_argument("--model", default=str(ROOT / "resources/models/smollm2-135m"))
    p.add_argument("--text", default=str(ROOT / "resources/text/wiki/train.txt"))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--span", type=int, default=3, help="blocks removed from the tiny models")
    p.add_argument("--model-span", type=int, default=12,
                   help="blocks removed from --model (12 of SmolLM2's 30: the 30 %% runs)")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if not (args.replaceme or args.streamline or args.linearpatch):
        p.error("give --replaceme, --streamline and/or --linearpatch")
    torch.set_num_threads(1)
    rows = [check(f, args) for f in args.families]
    text = json.dumps(rows, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    same = all(v["same_span"] for r in rows for v in r.values() if isinstance(v, dict))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
