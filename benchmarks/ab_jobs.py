"""One recovery sweep or one final evaluation of a DAG run's models, timed in this process,
with the weights' or scores' fingerprint: run it once per commit (``PYTHONPATH`` = that
commit's worktree), interleaved, to compare the two commits' job time on the same inputs and
check that the results are identical (issue 51's before/after figures).

``--mode train`` sweeps the run's LR grid of two trials from its ``compressed/`` model with
the run's own training config (read from ``trained/manifest.json``) cut to ``--tokens``
tokens, the rung at half of the steps; ``--mode eval`` scores its ``trained/`` model on the
perplexity windows and the five zero-shot tasks as the DAG's final evaluation does. One JSON
line per call: the code's path, seconds, process CPU seconds, load average and either the
kept weights' sha256 and every trial's record, or the scores, perplexity and the records'
sha256 (documents and windows).

``--summary AB.JSONL`` reads such lines back: per mode and code path, the seconds of each
call, their mean, the change against the first code path seen, the mean CPU seconds, and
whether every call's fingerprint (weights and trial records, or scores and records) is the
same.

Example (two worktrees, before and after; alternate the order between pairs)::

    for code in /tmp/before /work/main /work/main /tmp/before; do
        PYTHONPATH=$code python benchmarks/ab_jobs.py --mode train \
            --results results --run smollm2-135m/shortgpt_lora/default/r0.3 >> ab.jsonl
    done
    python -m benchmarks.ab_jobs --summary ab.jsonl --markdown ab.md
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TASKS = ["arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag"]


def _sha256(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def time_sweep(run_dir: Path, text: Path, tune: Path, tokens: int, lrs: list[float],
               scratch: Path) -> dict[str, Any]:
    """The run's recovery recipe swept over ``lrs`` for ``tokens`` tokens (rung at half)."""
    from flexigpt.runtime.training.launch import run_spec

    cfg = json.loads((run_dir / "trained/manifest.json").read_text())["history"][-1]["config"]
    cfg["tokens"] = tokens
    spec = {"model": str(run_dir / "compressed"), "out": str(scratch / "trained"),
            "configs": [{**cfg, "lr": lr} for lr in lrs], "points": [{"lr": lr} for lr in lrs],
            "text": str(text), "tune": str(tune), "meta": {}, "rung": 0.5, "teacher": None}
    start = time.perf_counter()
    selection = run_spec(spec)
    seconds = time.perf_counter() - start
    return {"job_s": seconds, "trials": selection["trials"],
            "weights_sha256": _sha256(scratch / "trained/model.safetensors")}


def time_evaluation(run_dir: Path, tasks_dir: Path, ppl_text: Path,
                    scratch: Path) -> dict[str, Any]:
    """The run's trained model scored as the DAG's final evaluation of the default config."""
    from flexigpt.runtime.evaluation import evaluate_model

    out = scratch / "eval.json"
    start = time.perf_counter()
    evaluate_model(str(run_dir / "trained"), str(out), tasks=TASKS, tasks_dir=str(tasks_dir),
                   ppl_text=str(ppl_text), limit=100, source="local", ppl_seq_len=512,
                   ppl_windows=16, backend="fast", batch_size=16, dtype="float32",
                   device="cpu", autocast_dtype="auto", labels={})
    seconds = time.perf_counter() - start
    result = json.loads(out.read_text())
    return {"job_s": seconds, "ppl": result["perplexity"]["value"],
            "scores": {k: v["value"] for k, v in result["tasks"].items()},
            "task_seconds": {k: v["seconds"] for k, v in result["tasks"].items()},
            "records_sha256": {p.name.split(".", 1)[1]: _sha256(p)
                               for p in sorted(scratch.glob("eval.*.*"))}}


#: what two calls of one mode must agree on (timings aside)
FINGERPRINT = {"train": ("weights_sha256", "trials"), "eval": ("ppl", "scores", "records_sha256")}


def summary(lines: list[dict[str, Any]]) -> str:
    """The A/B table of ``lines`` (see the module doc) as Markdown."""
    rows = ["| mode | code | calls | seconds | mean s | vs first | mean CPU s | same results |",
            "|---|---|---:|---|---:|---:|---:|---|"]
    for mode in dict.fromkeys(line["mode"] for line in lines):
        calls = [line for line in lines if line["mode"] == mode]
        prints = {json.dumps([c[k] for k in FINGERPRINT[mode]], sort_keys=True) for c in calls}
        base = None
        for code in dict.fromkeys(c["code"] for c in calls):
            mine = [c for c in calls if c["code"] == code]
            mean = sum(c["job_s"] for c in mine) / len(mine)
            base = mean if base is None else base
            cpu = sum(c["cpu_s"] for c in mine) / len(mine)
            seconds = ", ".join(f"{c['job_s']:.1f}" for c in mine)
            rows.append(f"| {mode} | `{code}` | {len(mine)} | {seconds} | {mean:.1f} | "
                        f"{mean / base - 1:+.1%} | {cpu:.1f} | "
                        f"{'yes' if len(prints) == 1 else 'NO'} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    begin = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("train", "eval"))
    parser.add_argument("--summary", type=Path, default=None,
                        help="summarise the JSON lines of earlier calls instead")
    parser.add_argument("--markdown", type=Path, default=None, help="with --summary: write it")
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="the DAG run's results/ folder")
    parser.add_argument("--run", help="model/method/variant/setting")
    parser.add_argument("--resources", type=Path, default=Path("resources"))
    parser.add_argument("--tokens", type=int, default=4096, help="training tokens (train)")
    parser.add_argument("--lrs", type=float, nargs=2, default=[4e-3, 1.6e-2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the DAG's 1)")
    args = parser.parse_args(argv)
    if args.summary is not None:
        text = summary([json.loads(line) for line in args.summary.read_text().splitlines()
                        if line.strip()])
        print(text, end="")
        if args.markdown:
            args.markdown.write_text(text)
        return 0
    if args.mode is None:
        parser.error("--mode is required (or --summary)")
    import torch

    import flexigpt

    torch.set_num_threads(args.threads)
    if args.run is None:
        parser.error("--run is required with --mode")
    run_dir = args.results / args.run
    if not (run_dir / "trained/manifest.json").is_file():
        parser.error(f"{run_dir}: no trained/ model (run the DAG's target first)")
    text = args.resources / "text/wiki"
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        if args.mode == "train":
            row = time_sweep(run_dir, text / "train.txt", text / "validation.tune.txt",
                             args.tokens, args.lrs, scratch)
        else:
            row = time_evaluation(run_dir, args.resources / "tasks", text / "validation.txt",
                                  scratch)
        shutil.rmtree(scratch / "trained", ignore_errors=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"mode": args.mode, "run": args.run, "code": flexigpt.__file__, **row,
                      "process_s": time.perf_counter() - begin,
                      "cpu_s": usage.ru_utime + usage.ru_stime,
                      "loadavg": Path("/proc/loadavg").read_text().split()[:3]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
