"""One recovery sweep or one final evaluation of a DAG run's models, timed in this process,
with the weights' or scores' fingerprint: run it once per commit (``PYTHONPATH`` = that
commit's worktree), interleaved, to compare the two commits' job time on the same inputs and
check that the results are identical (issue 51's before/after figures).

The run, its paths and settings come from the config's grid (``--configfile``, run from the
repository root of a finished DAG run). ``--mode train`` sweeps the run's own tuning grid from
its ``compressed/`` model with the training config its ``trained/manifest.json`` records, cut
to ``--tokens`` tokens, the rung at half of the steps; ``--mode eval`` scores its
``trained/`` model with the grid's final-evaluation parameters on the perplexity test text
and the zero-shot tasks, as the DAG's ``evaluate`` job does. One JSON
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
            --run smollm2-135m/shortgpt_lora/default/r0.3 >> ab.jsonl
    done
    python -m benchmarks.ab_jobs --summary ab.jsonl --markdown ab.md
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from flexigpt.workflow.dag.grid import RunGrid
from flexigpt.workflow.dag.runs import Run


def _sha256(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def time_sweep(grid: RunGrid, run: Run, tokens: int, scratch: Path) -> dict[str, Any]:
    """The run's recovery sweep as the DAG's ``train`` job runs it (its tuning grid's points
    on the training config its ``trained/`` manifest records), cut to ``tokens`` tokens with
    the rung at half of the steps."""
    from flexigpt.runtime.training.launch import run_spec

    trained = Path(run.trained_dir) / "manifest.json"
    cfg = json.loads(trained.read_text())["history"][-1]["config"]
    cfg["tokens"] = tokens
    points = grid.trials(run)
    spec = {"model": run.compressed_dir, "out": str(scratch / "trained"),
            "configs": [{**cfg, **point} for point in points], "points": points,
            "text": grid.train_text, "tune": grid.tune_text, "meta": {}, "rung": 0.5,
            "teacher": None}
    start = time.perf_counter()
    selection = run_spec(spec)
    seconds = time.perf_counter() - start
    return {"job_s": seconds, "trials": selection["trials"],
            "weights_sha256": _sha256(scratch / "trained/model.safetensors")}


def time_evaluation(grid: RunGrid, run: Run, tasks_dir: str, scratch: Path) -> dict[str, Any]:
    """The run's trained model scored as the DAG's final evaluation (the grid's
    ``eval_params``, the perplexity test text)."""
    from flexigpt.runtime.evaluation import evaluate_model

    out = scratch / "eval.json"
    params = grid.eval_params(run, "final")
    start = time.perf_counter()
    evaluate_model(run.trained_dir, str(out), tasks=params.pop("tasks"), tasks_dir=tasks_dir,
                   ppl_text=grid.test_text, **params)
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
    parser.add_argument("--configfile", type=Path, default=Path("config/config.yaml"),
                        help="the config of the DAG run whose models are timed")
    parser.add_argument("--run", help="model/method/variant/setting")
    parser.add_argument("--tokens", type=int, default=4096, help="training tokens (train)")
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
    if args.run is None:
        parser.error("--run is required with --mode")
    config = yaml.safe_load(args.configfile.read_text())
    grid = RunGrid.from_config(config)
    run = grid.runs.get(tuple(args.run.split("/")))
    if run is None:
        parser.error(f"{args.run}: not a run of {args.configfile}'s grid")
    if not (Path(run.trained_dir) / "manifest.json").is_file():
        parser.error(f"{run.trained_dir}: no trained/ model (run the DAG's target first)")
    import torch

    import flexigpt

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "train":
            row = time_sweep(grid, run, args.tokens, Path(tmp))
        else:
            row = time_evaluation(grid, run, config["data"]["tasks"], Path(tmp))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"mode": args.mode, "run": args.run, "code": flexigpt.__file__, **row,
                      "process_s": time.perf_counter() - begin,
                      "cpu_s": usage.ru_utime + usage.ru_stime,
                      "loadavg": Path("/proc/loadavg").read_text().split()[:3]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
