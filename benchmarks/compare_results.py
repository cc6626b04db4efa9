"""Paired A − B intervals of two evaluations of the same documents and windows.

Reads two result JSONs (``eval_final.json`` / ``eval_start.json`` of any run, with their
per-document records) and prints, with :func:`flexigpt.core.stats.compare_runs` (the engine of the
tables' ``comparisons.md``: same bootstrap, same numbers): the log-perplexity difference in
nats, each task's accuracy difference and the task average in points, each with its 95 %
paired interval over documents (windows), and each run's own perplexity and average. Use it
for a pair the tables do not list, e.g. one option against the default setting::

    python -m benchmarks.compare_results \\
        results/smollm2-135m/flexigpt/svd_randomized/r0.3/eval_final.json \\
        results/smollm2-135m/flexigpt/default/r0.3/eval_final.json --out diff.json

Raises :class:`flexigpt.core.stats.PairingError` when the runs scored different documents.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from flexigpt.core import stats
from flexigpt.core.fileio import atomic_write_text
from flexigpt.runtime.evaluation.results import load_records


def _interval(iv: stats.Interval | None, scale: float) -> dict[str, Any] | None:
    """An interval as a dict, in units of ``scale`` (None stays None)."""
    return None if iv is None else iv.scaled(scale).to_dict()


def compare(a: Path, b: Path) -> dict[str, Any]:
    """``{"a", "b": paths, "own": {side: {"ppl", "avg": [estimate, low, high] | None}},
    "diff": {"log_ppl", "average", "tasks": {task: interval}}}``; each run's own 95 %
    intervals (perplexity; task average in points) and the paired differences (accuracies in
    points, log-PPL in nats)."""
    ra, rb = load_records(a), load_records(b)
    diff = stats.compare_runs(ra, rb)
    own = {}
    for side, records in (("a", ra), ("b", rb)):
        iv = stats.run_intervals(records)
        ppl, avg = iv["log_ppl"], iv["average"]
        own[side] = {"ppl": [math.exp(x) for x in (ppl.estimate, ppl.low, ppl.high)]
                     if ppl else None,
                     "avg": [100 * x for x in (avg.estimate, avg.low, avg.high)] if avg else None}
    return {"a": str(a), "b": str(b), "own": own,
            "diff": {"log_ppl": _interval(diff["log_ppl"], 1.0),
                     "average": _interval(diff["average"], 100.0),
                     "tasks": {t: _interval(iv, 100.0) for t, iv in diff["tasks"].items()}}}


def render(out: dict[str, Any]) -> str:
    """Plain-text lines of :func:`compare`'s result."""
    lines = [f"A = {out['a']}", f"B = {out['b']}"]
    for side in ("a", "b"):
        o = out["own"][side]
        ppl, avg = (("n/a" if v is None else f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]")
                    for v in (o["ppl"], o["avg"]))
        lines.append(f"{side.upper()}: PPL {ppl}, task average {avg}")
    rows = [("log-PPL (nats)", out["diff"]["log_ppl"]), ("average (points)", out["diff"]["average"])]
    rows += [(f"{t} (points)", iv) for t, iv in out["diff"]["tasks"].items()]
    for name, iv in rows:
        if iv is not None:
            lines.append(f"A − B {name:>24}: {iv['estimate']:+.4f} "
                         f"[{iv['low']:+.4f}, {iv['high']:+.4f}] (n = {iv['n']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="result JSON of run A")
    p.add_argument("b", type=Path, help="result JSON of run B (the reference)")
    p.add_argument("--out", type=Path, default=None, help="also write the result as JSON")
    args = p.parse_args(argv)
    out = compare(args.a, args.b)
    print(render(out))
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
