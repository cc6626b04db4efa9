"""benchmarks/dag_profile.py: jobs, their self-reported compute and the critical path, read
from a Snakemake log and the jobs' own logs (issue 51)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import load_benchmark

from flexigpt.workflow.dag.grid import RunGrid

profile = load_benchmark("dag_profile")
grid_cost = load_benchmark("grid_cost")

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


def test_jobs_csv_is_the_job_frame(tmp_path: Path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/train.log").write_text(TRAIN_LOG)
    log = tmp_path / "run.snakemake.log"
    log.write_text(SNAKEMAKE_LOG)
    out = tmp_path / "jobs.csv"
    assert profile.main(["--log", str(log), "--workdir", str(tmp_path),
                         "--jobs-csv", str(out)]) == 0
    written = pd.read_csv(out).set_index("jobid")
    assert written.at[2, "compute_s"] == 370.0 and written.at[2, "rule"] == "train"


def _smoke_jobs(rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"jobid": i, "rule": rule, "job": job, "wall_s": wall}
                         for i, (rule, job, wall) in enumerate(rows)])


def test_grid_cost_charges_each_job_to_the_run_and_table_it_serves(tmp_path: Path):
    config = yaml.safe_load(Path("config/smoke.yaml").read_text())
    grid = RunGrid.from_config(config)
    main_run, ablation = (next(r for r in grid.runs.values() if r.table == table)
                          for table in ("main", "ablation"))

    def job(run, stage=""):
        return (f"model={run.model}, method={run.method}, variant={run.variant}, "
                f"setting={run.setting}{stage}")

    jobs = _smoke_jobs([("compress", job(main_run), 10.0),
                        ("evaluate", job(main_run, ", stage=final"), 50.0),
                        ("train", job(ablation), 200.0),
                        ("block_influence", f"model={main_run.model}", 60.0),
                        ("tables", "", 20.0)])
    charged = grid_cost.charge(jobs, grid)
    assert list(charged["table"]) == ["main", "main", "ablation", "shared", "shared"]
    per_table = grid_cost.group_cost(charged, ["table"], slots=2)
    assert per_table.loc["ablation", "job_s"] == 200.0
    assert per_table.loc["main", "jobs"] == 2 and per_table.loc["main", "runs"] == 1
    assert per_table.loc["shared", "minutes"] == round(80 / 2 / 60, 1)
    assert per_table.loc["shared", "runs"] == 0
    assert list(per_table.index) == ["ablation", "shared", "main"]  # dearest first
    csv = tmp_path / "jobs.csv"
    jobs.to_csv(csv, index=False)
    text = grid_cost.report(csv, config, slots=2)
    assert "340 job-seconds = 2.8 min on 2 busy slots" in text


def test_grid_cost_names_the_runs_a_run_is_an_input_of():
    grid = RunGrid.from_config(yaml.safe_load(Path("config/smoke.yaml").read_text()))
    links = grid_cost.run_links(grid)
    for run in grid.runs.values():
        if run.compressed_from is not None:
            source = "/".join(run.compressed_from[1:])
            assert "/".join(run.key[1:]) in links[source] or links[source].endswith(" runs")


def test_grid_cost_refuses_a_profile_of_another_grid(tmp_path: Path):
    grid = RunGrid.from_config(yaml.safe_load(Path("config/smoke.yaml").read_text()))
    jobs = _smoke_jobs([("train", "model=tiny-llama, method=nowhere, variant=default, "
                         "setting=r0.3", 1.0)])
    with pytest.raises(ValueError, match="different runs"):
        grid_cost.charge(jobs, grid)


def test_compute_lines_of_compression_and_tuning_evaluations_count():
    text = TRAIN_LOG + (
        "2026-12-06 12:01:00,000 INFO flexigpt.runtime.training.loop: tune-split perplexity "
        "80.0000 at step 0 (compute 4.5 s)\n"
        "2026-12-06 12:10:00,500 INFO flexigpt.runtime.training.runner: tune-split perplexity "
        "40.0000 after training (compute 5.0 s)\n")
    assert profile.compute_seconds(text) == 370.0 + 4.5 + 5.0
    compress = ("2026-12-06 12:00:30,000 INFO flexigpt.api.compression: compressed with m "
                "(compute 30.0 s)\n")
    assert profile.compute_seconds(compress) == 30.0


def test_ab_jobs_refuses_a_run_without_a_trained_model(tmp_path: Path, capsys, monkeypatch):
    ab_jobs = load_benchmark("ab_jobs")
    config = Path("config/smoke.yaml").resolve()
    run = next(r for r in RunGrid.from_config(yaml.safe_load(config.read_text())).runs.values()
               if r.recovery)
    monkeypatch.chdir(tmp_path)  # no results/ here
    with pytest.raises(SystemExit):
        ab_jobs.main(["--mode", "train", "--configfile", str(config),
                      "--run", "/".join(run.key)])
    assert "no trained/ model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab_jobs.main(["--mode", "eval", "--configfile", str(config),
                      "--run", "m/method/variant/r0.3"])
    assert "not a run of" in capsys.readouterr().err


def test_ab_jobs_summary_compares_means_and_results():
    ab_jobs = load_benchmark("ab_jobs")

    def line(code, seconds, sha="s"):
        return {"mode": "train", "code": code, "job_s": seconds, "cpu_s": seconds,
                "weights_sha256": sha, "trials": [{"lr": 1.0}]}

    text = ab_jobs.summary([line("before", 100.0), line("after", 80.0), line("after", 90.0),
                            line("before", 110.0)])
    assert "| train | `before` | 2 | 100.0, 110.0 | 105.0 | +0.0% | 105.0 | yes |" in text
    assert "| train | `after` | 2 | 80.0, 90.0 | 85.0 | -19.0% | 85.0 | yes |" in text
    assert "| NO |" in ab_jobs.summary([line("a", 1.0), line("b", 1.0, sha="other")])
