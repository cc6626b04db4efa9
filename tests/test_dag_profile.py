"""benchmarks/dag_profile.py: jobs, their self-reported compute and the critical path, read
from a Snakemake log and the jobs' own logs (issue 51)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import load_benchmark

profile = load_benchmark("dag_profile")

SNAKEMAKE_LOG = textwrap.dedent("""\
    [Sun Dec  6 12:00:00 2026]
    localrule compress:
        input: model
        output: c
        log: logs/compress.log
        jobid: 1
        wildcards: method=a
    [Sun Dec  6 12:00:00 2026]
    localrule other:
        input: model
        output: o
        log: logs/other.log
        jobid: 3
    [Sun Dec  6 12:01:00 2026]
    Finished jobid: 1 (Rule: compress)
    [Sun Dec  6 12:01:20 2026]
    Finished jobid: 3 (Rule: other)
    [Sun Dec  6 12:01:30 2026]
    localrule train:
        input: c, o
        output: t
        log: logs/train.log
        jobid: 2
        wildcards: method=a
    [Sun Dec  6 12:11:30 2026]
    Finished jobid: 2 (Rule: train)
    """)
TRAIN_LOG = textwrap.dedent("""\
    2026-12-06 12:02:00,000 INFO flexigpt.runtime.training.tuning: trial t0: rung at step 6 after 60.0s of training
    2026-12-06 12:03:00,000 INFO flexigpt.runtime.training.tuning: trial t1: rung at step 6 after 70.0s of training
    2026-12-06 12:10:00,000 INFO flexigpt.runtime.training.runner: trained 16 steps, 32768 tokens in 300.0s; held-out ppl 1 -> 2
    2026-12-06 12:10:01,000 INFO flexigpt.runtime.training.tuning: chose trial 0 of 2 (lr 0.004)
    """)


def test_jobs_compute_and_critical_path(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/train.log").write_text(TRAIN_LOG)
    (tmp_path / "logs/compress.log").write_text(
        "2026-12-06 12:00:30,000 INFO flexigpt.runtime.evaluation.results: perplexity 9.0 over 4 × 8 "
        "tokens (12.5 s)\n2026-12-06 12:00:40,000 INFO flexigpt.runtime.evaluation.zeroshot: piqa: "
        "acc = 0.6000 ± 0.0100 (1000 docs, 20.0 s)\n")
    log = tmp_path / "run.snakemake.log"
    log.write_text(SNAKEMAKE_LOG)
    jobs = profile.parse_log(log.read_text())
    assert {j: (jobs[j].rule, jobs[j].seconds) for j in jobs} == {
        1: ("compress", 60.0), 2: ("train", 600.0), 3: ("other", 80.0)}
    frame = profile.job_frame(jobs, tmp_path).set_index("jobid")
    # the chosen trial's rung steps are inside its final 300 s; the losing trial's 70 s count
    assert frame.at[2, "compute_s"] == 370.0 and frame.at[2, "overhead_s"] == 230.0
    assert frame.at[1, "compute_s"] == 32.5  # perplexity and the task
    path = profile.critical_path(jobs)  # of train's inputs, 'other' finished last
    assert [(j.rule, wait) for j, wait in path] == [("other", 0.0), ("train", 10.0)]
    text = profile.report(log, tmp_path)
    assert "3 finished jobs" in text and "| train |" in text
