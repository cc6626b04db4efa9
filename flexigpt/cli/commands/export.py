"""flexigpt export: write a saved model as a stock ``*ForCausalLM`` checkpoint where exact.

``flexigpt export DIR --out OUT`` writes ``OUT`` (config, safetensors, tokenizer, README.md,
export.json) loadable with plain ``AutoModelForCausalLM.from_pretrained(OUT)``, checked to
give ``flexigpt.load_compressed(DIR)``'s logits. Models without an exact plain form
(FlexiGPT output norm, SliceGPT, per-layer LLM-Pruner widths) are refused with the reason
and exit code 2; see ``flexigpt/export/plain.py``. ``--card [--result JSON]`` instead
(re)writes DIR's README.md model card, with the scores of an evaluation result JSON.
"""

from __future__ import annotations

import argparse
import sys

HELP = "export a saved model as a plain transformers checkpoint (where exact), or its card"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", help="a saved model directory (any method's output)")
    p.add_argument("--out", help="output directory of the plain checkpoint")
    p.add_argument("--unshare", action="store_true",
                   help="FlexiGPT without output norm: merge W_base + B·A into every block "
                        "(exact, but the export has the dense parameter count)")
    p.add_argument("--dtype", default="float32", help="dtype of the exported weights")
    p.add_argument("--atol", type=float, default=1e-5,
                   help="largest allowed |Δ logit| between export and source")
    p.add_argument("--card", action="store_true",
                   help="(re)write MODEL_DIR/README.md instead of exporting")
    p.add_argument("--result", help="with --card: an evaluation result JSON to add scores from")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it is not a previous export")


def run(args: argparse.Namespace) -> int:
    from flexigpt.export.card import write_model_card
    from flexigpt.export.plain import NotExportable, export_plain

    if args.atol < 0:
        raise ValueError(f"--atol must be >= 0, got {args.atol!r}")
    if args.card:
        if args.result:  # parsed and checked as `flexigpt tables` would, before any write
            from flexigpt.tables.collect import parse_result

            parse_result(args.result)
        print(f"-> {write_model_card(args.model_dir, args.result)}")
        return 0
    if args.result:
        raise ValueError("--result needs --card")
    if not args.out:
        raise ValueError("--out is required (or --card)")
    try:
        record = export_plain(args.model_dir, args.out, unshare=args.unshare, dtype=args.dtype,
                              atol=args.atol, force=args.force)
    except NotExportable as err:
        print(f"cannot export {args.model_dir} as a plain checkpoint: {err}", file=sys.stderr)
        return 2
    print(f"{record['method']} -> {record['architecture']} ({record['how']}); "
          f"{record['parameters']:,} parameters, max |Δ logit| {record['max_abs_logit_diff']:.2g}"
          f"\n-> {args.out}")
    return 0
