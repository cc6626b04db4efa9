"""Requests/s of stock lm-eval ``HFLM`` vs ``FastHFLM`` on the same requests, same process.

For each task, the loglikelihood requests of the first ``--limit`` docs (local task files,
lm-eval's prompts) are scored by stock HFLM (fp32), FastHFLM (fp32) and FastHFLM with bf16
autocast, round-robin ``--rounds`` times (the fastest round of each counts, so that a slow
spell of a shared machine does not land on one side only). Reports requests/s, the speed-up,
the largest |Δ logprob| and is_greedy mismatches vs stock, and the task metrics (computed by
lm-eval's own ``process_results``) of each.
``--extra-stock-batch-size 1`` adds stock HFLM at lm-eval's default batch size to the round
robin (the configuration behind the "~4 requests/s" usually quoted for this CPU).
Each task also reports ``work``: the tokens stock and the fast plan feed the model, counted
from the plan (``FastHFLM.last_work``), and their matmul FLOP ratio, i.e. the speed-up at
equal FLOP rates; the measured speed-up divided by it is the fast path's per-FLOP efficiency
relative to stock.
``--profile`` adds one profiled pass per scorer and task: the matmul TFLOP each does and the
share of its op time spent in matmuls, hence the *ceiling* of the speed-up, i.e. what it would
be if the fast path spent nothing outside its matmuls and ran them at stock's matmul rate.
Times are process CPU seconds (with ``--threads 1`` this is the compute actually spent, even
when other jobs share the machine); wall seconds are reported too.

    .venv/bin/python -m benchmarks.bench_eval --model resources/models/smollm2-135m \
        --limit 200 --threads 1 --out /tmp/bench_eval.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import defaultdict
from dataclasses import asdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_train import macs_per_token, matmul_peak
from flexigpt.core.fileio import atomic_write_text
from flexigpt.runtime.evaluation.fast.lm import ATTENTION_MODES, max_abs_diff
from flexigpt.runtime.evaluation.fast.packing import WorkCounts
from flexigpt.runtime.evaluation.tasks import PAPER_TASKS, build_task, task_specs
from flexigpt.runtime.evaluation.zeroshot import make_lm
from flexigpt.storage.artifacts import load_compressed

log = logging.getLogger("bench_eval")

#: profiler op names counted as dense matmul work (attention kernels are not)
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm")


def machine_condition(seconds: float = 2.0) -> dict[str, float]:
    """How fast this (possibly shared) machine is right now: best fp32 matmul GFLOP/s and
    best copy bandwidth of a 256 MiB buffer (DRAM-bound) in GB/s. Stock scoring moves far
    more memory than ours, so the speed-up is larger when bandwidth is scarce."""
    src = torch.randn(64 * 1024 * 1024)
    dst = torch.empty_like(src)
    best, start = 0.0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tic = time.perf_counter()
        dst.copy_(src)
        best = max(best, 2 * src.numel() * 4 / (time.perf_counter() - tic))
    return {"matmul_fp32_gflops": round(matmul_peak(torch.float32, seconds=seconds) / 1e9, 1),
            "copy_256mib_gbs": round(best / 1e9, 2)}


def task_requests(name: str, tasks_dir: str, limit: int) -> tuple[Any, list[Any]]:
    """The lm-eval Task and its loglikelihood Instances for the first ``limit`` docs."""
    task = build_task(task_specs([name], "local", tasks_dir)[0])
    task.set_config(key="num_fewshot", value=0)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    return task, list(task.instances)


def metrics(task: Any, instances: list[Any], answers: list[tuple[float, bool]]) -> dict[str, float]:
    """Mean of lm-eval's per-doc metrics for these answers."""
    per_doc: dict[int, list[tuple[int, tuple[float, bool]]]] = defaultdict(list)
    for inst, ans in zip(instances, answers, strict=True):
        per_doc[inst.doc_id].append((inst.idx, ans))
    sums: dict[str, float] = defaultdict(float)
    for doc_id, items in per_doc.items():
        doc = next(i.doc for i in instances if i.doc_id == doc_id)
        res = task.process_results(doc, [a for _, a in sorted(items, key=lambda x: x[0])])
        for k, v in res.items():
            sums[k] += float(v)
    return {k: v / len(per_doc) for k, v in sums.items()}


def matmul_flops_per_token(model: Any) -> tuple[float, float]:  # an HF LM: get_output_embeddings
    """``(decoder, LM head)`` matmul FLOPs per token: twice ``bench_train.macs_per_token``'s
    linear MACs (every use of a linear layer, LoRA paths included), split into the LM head and
    the rest; attention scores are not counted."""
    head = model.get_output_embeddings()
    head_macs = head.in_features * head.out_features
    linear_macs = macs_per_token(model, seq_len=0)["linear"]
    return float(2 * (linear_macs - head_macs)), float(2 * head_macs)


