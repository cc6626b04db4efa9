"""Per-rule wall time and peak memory of a finished DAG run, from Snakemake's ``benchmark:`` files.

Every heavy rule writes ``logs/timings/<model>/.../<rule>.tsv`` (columns ``s``, ``max_rss`` ...).
This script groups them by rule and prints (or writes, ``--markdown``) a table: jobs, total
and mean seconds, the slowest job, peak RSS, and each rule's share of all job-seconds. Jobs run
concurrently, so job-seconds add up to more than the wall time of the run.

``--exclude REGEX`` leaves out the jobs whose path matches (e.g. a method another run did not
have), and ``--against TABLE`` adds, per rule, another run's jobs and total seconds from a table
this script wrote, and the ratio of the totals (this run over that one) where both ran the same
number of jobs of the rule: the cross-machine ratio per rule.

Example (repository root, after ``snakemake --cores all``)::

    .venv/bin/python -m benchmarks.dag_times --model smollm2-135m --markdown results/dag_times.md
    .venv/bin/python -m benchmarks.dag_times --model smollm2-135m --exclude '^linearpatch/' \
        --against results/reference/smollm2-135m/dag_times.md
"""

from __future__ import annotations

import argparse
import re
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


def read_table(path: Path) -> pd.DataFrame:
    """Per rule, ``jobs`` and ``total_s`` of a table this script wrote (``--markdown``).

    Raises:
        ValueError: ``path`` holds no such table.
    """
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    if len(cells) < 3 or not {"rule", "jobs", "total_s"} <= set(cells[0]):
        raise ValueError(f"{path}: no dag_times table (columns rule, jobs, total_s)")
    frame = pd.DataFrame(cells[2:], columns=cells[0]).set_index("rule")
    return frame[["jobs", "total_s"]].astype(float)


def compare(table: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """``table`` (of :func:`summary`) with the other run's ``other_jobs`` and ``other_total_s``
    per rule and ``ratio`` = this total over that one; NaN where a rule's job counts differ
    (or the rule ran in one run only), since its totals then count different work."""
    out = table.copy()
    out["other_jobs"] = other["jobs"].reindex(out.index)
    out["other_total_s"] = other["total_s"].reindex(out.index)
    same = out["jobs"] == out["other_jobs"]
    out["ratio"] = (out["total_s"] / out["other_total_s"]).where(same).round(2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timings", default="logs/timings",
                        help="the root of the rules' Snakemake timing files")
    parser.add_argument("--model", default=None, help="only this model's subfolder")
    parser.add_argument("--exclude", default=None,
                        help="leave out the jobs whose path (under the model) matches this regex")
    parser.add_argument("--against", type=Path, default=None,
                        help="another run's table (--markdown of this script): ratios per rule")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    root = Path(args.timings) / (args.model or "")
    jobs = rule_times(root)
    if args.exclude:
        jobs = jobs[~jobs["job"].map(lambda job: bool(re.search(args.exclude, job)))]
    table = summary(jobs)
    total = jobs["seconds"].sum()
    footer = f"\n\n{len(jobs)} jobs, {total:.0f} job-seconds ({total / 60:.1f} job-minutes)."
    if args.against:
        other = read_table(args.against)
        table = compare(table, other)
        same = table["ratio"].notna()
        footer += (f" Against {args.against}: {other['total_s'].sum():.0f} job-seconds; over "
                   f"the rules with equal job counts {table.loc[same, 'total_s'].sum():.0f} / "
                   f"{table.loc[same, 'other_total_s'].sum():.0f} = "
                   f"{table.loc[same, 'total_s'].sum() / table.loc[same, 'other_total_s'].sum():.2f}×.")
    text = table.to_markdown()
    print(text + footer)
    if args.markdown:
        Path(args.markdown).write_text(text + footer + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
