"""Check the methods' span rules against their authors' code, where a method declares one.

A method whose facts name an ``official_check`` (ReplaceMe, LLM-Streamline and LinearPatch
today) gets a ``--<method key>`` flag here taking a checkout of its ``official_code``; the
comparison itself lives in the method's folder (``baselines/<name>/official.py``): the
official pipelines cannot run end to end here (ReplaceMe's ``lstsq.py`` allocates with
``device='cuda'``; every pipeline reads calibration text from the Hugging Face hub), but the
functions that *choose the span* run on a CPU. Each check imports them from the checkout
(nothing of theirs is copied into this repository), runs them and this harness's rule on the
same random tiny models and windows (or the checkpoint ``--model``, family ``model``), and
this script prints per family whether the chosen spans agree and how far the per-span scores
differ. It exits 1 when any span differs.

Example::

    python -m benchmarks.check_official --replaceme ../ReplaceMe --streamline ../LLM-Streamline \\
        --families llama qwen2 mistral opt model --json results/reference/check_official.json
    python -m benchmarks.check_official --linearpatch ../LinearPatch --families llama qwen2 \\
        --windows 128 --json results/reference/check_official_linearpatch.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from flexigpt.storage.models.tiny import make_model
from flexigpt.storage.registry import METHODS, load_target

ROOT = Path(__file__).resolve().parent.parent
#: the methods with a check against their authors' code, in table order
CHECKED = tuple(key for key, facts in METHODS.items() if facts.official_check)


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


def check(family: str, checkouts: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    """One row: the model's facts, then per checked method (key) its method's comparison."""
    model, windows = _model_and_windows(family, args)
    span = args.model_span if family == "model" else args.span
    row: dict[str, Any] = {"family": family if family != "model" else Path(args.model).name,
                           "layers": model.config.num_hidden_layers, "span": span,
                           "windows": len(windows), "seq_len": windows.shape[1], "seed": args.seed}
    for key, checkout in checkouts.items():
        compare = load_target(METHODS[key].official_check or "")
        row[key] = compare(checkout, model, windows, span, args.batch_size)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key in CHECKED:
        p.add_argument(f"--{key}", type=Path, metavar="CHECKOUT",
                       help=f"a checkout of github.com/{METHODS[key].official_code}")
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
    checkouts = {key: getattr(args, key) for key in CHECKED if getattr(args, key)}
    if not checkouts:
        p.error("give a checkout: " + ", ".join(f"--{key}" for key in CHECKED))
    torch.set_num_threads(1)
    rows = [check(f, checkouts, args) for f in args.families]
    text = json.dumps(rows, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    same = all(v["same_span"] for r in rows for v in r.values() if isinstance(v, dict))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
