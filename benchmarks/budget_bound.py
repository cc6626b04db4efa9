"""A compute floor on a run's training time on another CPU: tokens trained × FLOP per token ÷ peak.

Reads, from a finished run's records (its ``results/<model key>/`` or a reference run's
committed ``inputs/results/<model key>/``), how many tokens every recovery job trained: each
``*/trained/selection.json`` lists its learning-rate trials with the tokens each ran (a swept
run trains its grid, the losers up to the rung; a reused-rate run one trial). FLOP per training
token come from a ``bench_train.py`` JSON that measured the same recipes (``--policy`` as the
run's config): ``train_flops_per_token`` of its ``flexigpt`` and ``shortgpt`` rows (ShortGPT +
LoRA), which map to the run's ``flexigpt`` and ``shortgpt_lora`` jobs. The target machine is
a second ``bench_train.py`` JSON measured there: its matmul peak per thread in the dtype the
trainer uses there (``bf16: auto`` trains in fp32 on a CPU without native bf16) and its
measured model-FLOP utilisation.

Printed (and written with ``--out``): per job the tokens and TFLOP, the total, and the floor
on two cores: ``total FLOP ÷ (cores × peak per thread)`` (every core at its matmul peak, every
FLOP a matmul, perfect overlap: no schedule can beat it) and the same at the measured MFU.
Only training is counted, and only the jobs of a measured recipe (others are listed, not
counted): evaluations, compression, start-up and the other jobs come on top, so a floor above a
wall-time target proves the target out of reach on that machine for that grid.

Example (the budget ladder on the AVX2-only AMD EPYC)::

    python -m benchmarks.budget_bound \\
        --records results/reference/smollm2-135m-budget/inputs/results/smollm2-135m-budget \\
        --flops results/reference/bench_train_matched_intel.json \\
        --target results/reference/bench_train_1t_fp32_avx2.json --dtype fp32 --cores 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flexigpt.core.fileio import atomic_write_text
from flexigpt.storage.registry import ROLES

#: the bench_train method whose recipe each of the DAG's recovered methods trains: the
#: subject its own, the comparator the one-shot skip method's model trained by its recipe
BENCH_METHOD = {ROLES.subject: ROLES.subject, ROLES.comparator: ROLES.skip}


def trained_tokens(records: Path) -> list[dict]:
    """One row per ``<method>/<variant>/<ratio>/trained/selection.json`` under ``records``:
    ``job`` (its path), ``method`` and ``tokens`` (the sum over its trials).

    Raises:
        FileNotFoundError: no selection.json under ``records``.
    """
    rows = []
    for path in sorted(records.glob("*/*/*/trained/selection.json")):
        trials = json.loads(path.read_text())["trials"]
        job = path.parent.parent.relative_to(records)
        rows.append({"job": str(job), "method": job.parts[0],
                     "tokens": sum(int(t["tokens"]) for t in trials)})
    if not rows:
        raise FileNotFoundError(f"no */*/*/trained/selection.json under {records}")
    return rows


def flops_per_token(bench: dict) -> dict[str, int]:
    """``{bench_train method: train FLOP per token}`` of a bench_train JSON (first row each)."""
    out: dict[str, int] = {}
    for row in bench["variants"]:
        if "train_flops_per_token" in row:
            # rows of a bench_train that measured only the subject carry no method
            out.setdefault(row.get("method", ROLES.subject), int(row["train_flops_per_token"]))
    return out


def floor(rows: list[dict], per_token: dict[str, int], peak: float, mfu: float,
          cores: int) -> dict:
    """Total training FLOP of the ``rows`` whose recipe has a measured FLOP per token, and the
    wall-time floors (seconds) on ``cores``; the other jobs are listed in ``not_counted``
    (leaving them out keeps the floor a lower bound).

    Raises:
        KeyError: no row has a measured recipe.
    """
    counted, skipped = [], []
    for row in rows:
        bench = BENCH_METHOD.get(row["method"])
        if bench in per_token:
            counted.append({**row, "flop": row["tokens"] * per_token[bench]})
        else:
            skipped.append(row["job"])
    if not counted:
        raise KeyError(f"no job of a measured recipe (bench_train rows: {sorted(per_token)}; "
                       f"jobs: {skipped})")
    total = sum(r["flop"] for r in counted)
    at_peak = total / (cores * peak)
    return {"jobs": counted, "not_counted": skipped, "total_flop": total,
            "peak_per_thread": peak, "cores": cores, "mfu": mfu,
            "floor_s_at_peak": at_peak, "floor_s_at_mfu": at_peak / mfu}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", required=True, type=Path,
                   help="a run's results/<model key>/ (or a reference run's inputs/results/<key>/)")
    p.add_argument("--flops", required=True, type=Path,
                   help="bench_train JSON with flexigpt and shortgpt rows of the run's recipes")
    p.add_argument("--target", required=True, type=Path,
                   help="bench_train JSON measured on the target machine (peak, MFU)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), required=True,
                   help="the trainer's compute dtype on the target machine")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="also write the result as JSON")
    args = p.parse_args(argv)

    target = json.loads(args.target.read_text())
    threads = int(target.get("threads", 1))
    peak = float(target["peak_flops"][args.dtype]) / threads
    mfus = [float(r[f"mfu_vs_{args.dtype}_peak"]) for r in target["variants"]
            if f"mfu_vs_{args.dtype}_peak" in r and r.get("bf16") == ("off" if args.dtype == "fp32" else "on")]
    if not mfus:
        raise SystemExit(f"{args.target}: no {args.dtype} row with a measured MFU")
    result = floor(trained_tokens(args.records), flops_per_token(json.loads(args.flops.read_text())),
                   peak, max(mfus), args.cores)
    result.update(records=str(args.records), flops=str(args.flops), target=str(args.target),
                  target_cpu=target.get("cpu"), dtype=args.dtype)
    print(f"{'job':40s} {'tokens':>10s} {'TFLOP':>9s}")
    for row in result["jobs"]:
        print(f"{row['job']:40s} {row['tokens']:10,d} {row['flop'] / 1e12:9.1f}")
    if result["not_counted"]:
        print(f"not counted (no measured recipe): {', '.join(result['not_counted'])}")
    print(f"total {result['total_flop'] / 1e12:,.1f} TFLOP on {args.cores} cores at "
          f"{peak / 1e9:.1f} GFLOP/s per thread ({args.dtype}, {target.get('cpu', args.target.name)})")
    print(f"training floor: {result['floor_s_at_peak'] / 60:.1f} min at the matmul peak, "
          f"{result['floor_s_at_mfu'] / 60:.1f} min at the measured MFU {result['mfu']:.1%} "
          f"(evaluation, compression and start-up not counted)")
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
