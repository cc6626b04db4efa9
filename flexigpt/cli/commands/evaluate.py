"""flexigpt evaluate: perplexity + zero-shot lm-eval tasks of one model into a result JSON."""

from __future__ import annotations

import argparse

HELP = "evaluate a saved model (perplexity + zero-shot tasks) into one result JSON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from flexigpt.cli.commands import add_device_argument
    from flexigpt.runtime.evaluation.tasks import PAPER_TASKS

    p.add_argument("--model", required=True, help="model dir (any method's output, a plain "
                                                  "HF checkpoint) or hub id")
    p.add_argument("--out", required=True, help="result JSON path")
    p.add_argument("--tasks", default=",".join(PAPER_TASKS),
                   help="comma-separated lm-eval tasks ('' for perplexity only)")
    p.add_argument("--limit", type=int, help="first N docs per task (default: full split)")
    p.add_argument("--source", choices=("local", "hub"), default="local",
                   help="task data: local jsonl files or lm-eval's hub datasets")
    p.add_argument("--tasks-dir", default="resources/tasks",
                   help="folder of the task data, <task>/<split>.jsonl (source local; "
                        "`flexigpt fetch tasks` builds resources/tasks; '' for none)")
    p.add_argument("--benchmarks", help=argparse.SUPPRESS)  # the old name, refused by name
    p.add_argument("--ppl-text", default="resources/text/wiki/validation.txt",
                   help="held-out text for perplexity ('' to skip, as --no-ppl)")
    p.add_argument("--no-ppl", action="store_true", help="skip perplexity")
    p.add_argument("--ppl-seq-len", type=int, default=2048, help="perplexity window length")
    p.add_argument("--ppl-windows", type=int, help="number of windows (default: all)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--backend", choices=("fast", "hf"), default="fast",
                   help="fast: exact prefix-shared scorer; hf: stock lm-eval HFLM")
    p.add_argument("--bf16", action="store_true", help="fast backend: bf16 autocast")
    p.add_argument("--add-bos-token", action="store_true", help="prepend BOS in lm-eval")
    p.add_argument("--dtype", default="float32")
    add_device_argument(p)
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="label copied into the JSON (JSON value or string); repeatable")


def check_flags(args: argparse.Namespace) -> None:
    """Every count-like flag is a positive integer (``ValueError`` naming the flag); the
    old ``--benchmarks`` is refused with its new name."""
    from flexigpt.api.values import check_count

    if args.benchmarks is not None:
        raise ValueError("--benchmarks was renamed --tasks-dir (the folder of the task data, "
                         "<task>/<split>.jsonl)")
    for flag, value in (("--limit", args.limit), ("--ppl-windows", args.ppl_windows)):
        if value is not None:
            check_count(value, flag)
    check_count(args.ppl_seq_len, "--ppl-seq-len", minimum=2)
    check_count(args.batch_size, "--batch-size")


def run(args: argparse.Namespace) -> int:
    from flexigpt.cli.commands import parse_key_values
    from flexigpt.runtime.evaluation.results import evaluate_model

    check_flags(args)
    result = evaluate_model(
        args.model, args.out, tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
        limit=args.limit, source=args.source, tasks_dir=args.tasks_dir,
        ppl_text=None if args.no_ppl else args.ppl_text, ppl_seq_len=args.ppl_seq_len,
        ppl_windows=args.ppl_windows, batch_size=args.batch_size, backend=args.backend,
        dtype=args.dtype, device=args.device, add_bos_token=args.add_bos_token,
        autocast_dtype="bfloat16" if args.bf16 else None, labels=parse_key_values(args.label, "--label"))
    if result["perplexity"] is not None:
        print(f"perplexity {result['perplexity']['value']:.4f}")
    for task, entry in result["tasks"].items():
        print(f"{task}: {entry['metric']} {entry['value']:.4f} ± {entry['stderr'] or 0:.4f} "
              f"({entry['n_docs']} docs, {entry['seconds']:.1f} s)")
    print(f"-> {args.out}")
    return 0
