"""Is a dense model what it claims to be? Score it with stock lm-eval and with the harness,
next to its published model card.

Two scorers on the same documents (the local task files, lm-eval's own prompts and
metrics): **stock** is the ``lm_eval`` command line, ``--model hf`` in fp32, in its own
process (no harness code in the path: the harness only writes the YAML files that point
lm-eval's built-in task configs at the local data, ``flexigpt.runtime.evaluation.lm_eval_tasks``);
**harness** is ``flexigpt evaluate`` (the fast prefix-sharing scorer, fp32). Both keep their
per-document outcomes; each accuracy gets a 95 % bootstrap interval over documents, the two
scorers are compared document by document, and each is set beside the card's number with
the interval of ``ours − card`` (the card's number is taken as exact: its own sampling
error is not published).

    .venv/bin/python -m benchmarks.validate_dense --model resources/models/gemma3-270m \\
        --card gemma3-270m --tasks piqa arc_easy boolq:1000 \\
        --out results/reference/gemma3-270m/dense_validation

``task:N`` scores the first N documents of a task (both scorers the same ones). Writes
``validation.json``, ``validation.md`` and the per-document records
(``records/<scorer>_<task>.jsonl.gz``: doc_id, acc, acc_norm) under ``--out``; a task whose
records are already there for the same N (``records/<task>.json``) is not scored again, so
an interrupted run resumes. ``--batch-size`` bounds stock lm-eval's memory: it scores the
whole 262K-way logits of every position (BoolQ's passages at 16 rows: over 24 GB).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flexigpt.core.fileio import atomic_write_text
from flexigpt.core.stats.intervals import diff_interval, mean_interval
from flexigpt.runtime.evaluation.lm_eval_tasks import write_task_yamls

log = logging.getLogger("validate_dense")

#: published zero-shot accuracies (points) of pretrained models: card name → (source, task →
#: number). Only tasks whose shot count matches the harness's zero-shot scoring.
CARDS: dict[str, tuple[str, dict[str, float]]] = {
    "gemma3-270m": ("google/gemma-3-270m model card, pretrained model, 0-shot "
                    "(HellaSwag 40.9 is 10-shot there: not comparable, not scored)",
                    {"piqa": 67.7, "arc_easy": 57.7, "boolq": 61.4}),
}
METRICS = ("acc", "acc_norm")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), with AMX noted where its flags show it."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                 if ln.startswith("model name")), platform.machine())
    return name + (" with AMX" if " amx_bf16" in info else "")


def parse_task(text: str) -> tuple[str, int | None]:
    """``piqa`` → ``("piqa", None)``; ``boolq:1000`` → ``("boolq", 1000)``."""
    name, _, limit = text.partition(":")
    if limit and (not limit.isdigit() or int(limit) < 1):
        raise argparse.ArgumentTypeError(f"{text!r}: the limit after ':' must be >= 1")
    return name, int(limit) if limit else None


def run_stock(model: str, task: str, limit: int | None, tasks_dir: Path, out: Path,
              batch_size: int) -> list[dict[str, Any]]:
    """Stock ``lm_eval`` on one task; per-document ``{doc_id, acc, acc_norm}``."""
    args = f"pretrained={model},dtype=float32,add_bos_token=True"
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", args,
           "--include_path", str(tasks_dir), "--tasks", task, "--device", "cpu",
           "--batch_size", str(batch_size), "--log_samples", "--output_path", str(out)]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    (samples,) = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    return [_record(r) for r in rows]


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """``{doc_id, acc[, acc_norm]}`` of one sample (BoolQ has no ``acc_norm``)."""
    return {"doc_id": row["doc_id"], **{m: float(row[m]) for m in METRICS if m in row}}


def run_harness(model: str, task: str, limit: int | None, task_data: str,
                out: Path) -> list[dict[str, Any]]:
    """``flexigpt evaluate`` (fast scorer, fp32) on one task; per-document records."""
    result = out / f"{task}.json"
    cmd = [sys.executable, "-m", "flexigpt", "evaluate", "--model", model, "--out",
           str(result), "--tasks", task, "--no-ppl", "--add-bos-token", "--tasks-dir",
           task_data]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with gzip.open(out / f"{task}.samples.jsonl.gz", "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [_record(r) for r in rows]


def summarise(task: str, stock: list[dict], harness: list[dict],
              card: float | None) -> dict[str, Any]:
    """Intervals (points) per scorer and metric, agreement, and the gap to the card."""
    stock = sorted(stock, key=lambda r: r["doc_id"])
    harness = sorted(harness, key=lambda r: r["doc_id"])
    if [r["doc_id"] for r in stock] != [r["doc_id"] for r in harness]:
        raise ValueError(f"{task}: the scorers saw different documents")
    out: dict[str, Any] = {"n_docs": len(stock), "card": card, "metrics": {}}
    for metric in (m for m in METRICS if m in stock[0] and m in harness[0]):
        a = np.array([r[metric] for r in stock])
        b = np.array([r[metric] for r in harness])
        entry: dict[str, Any] = {
            "stock": mean_interval(a).scaled(100).to_dict(),
            "harness": mean_interval(b).scaled(100).to_dict(),
            "harness_minus_stock": diff_interval(b, a).scaled(100).to_dict(),
            "same_outcome_docs": int((a == b).sum())}
        if card is not None:
            for name, x in (("stock", a), ("harness", b)):
                gap = mean_interval(x).scaled(100)
                entry[f"{name}_minus_card"] = {"estimate": gap.estimate - card,
                                               "low": gap.low - card, "high": gap.high - card}
        out["metrics"][metric] = entry
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# Dense validation: {report['model']}", "",
             f"Card: {report['card_source']}. Machine: {report['machine']}; "
             f"{report['seconds']:.0f} s in all. Accuracy in points, 95 % bootstrap interval "
             "over documents; Δ card = ours − card (card taken as exact).", "",
             "| task | docs | metric | card | stock lm-eval | harness | harness − stock | "
             "same outcome | stock − card |",
             "|---|---:|---|---:|---|---|---|---:|---|"]
    for task, t in report["tasks"].items():
        for metric, m in t["metrics"].items():
            s, h, d = m["stock"], m["harness"], m["harness_minus_stock"]
            gap = m.get("stock_minus_card")
            gap_text = (f"{gap['estimate']:+.1f} [{gap['low']:+.1f}, {gap['high']:+.1f}]"
                        if gap else "–")
            card = f"{t['card']:.1f}" if t["card"] is not None else "–"
            lines.append(
                f"| {task} | {t['n_docs']} | {metric} | {card} | {s['estimate']:.1f} "
                f"[{s['low']:.1f}, {s['high']:.1f}] | {h['estimate']:.1f} [{h['low']:.1f}, "
                f"{h['high']:.1f}] | {d['estimate']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] "
                f"| {m['same_outcome_docs']}/{t['n_docs']} | {gap_text} |")
    return "\n".join(lines) + "\n"


def _read(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _done(out: Path, task: str, limit: int | None) -> tuple[list, list, dict] | None:
    """``(stock, harness, meta)`` records of ``task`` already scored at ``limit``, else None."""
    records = out / "records"
    try:
        meta = json.loads((records / f"{task}.json").read_text())
        if meta["limit"] != limit:
            return None
        return (_read(records / f"stock_{task}.jsonl.gz"),
                _read(records / f"harness_{task}.jsonl.gz"), meta)
    except (OSError, ValueError, KeyError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="dense checkpoint directory")
    p.add_argument("--card", choices=sorted(CARDS), help="published numbers to compare with")
    p.add_argument("--tasks", nargs="+", type=parse_task, required=True,
                   help="task or task:N (first N documents)")
    p.add_argument("--tasks-dir", dest="task_data", default="resources/tasks",
                   help="folder of the task data, <task>/<split>.jsonl")
    p.add_argument("--batch-size", type=int, default=16, help="stock lm-eval batch size")
    p.add_argument("--out", required=True, help="output folder")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    source, card = CARDS[args.card] if args.card else ("none", {})
    out = Path(args.out)
    (out / "records").mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report: dict[str, Any] = {"model": args.model, "card_source": source, "tasks": {},
                              "machine": f"{cpu_name()}, {os.cpu_count()} CPUs"}
    with tempfile.TemporaryDirectory(prefix="validate-dense-") as tmp:
        tasks_dir = Path(tmp) / "tasks"
        write_task_yamls(args.task_data, tasks_dir, [name for name, _ in args.tasks])
        for name, limit in args.tasks:
            done = _done(out, name, limit)
            if done is not None:
                log.info("%s: records of an earlier run reused", name)
                report["tasks"][name] = {**summarise(name, *done[:2], card.get(name)),
                                         **done[2]}
                continue
            t0 = time.perf_counter()
            stock = run_stock(args.model, name, limit, tasks_dir, Path(tmp) / f"stock-{name}",
                              args.batch_size)
            t1 = time.perf_counter()
            harness = run_harness(args.model, name, limit, args.task_data,
                                  Path(tmp) / f"harness-{name}")
            t2 = time.perf_counter()
            log.info("%s: stock %.0f s, harness %.0f s", name, t1 - t0, t2 - t1)
            for scorer, rows in (("stock", stock), ("harness", harness)):
                with gzip.open(out / "records" / f"{scorer}_{name}.jsonl.gz", "wt") as fh:
                    fh.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)
            meta = {"limit": limit, "stock_seconds": round(t1 - t0, 1),
                    "harness_seconds": round(t2 - t1, 1), "batch_size": args.batch_size}
            atomic_write_text(out / "records" / f"{name}.json", json.dumps(meta, sort_keys=True))
            report["tasks"][name] = {**summarise(name, stock, harness, card.get(name)), **meta}
    report["seconds"] = time.perf_counter() - start
    atomic_write_text(out / "validation.json", json.dumps(report, indent=2, sort_keys=True))
    atomic_write_text(out / "validation.md", markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
