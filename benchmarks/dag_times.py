"""Per-rule wall time and peak memory of a finished DAG run, from Snakemake's ``benchmark:`` files.

Every heavy rule writes ``logs/timings/<model>/.../<rule>.tsv`` (columns ``s``, ``max_rss`` ...).
This script groups them by rule and prints (or writes, ``--markdown``) a table: jobs, total
and mean seconds, the slowest job, peak RSS, and each rule's share of all job-seconds. Jobs run
concurrently, so job-seconds add up to more than the wall time of the run.

Example (repository root, after ``snakemake --cores all``)::

    .venv/bin/python -m benchmarks.dag_times --model smollm2-135m --markdown results/dag_times.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def rule_times(bench_dir: Path) -> pd.DataFrame:
    """One row per benchmark file: ``rule``, ``job`` (its path), ``seconds``, ``max_rss_mb``.

    Raises:
        FileNotFoundError: no ``*.tsv`` under ``bench_dir``.
    """
    rows = []
    for path in sorted(bench_dir.rglob("*.tsv")):
        frame = pd.read_csv(path, sep="\t")
        rows.append({"rule": path.stem, "job": str(path.parent.relative_to(bench_dir)),
                     "seconds": float(frame["s"].iloc[0]),
                     "max_rss_mb": pd.to_numeric(frame["max_rss"], errors="coerce").iloc[0]})
    if not rows:
        raise FileNotFoundError(f"no benchmark .tsv files under {bench_dir}")
    return pd.DataFrame(rows)


def summary(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, total/mean/max seconds, slowest job, peak RSS and share of job-seconds."""
    grouped = jobs.groupby("rule")
    table = pd.DataFrame({
        "jobs": grouped.size(),
        "total_s": grouped["seconds"].sum().round(0),
        "mean_s": grouped["seconds"].mean().round(1),
        "max_s": grouped["seconds"].max().round(1),
        "slowest": grouped.apply(lambda g: g.loc[g["seconds"].idxmax(), "job"],
                                 include_groups=False),
        "peak_rss_mb": grouped["max_rss_mb"].max().round(0),
    })
    table["share"] = (table["total_s"] / table["total_s"].sum()).map("{:.0%}".format)
    return table.sort_values("total_s", ascending=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timings", default="logs/timings",
                        help="the root of the rules' Snakemake timing files")
    parser.add_argument("--model", default=None, help="only this model's subfolder")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    root = Path(args.timings) / (args.model or "")
    jobs = rule_times(root)
    table = summary(jobs)
    text = table.to_markdown()
    total = jobs["seconds"].sum()
    footer = f"\n\n{len(jobs)} jobs, {total:.0f} job-seconds ({total / 60:.1f} job-minutes)."
    print(text + footer)
    if args.markdown:
        Path(args.markdown).write_text(text + footer + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