def work_report(work: WorkCounts, flops: tuple[float, float]) -> dict[str, Any]:
    """``work``'s counts plus the matmul FLOP ratio stock / fast."""
    return {**asdict(work), "flop_ratio": work.flop_ratio(*flops)}


def timed(lm: Any, instances: list[Any]) -> tuple[list[tuple[float, bool]], float, float]:
    """Answers, CPU seconds of this process (robust to a shared machine), wall seconds."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = lm.loglikelihood(instances, disable_tqdm=True)
    return out, time.process_time() - cpu, time.perf_counter() - wall


def profiled(lm: Any, instances: list[Any]) -> dict[str, float]:
    """One profiled pass: matmul TFLOP, matmul CPU seconds and all ops' CPU seconds."""
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        lm.loglikelihood(instances, disable_tqdm=True)
    events = prof.key_averages()
    matmuls = [e for e in events if e.key in MATMUL_OPS]
    return {"matmul_tflop": sum(e.flops for e in matmuls) / 1e12,
            "matmul_s": sum(e.self_cpu_time_total for e in matmuls) / 1e6,
            "ops_s": sum(e.self_cpu_time_total for e in events) / 1e6}


def ceiling(stock: dict[str, float], fast: dict[str, float]) -> dict[str, float]:
    """Matmul work ratio, matmul shares and the zero-overhead ceiling of the speed-up:
    stock's op time over the time ours would take doing only its matmuls at stock's rate,
    i.e. ``flop_ratio / stock_matmul_share``."""
    flop_ratio = stock["matmul_tflop"] / fast["matmul_tflop"]
    share = stock["matmul_s"] / stock["ops_s"]
    return {"matmul_flop_ratio": flop_ratio, "stock_matmul_share": share,
            "fast_matmul_share": fast["matmul_s"] / fast["ops_s"],
            "stock_matmul_gflops": 1e3 * stock["matmul_tflop"] / stock["matmul_s"],
            "fast_matmul_gflops": 1e3 * fast["matmul_tflop"] / fast["matmul_s"],
            "ceiling_speedup": flop_ratio / share}


