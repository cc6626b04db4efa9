"""What each part of the run grid costs: a finished run's job-seconds per table and per run
(issue 51: the filer's call on the hour needs the price of every row).

Input: the per-job table :mod:`benchmarks.dag_profile` writes (``--jobs-csv``: ``rule``,
``job`` = the Snakemake wildcards, ``wall_s``) and the config the run used. Each job is
charged to the run its wildcards name (``method``/``variant``/``setting``: compression,
evaluations, training); jobs that name no run (fetching, Block Influence, the held-out split,
inference timing, tables) are **shared**. Runs are grouped by the table they feed
(``Run.table``: ``main``, ``paper_protocol``, ``kd``, ``ablation``, ``extension``, ``dense``)
and, inside ``main``, by method. Minutes are job-seconds over the run's parallel slots
(``--slots``, 2 on the 2-core machines): what removing a group would take off a run whose
slots stay busy (the AMD profile measured them busy 98 % of the run). A run that another
run needs as its input (``match``/``budget``/``lr_from``/``compressed_from``) cannot be
dropped alone; the per-run table lists those links.

Example::

    python -m benchmarks.grid_cost \
        --jobs-csv results/reference/smollm2-135m/amd_1eef3d8/dag_profile_jobs.csv \
        --configfile config/config.yaml --markdown grid_cost.md
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from flexigpt.workflow.dag.grid import RunGrid

SHARED = "shared"
_FIELD = re.compile(r"(\w+)=([^,]+)")
LINKS = ("match", "budget", "lr_from", "compressed_from")


def wildcards(job: Any) -> dict[str, str]:
    """``"model=m, method=x, ..."`` → ``{"model": "m", "method": "x", ...}`` (empty: none)."""
    return {k: v.strip() for k, v in _FIELD.findall(job)} if isinstance(job, str) else {}


def charge(jobs: pd.DataFrame, grid: RunGrid) -> pd.DataFrame:
    """``jobs`` with the run each job serves (``run``: method/variant/setting, or
    :data:`SHARED`), its table and method.

    Raises:
        ValueError: a job names a run the config's grid does not have (the wrong config).
    """
    rows = []
    for job in jobs.itertuples(index=False):
        fields = wildcards(job.job)
        key = tuple(fields.get(k) for k in ("model", "method", "variant", "setting"))
        if None in key[1:]:
            rows.append({"run": SHARED, "table": SHARED, "method": SHARED})
            continue
        if key not in grid.runs:
            raise ValueError(f"job {job.rule} {job.job!r} names a run the config's grid does "
                             "not have: profile and config are from different runs")
        rows.append({"run": "/".join(key[1:]), "table": grid.runs[key].table,
                     "method": key[1]})
    return pd.concat([jobs.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def group_cost(charged: pd.DataFrame, by: list[str], slots: int) -> pd.DataFrame:
    """Runs (shared jobs are none), jobs, job-seconds, share of all and minutes on
    ``slots`` per group of ``by``."""
    grouped = charged.groupby(by)
    runs = charged["run"].where(charged["run"] != SHARED).groupby([charged[k] for k in by])
    out = pd.DataFrame({"runs": runs.nunique(), "jobs": grouped.size(),
                        "job_s": grouped["wall_s"].sum().round(0)})
    out["share"] = (out["job_s"] / charged["wall_s"].sum()).map("{:.1%}".format)
    out["minutes"] = (out["job_s"] / slots / 60).round(1)
    return out.sort_values("job_s", ascending=False)


def run_links(grid: RunGrid) -> dict[str, str]:
    """Per run (method/variant/setting): the runs that take it as an input (``match``,
    ``budget``, ``lr_from``, ``compressed_from``), named up to three, else counted."""
    needed: dict[str, set[str]] = {}
    for run in grid.runs.values():
        for link in LINKS:
            ref = getattr(run, link)
            if ref is not None:
                needed.setdefault("/".join(ref[1:]), set()).add("/".join(run.key[1:]))
    return {k: ", ".join(sorted(v)) if len(v) <= 3 else f"{len(v)} runs"
            for k, v in needed.items()}


def report(jobs_csv: Path, config: dict[str, Any], slots: int) -> str:
    """The cost tables as Markdown: per table, per method of ``main``, per run."""
    grid = RunGrid.from_config(config)
    charged = charge(pd.read_csv(jobs_csv), grid)
    total = charged["wall_s"].sum()
    per_run = group_cost(charged[charged["run"] != SHARED], ["table", "run"], slots)
    links = run_links(grid)
    per_run["needed by"] = [links.get(run, "") for _, run in per_run.index]
    per_run = per_run.reset_index().drop(columns="runs")
    main = charged[charged["table"] == "main"]
    lines = [f"{len(charged)} jobs, {total:.0f} job-seconds = {total / slots / 60:.1f} min on "
             f"{slots} busy slots ({jobs_csv}).", "", "Per table:", "",
             group_cost(charged, ["table"], slots).to_markdown(), "",
             "Per method inside `main` (Table 1 and the replacement tables):", "",
             group_cost(main, ["method"], slots).to_markdown(), "", "Per run:", "",
             per_run.to_markdown(index=False), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-csv", required=True, type=Path,
                        help="the per-job table of benchmarks.dag_profile")
    parser.add_argument("--configfile", type=Path, default=Path("config/config.yaml"),
                        help="the config the profiled run used")
    parser.add_argument("--slots", type=int, default=2, help="jobs the run ran at once")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables")
    args = parser.parse_args(argv)
    if args.slots < 1:
        parser.error("--slots must be >= 1")
    text = report(args.jobs_csv, yaml.safe_load(args.configfile.read_text()), args.slots)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
