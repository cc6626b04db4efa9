"""Run times come from records the runs wrote (:mod:`flexigpt.workflow.run_record`), and
the README's run-time block is what those records give (:mod:`flexigpt.tables.run_times`).
``flexigpt run`` writing a record for real is checked by the own-model walkthrough test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from flexigpt.tables import run_times
from flexigpt.workflow import run_record

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args,works", [
    (["--cores", "2"], True), (["-n", "--cores", "2"], False), (["--dry-run"], False),
    (["--report=r.html"], False), (["--unlock"], False), (["results/x/eval_final.json"], True),
])
def test_only_runs_that_do_work_are_recorded(args, works):
    assert run_record.does_work(args) is works


@pytest.mark.parametrize("args,cores", [
    (["--cores", "all"], "all"), (["-c", "2", "t"], "2"), (["--cores=1"], "1"), ([], None),
    (["--cores", "--configfile", "x"], None),
])
def test_cores_given(args, cores):
    assert run_record.cores_given(args) == cores


def test_jobs_are_counted_in_this_calls_snakemake_log(tmp_path: Path):
    logs = tmp_path / ".snakemake" / "log"
    logs.mkdir(parents=True)
    old = logs / "2026-01-01T000000.1.snakemake.log"
    old.write_text("Finished jobid: 1 (Rule: a)\n")
    since = time.time() + 5
    assert run_record.jobs_finished(tmp_path, since) is None  # nothing written since
    new = logs / "2026-01-02T000000.1.snakemake.log"
    new.write_text("localrule a:\nFinished jobid: 3 (Rule: a)\nx\nFinished jobid: 4 "
                   "(Rule: b)\n2 of 2 steps (100%) done\n")
    import os
    os.utime(new, (since + 1, since + 1))
    assert run_record.jobs_finished(tmp_path, since) == 2


def test_load_sampler_reports_mean_and_max():
    load = run_record.LoadSampler(period=0.01).start()
    time.sleep(0.05)
    stats = load.stop()
    assert set(stats) == {"mean", "max"} and stats["max"] >= stats["mean"] >= 0


def _record(tmp: Path, name: str, *, started: str, minutes: float, load: float,
            whole: bool = True, config: str = "config/config.yaml") -> None:
    rec = run_record.build_record(config=[config], args=["--cores", "2"], started=0,
                                  ended=60 * minutes, jobs=115, load={"mean": load, "max": load})
    rec.update(started=started, whole_grid=whole, machine="AMD EPYC (avx512_bf16)",
               commit="0123456789")
    folder = tmp / "results" / "reference" / name / "run_records"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{started}.json").write_text(json.dumps(rec))


def test_the_block_takes_the_newest_clean_whole_grid_record(tmp_path: Path):
    _record(tmp_path, "a", started="2026-01-01T00:00:00Z", minutes=100.0, load=2.0)
    _record(tmp_path, "b", started="2026-02-01T00:00:00Z", minutes=90.0, load=2.1)
    _record(tmp_path, "c", started="2026-03-01T00:00:00Z", minutes=50.0, load=6.0)  # beside
    _record(tmp_path, "d", started="2026-04-01T00:00:00Z", minutes=20.0, load=2.0,
            whole=False)  # targets only
    text = run_times.block(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| `config/config.yaml`"))
    assert "90 min" in line and "AMD EPYC (avx512_bf16)" in line and "| 115 |" in line
    assert "| `config/smoke.yaml` | no record yet |" in text
    assert "50 min" not in text and "20 min" not in text


def test_a_file_that_is_not_a_record_is_named(tmp_path: Path):
    bad = tmp_path / "results" / "reference" / "x" / "run_records" / "r.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1}')
    with pytest.raises(ValueError, match="r.json: not a run-time record"):
        run_times.block(tmp_path)


def test_readme_run_times_are_what_the_committed_records_give():
    """Regenerate with ``python -m flexigpt.tables.run_times README.md``."""
    text = (ROOT / "README.md").read_text()
    start, end = text.index(run_times.START), text.index(run_times.END)
    assert text[start:end + len(run_times.END)] == run_times.block(ROOT), \
        "README run times are stale: regenerate them"