def timed_rounds(lms: dict[str, Any], instances: list[Any], rounds: int,
                 ) -> dict[str, tuple[list[tuple[float, bool]], float, float, list[float]]]:
    """Run every LM on ``instances`` round-robin ``rounds`` times, so that a slow spell of a
    shared machine hits all of them alike; per LM: first round's answers, the fastest
    round's CPU and wall seconds, and every round's CPU seconds."""
    runs: dict[str, list[tuple[list[tuple[float, bool]], float, float]]] = defaultdict(list)
    for _ in range(rounds):
        for name, lm in lms.items():
            runs[name].append(timed(lm, instances))
    out = {}
    for name, rs in runs.items():
        best = min(rs, key=lambda r: r[1])
        out[name] = (rs[0][0], best[1], best[2], [r[1] for r in rs])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resources/models/smollm2-135m")
    ap.add_argument("--tasks-dir", default="resources/tasks",
                    help="folder of the task data, <task>/<split>.jsonl")
    ap.add_argument("--tasks", default=",".join(PAPER_TASKS))
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16, help="stock HFLM batch size")
    ap.add_argument("--extra-stock-batch-size", type=int,
                    help="also time stock HFLM at this batch size (lm-eval's default is 1)")
    ap.add_argument("--profile", action="store_true",
                    help="one extra profiled pass per scorer: matmul work and the ceiling")
    ap.add_argument("--row-tokens", type=int, help="FastHFLM row_tokens (default: its own)")
    ap.add_argument("--batch-tokens", type=int, help="FastHFLM batch_tokens (default: its own)")
    ap.add_argument("--head-rows", type=int, help="FastHFLM head_rows (default: its own)")
    ap.add_argument("--attention", choices=ATTENTION_MODES,
                    help="FastHFLM attention layout (default: its own)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--rounds", type=int, default=2,
                    help="round-robin repeats per task; the fastest round counts")
    ap.add_argument("--out", help="write the report JSON here")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    loaded = load_compressed(args.model)
    model, tok = loaded.model, loaded.tokenizer
    stock = make_lm(model, tok, backend="hf", batch_size=args.batch_size)
    fast_kw = {k: v for k, v in (("row_tokens", args.row_tokens),
                                 ("batch_tokens", args.batch_tokens),
                                 ("head_rows", args.head_rows),
                                 ("attention", args.attention)) if v is not None}
    fast_kw["verify"] = 0
    fast = make_lm(model, tok, backend="fast", batch_size=args.batch_size, **fast_kw)
    bf16 = None if args.no_bf16 else make_lm(model, tok, backend="fast",
                                             batch_size=args.batch_size,
                                             autocast_dtype="bfloat16", **fast_kw)
    lms = {"stock": stock, "fast": fast, **({"bf16": bf16} if bf16 else {})}
    extra_name = f"stock_bs{args.extra_stock_batch_size}"
    if args.extra_stock_batch_size is not None:
        lms[extra_name] = make_lm(model, tok, backend="hf",
                                  batch_size=args.extra_stock_batch_size)
    report: dict[str, Any] = {"model": args.model, "limit": args.limit, "threads": args.threads,
                              "rounds": args.rounds, "machine_before": machine_condition(),
                              "batch_size": args.batch_size, "fast": fast.fast_config(),
                              "tasks": {}}
    totals: dict[str, float] = defaultdict(float)
    flops, work_total = matmul_flops_per_token(model), WorkCounts()
    prof_totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    n_total = 0
    for name in [t for t in args.tasks.split(",") if t]:
        task, inst = task_requests(name, args.tasks_dir, args.limit)
        runs = timed_rounds(lms, inst, args.rounds)
        ref, t_stock, w_stock, all_stock = runs["stock"]
        ours, t_fast, w_fast, all_fast = runs["fast"]
        row: dict[str, Any] = {"requests": len(inst), "docs": len({i.doc_id for i in inst}),
                               "stock_s": t_stock, "fast_s": t_fast, "speedup": t_stock / t_fast,
                               "stock_wall_s": w_stock, "fast_wall_s": w_fast,
                               "stock_rounds_s": all_stock, "fast_rounds_s": all_fast,
                               "max_abs_diff": max_abs_diff(ref, ours),
                               "greedy_mismatch": sum(a[1] != b[1] for a, b in zip(ref, ours)),
                               "metrics_stock": metrics(task, inst, ref), "metrics_fast": metrics(task, inst, ours),
                               "work": work_report(fast.last_work, flops)}
        work_total += fast.last_work
        if bf16 is not None:
            low, t_bf16, w_bf16, _ = runs["bf16"]
            m_bf16 = metrics(task, inst, low)
            row.update(bf16_s=t_bf16, bf16_wall_s=w_bf16, speedup_bf16=t_stock / t_bf16,
                       metrics_bf16=m_bf16,
                       bf16_max_abs_diff=max_abs_diff(ref, low),
                       bf16_max_metric_diff=max(abs(m_bf16[k] - row["metrics_stock"][k])
                                                for k in m_bf16))
            totals["bf16"] += t_bf16
        if extra_name in lms:
            other, t_extra, w_extra, _ = runs[extra_name]
            row.update({f"{extra_name}_s": t_extra, f"{extra_name}_wall_s": w_extra,
                        f"speedup_vs_{extra_name}": t_extra / t_fast,
                        f"{extra_name}_max_abs_diff": max_abs_diff(ref, other)})
            totals[extra_name] += t_extra
        if args.profile:
            prof = {"stock": profiled(stock, inst), "fast": profiled(fast, inst)}
            row["profile"] = {**prof, **ceiling(prof["stock"], prof["fast"])}
            for side, numbers in prof.items():
                for key, value in numbers.items():
                    prof_totals[side][key] += value
        totals["stock"] += t_stock
        totals["fast"] += t_fast
        n_total += len(inst)
        report["tasks"][name] = row
        if args.out:  # partial report after every task
            atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")
        log.info("%s: %d req, CPU s: stock %.1f, fast %.1f (×%.2f; FLOP ratio ×%.2f)%s, "
                 "max|Δ| %.2e, greedy≠ %d, metrics %s vs %s", name, len(inst), t_stock, t_fast,
                 t_stock / t_fast, row["work"]["flop_ratio"],
                 f", bf16 {row['bf16_s']:.1f} (×{row['speedup_bf16']:.2f})" if bf16 else "",
                 row["max_abs_diff"], row["greedy_mismatch"], row["metrics_stock"],
                 row["metrics_fast"])
    report["machine_after"] = machine_condition()
    report["overall"] = {"requests": n_total, **{f"{k}_s": v for k, v in totals.items()},
                         **{f"{k}_req_per_s": n_total / v for k, v in totals.items()},
                         "speedup": totals["stock"] / totals["fast"],
                         "work": work_report(work_total, flops)}
    if bf16 is not None:
        report["overall"]["speedup_bf16"] = totals["stock"] / totals["bf16"]
    if extra_name in lms:
        report["overall"][f"speedup_vs_{extra_name}"] = totals[extra_name] / totals["fast"]
    if args.profile:
        report["overall"]["profile"] = ceiling(prof_totals["stock"], prof_totals["fast"])
    print(json.dumps(report["overall"], indent=2))
    if args.out:
        atomic_write_text(args.out, json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
