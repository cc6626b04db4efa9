"""Where a finished DAG run's time went: per rule, fixed overhead against compute, and the
critical path (issue 51).

Inputs, all written by the run itself:

* Snakemake's own log (``.snakemake/log/<date>.snakemake.log``): every job's start
  (``[date]`` then ``rule``/``localrule``, its ``jobid``, ``input:`` and ``output:``) and end
  (``Finished jobid: N``);
* each job's log (its ``log:`` file): the seconds the job reported for its compute —
  training steps (``trained N steps, T tokens in S s``), each zero-shot task and the
  perplexity pass (``... (S s)``), each forward / decode timing, and every line that ends
  in ``(compute S s)``: a method's compression, Block Influence, each tuning-split
  perplexity of a training job (logs from before that convention have none of these, so
  their compression and tuning evaluations count as overhead).

Per job, **compute** is the sum of those self-reported seconds and **overhead** the rest of
its wall time (interpreter start, imports, model load, tokenisation, task construction,
checkpoints, saving). Per rule the table sums them. The **critical path** follows, from the
job that finished last, the input-producing job that finished last before it; a gap between
a job's start and its predecessor's end is time the job waited for a free core.

Example (the run's working directory)::

    python -m benchmarks.dag_profile --log .snakemake/log/<date>.snakemake.log \
        --markdown results/dag_profile.md
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pandas as pd

#: self-reported compute seconds in a job log (training, tasks, perplexity, timings).
COMPUTE = [re.compile(r"trained \d+ steps, \d+ tokens in ([\d.]+)s"),
           re.compile(r"\(compute ([\d.]+) s\)$"),
           re.compile(r"INFO flexigpt\.(?:runtime\.)?evaluation\.(?:zeroshot|results): .*[(, ]([\d.]+) s\)$"),
           re.compile(r"decode \[\d+/\d+\] .*\(([\d.]+) s\)$")]
_RUNG = re.compile(r"trial (t\d+): rung at step \d+ after ([\d.]+)s of training")
_CHOSE = re.compile(r"chose trial (\d+) of \d+")
_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_RULE = re.compile(r"^(?:local)?rule (\w+):$")
_FIELD = re.compile(r"^\s+(input|output|log|jobid|wildcards): (.*)$")
_DONE = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


@dataclass
class Job:
    """One job of the run: its rule, times and files."""

    jobid: int
    rule: str
    start: datetime
    end: datetime | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    log: str | None = None
    wildcards: str = ""

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds() if self.end else float("nan")


def parse_log(text: str) -> dict[int, Job]:
    """Jobs of a Snakemake log: start from the stamp before their rule line, end from the
    stamp before ``Finished jobid``; jobs that never finished keep ``end`` None."""
    jobs: dict[int, Job] = {}
    stamp: datetime | None = None
    current: dict[str, str] = {}
    for line in text.splitlines():
        if m := _STAMP.match(line):
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y")
        elif (m := _RULE.match(line)) and stamp is not None:
            current = {"rule": m.group(1), "start": stamp.isoformat()}
        elif (m := _FIELD.match(line)) and current:
            current[m.group(1)] = m.group(2).strip()
            if m.group(1) == "jobid":
                jid = int(m.group(2))
                jobs[jid] = Job(jid, current["rule"], datetime.fromisoformat(current["start"]),
                                inputs=_split(current.get("input")),
                                outputs=_split(current.get("output")), log=current.get("log"))
        elif (m := _DONE.match(line)) and stamp is not None and int(m.group(1)) in jobs:
            jobs[int(m.group(1))].end = stamp
        if current and "jobid" in current and line.strip().startswith("wildcards:"):
            jobs[int(current["jobid"])].wildcards = line.split(":", 1)[1].strip()
    return jobs


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",")] if value else []


def compute_seconds(log_text: str) -> float:
    """The compute seconds a job log reports (0 when it reports none): every line of
    :data:`COMPUTE`, plus the rung training of each learning-rate trial that was not chosen
    (the chosen one's rung steps are inside its final ``trained ... in S s``)."""
    total = 0.0
    rungs: dict[str, float] = {}
    chosen = None
    for line in log_text.splitlines():
        line = line.strip()
        if m := _RUNG.search(line):
            rungs[m.group(1)] = float(m.group(2))
            continue
        if m := _CHOSE.search(line):
            chosen = f"t{m.group(1)}"
            continue
        for pattern in COMPUTE:
            if m := pattern.search(line):
                total += float(m.group(1))
                break
    return total + sum(v for k, v in rungs.items() if k != chosen)


def job_frame(jobs: dict[int, Job], workdir: Path) -> pd.DataFrame:
    """One row per finished job: rule, wildcards, wall, compute, overhead (seconds)."""
    rows = []
    for job in jobs.values():
        if job.end is None:
            continue
        log = workdir / job.log if job.log else None
        compute = compute_seconds(log.read_text(errors="ignore")) if log and log.is_file() else 0.0
        compute = min(compute, job.seconds)
        rows.append({"jobid": job.jobid, "rule": job.rule, "job": job.wildcards,
                     "wall_s": job.seconds, "compute_s": compute,
                     "overhead_s": job.seconds - compute})
    return pd.DataFrame(rows)


def rule_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per rule: jobs, wall, compute and overhead job-seconds, overhead share."""
    grouped = frame.groupby("rule")
    out = pd.DataFrame({"jobs": grouped.size(), "wall_s": grouped["wall_s"].sum().round(0),
                        "compute_s": grouped["compute_s"].sum().round(0),
                        "overhead_s": grouped["overhead_s"].sum().round(0)})
    out["overhead"] = (out["overhead_s"] / out["wall_s"]).map("{:.0%}".format)
    out["share of job-s"] = (out["wall_s"] / out["wall_s"].sum()).map("{:.0%}".format)
    return out.sort_values("wall_s", ascending=False)


def critical_path(jobs: dict[int, Job]) -> list[tuple[Job, float]]:
    """``(job, wait_s)`` from the first job to the one that finished last, each job the
    input producer that finished last before its successor; ``wait_s`` = its start minus
    its predecessor's end (time spent waiting for a core)."""
    done = {j.jobid: j for j in jobs.values() if j.end is not None}
    if not done:
        return []
    producer = {out: j for j in done.values() for out in j.outputs}
    chain = [max(done.values(), key=lambda j: j.end)]  # type: ignore[arg-type,return-value]
    while True:
        preds = [producer[i] for i in chain[-1].inputs if i in producer]
        if not preds:
            break
        chain.append(max(preds, key=lambda j: j.end))  # type: ignore[arg-type,return-value]
    chain.reverse()
    out = [(chain[0], 0.0)]
    for before, job in zip(chain, chain[1:], strict=False):
        assert before.end is not None
        out.append((job, max(0.0, (job.start - before.end).total_seconds())))
    return out


def report(log: Path, workdir: Path) -> str:
    """The profile as Markdown: per rule, then the critical path."""
    jobs = parse_log(log.read_text(errors="ignore"))
    return render(log, jobs, job_frame(jobs, workdir))


def render(log: Path, jobs: dict[int, Job], frame: pd.DataFrame) -> str:
    """:func:`report` of ``log``'s parsed ``jobs`` and their :func:`job_frame`."""
    if frame.empty:
        raise ValueError(f"{log}: no finished job")
    starts = [j.start for j in jobs.values()]
    ends = [j.end for j in jobs.values() if j.end is not None]
    wall = (max(ends) - min(starts)).total_seconds()
    lines = [f"Run: {len(frame)} finished jobs, {wall:.0f} s from the first start to the last "
             f"end, {frame['wall_s'].sum():.0f} job-seconds: compute "
             f"{frame['compute_s'].sum():.0f}, overhead {frame['overhead_s'].sum():.0f} "
             f"({frame['overhead_s'].sum() / frame['wall_s'].sum():.0%}).", "",
             rule_frame(frame).to_markdown(), "",
             "Critical path (the input producer that finished last, back from the last job):",
             "", "| rule | job | wall s | waited s |", "|---|---|---:|---:|"]
    path = critical_path(jobs)
    for job, wait in path:
        lines.append(f"| {job.rule} | {job.wildcards} | {job.seconds:.0f} | {wait:.0f} |")
    busy = sum(j.seconds for j, _ in path)
    lines += ["", f"Critical path: {busy:.0f} s of jobs + {sum(w for _, w in path):.0f} s "
              f"waiting for a core, of {wall:.0f} s wall."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, type=Path, help="Snakemake's log of the run")
    parser.add_argument("--workdir", type=Path, default=Path("."),
                        help="the run's working directory (job logs are relative to it)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the profile")
    parser.add_argument("--jobs-csv", type=Path, default=None,
                        help="also write the per-job table (the input of benchmarks.grid_cost)")
    args = parser.parse_args(argv)
    jobs = parse_log(args.log.read_text(errors="ignore"))
    frame = job_frame(jobs, args.workdir)
    text = render(args.log, jobs, frame)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    if args.jobs_csv:
        frame.sort_values("jobid").to_csv(args.jobs_csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
