"""Check that a saved model directory loads in the ecosystem exactly, or not at all.

On one saved model (e.g. the FlexiGPT model of a DAG run) and its result JSON, prints:

1. plain ``AutoModelForCausalLM.from_pretrained(dir)`` (no remote code): refused or loaded;
2. ``trust_remote_code=True``: max |Δ logit| against ``flexigpt.load_compressed(dir)`` on a
   few held-out windows, and whether ``generate`` (KV cache) equals no-cache greedy decoding;
3. ``flexigpt export`` to a plain architecture: exit code and reason;
4. the stock ``lm_eval`` CLI (``--model hf``, ``trust_remote_code=True``) on the harness's
   local task data: max |Δ log-likelihood| per document against the result's records.

Usage::

    python -m benchmarks.check_loadable results/smollm2-135m/flexigpt/default/r0.3/trained \\
        --result results/smollm2-135m/flexigpt/default/r0.3/eval_final.json --limit 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

from flexigpt.runtime.evaluation.results import load_records  # noqa: E402
from flexigpt.storage.artifacts import load_compressed  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir")
    p.add_argument("--result", required=True, help="the model's result JSON (with records)")
    p.add_argument("--task", default="arc_easy")
    p.add_argument("--limit", type=int, default=10)
    p.add_argument("--tasks-dir", default="resources/tasks",
                   help="folder of the task data, <task>/<split>.jsonl")
    args = p.parse_args()
    from transformers import AutoModelForCausalLM

    report: dict = {"model_dir": args.model_dir}
    try:
        AutoModelForCausalLM.from_pretrained(args.model_dir, trust_remote_code=False)
        report["plain_load"] = "loaded (a plain checkpoint)"
    except Exception as err:  # the refusal is the expected outcome for non-plain models
        report["plain_load"] = f"refused: {str(err).splitlines()[0][:200]}"
    ours = load_compressed(args.model_dir)
    remote = AutoModelForCausalLM.from_pretrained(args.model_dir, trust_remote_code=True).eval()
    ours_config: Any = ours.model.config  # its HF config; nn.Module types attributes as Tensor | Module
    ids = torch.randint(3, ours_config.vocab_size, (2, 64),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (remote(ids).logits - ours.model(ids).logits).abs().max().item()
        cached = remote.generate(ids[:1, :8], max_new_tokens=16, do_sample=False)
        plain = remote.generate(ids[:1, :8], max_new_tokens=16, do_sample=False,
                                use_cache=False)
    report["remote_code_max_abs_logit_diff"] = diff
    report["generate_cache_equals_no_cache"] = bool(torch.equal(cached, plain))
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-m", "flexigpt.cli", "export", args.model_dir,
                              "--out", f"{tmp}/plain"], capture_output=True, text=True)
        report["export"] = {"rc": out.returncode,
                            "message": (out.stdout + out.stderr).strip().splitlines()[-1:]}
        from flexigpt.runtime.evaluation.lm_eval_tasks import write_task_yamls

        write_task_yamls(args.tasks_dir, f"{tmp}/tasks")
        cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={args.model_dir},trust_remote_code=True,add_bos_token=False,"
               "dtype=float32", "--include_path", f"{tmp}/tasks", "--tasks", args.task,
               "--limit", str(args.limit), "--device", "cpu", "--batch_size", "16",
               "--log_samples", "--output_path", f"{tmp}/lm_eval"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        report["lm_eval_rc"] = run.returncode
        samples = sorted(Path(tmp, "lm_eval").rglob(f"samples_{args.task}*.jsonl"))
        if run.returncode == 0 and samples:
            stock = [json.loads(line) for line in samples[0].read_text().splitlines() if line]
            records = {r["doc_id"]: r for r in load_records(args.result)["tasks"][args.task]}
            worst = 0.0
            for doc in stock:
                mine = records[doc["doc_id"]]["loglikelihoods"]
                theirs = [float(resp[0][0]) for resp in doc["resps"]]
                worst = max(worst, max(abs(a - b) for a, b in zip(mine, theirs)))
            report["lm_eval_docs"] = len(stock)
            report["lm_eval_max_abs_loglik_diff_vs_records"] = worst
        else:
            report["lm_eval_tail"] = (run.stdout + run.stderr)[-1500:]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
