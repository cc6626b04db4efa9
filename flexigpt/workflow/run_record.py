"""What one ``flexigpt run`` took, written by the run itself: the measured records the
README's run-time block is generated from (:mod:`flexigpt.tables.run_times`), so no run
time is ever typed by hand.

A record is written only for a run that did work and succeeded (exit 0, not a dry run, a
lint, a report, an unlock or a cleanup). It lands in ``results/<model key>/run_records/``
as ``<start, UTC>.json``:

* ``config``: the config files, in order (the default ``config/config.yaml`` when none);
  ``snakemake_args``: the arguments as given (targets included: ``whole_grid`` is false
  when any argument names a path under ``results/``);
* ``commit``, ``machine`` (the CPU model and its bf16 / AMX flags, :func:`cpu_name`),
  ``cores`` (the machine's) and ``cores_given`` (``--cores``);
* ``started`` / ``ended`` (UTC, ISO 8601), ``minutes`` (wall time of the Snakemake call),
  ``jobs`` (jobs Snakemake finished, counted in its own log of this call);
* ``load``: the 1-minute load average sampled every ``LOAD_PERIOD_S`` during the run
  (``mean``, ``max``) and the machine's core count, so a reader sees whether anything ran
  beside it (``beside``: true when the mean exceeds the cores the run was given by more
  than ``LOAD_SLACK``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import atomic_write_text
from flexigpt.core.provenance import cpu_name, git_commit

RECORD_DIR = "run_records"
SCHEMA = 1
#: seconds between load samples
LOAD_PERIOD_S = 15.0
#: load above the run's cores that counts as "something ran beside it"
LOAD_SLACK = 0.5
#: arguments after which Snakemake does no work (no record)
NO_WORK = {"-n", "--dry-run", "--dryrun", "--lint", "--report", "--unlock", "--summary",
           "--detailed-summary", "--list-rules", "-l", "--cleanup-metadata", "--touch", "-t",
           "--delete-all-output", "--delete-temp-output", "--dag", "--rulegraph",
           "--filegraph", "--version", "-v", "-h", "--help", "--list-target-rules"}
_FINISHED = re.compile(r"^Finished job(?:id)?[: ]", re.MULTILINE)


def does_work(args: list[str]) -> bool:
    """False when ``args`` ask Snakemake for something other than running jobs."""
    return not any(a.split("=", 1)[0] in NO_WORK for a in args)


def cores_given(args: list[str]) -> str | None:
    """The value of ``--cores`` / ``-c`` / ``--jobs`` / ``-j`` (``all`` or a number)."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--cores", "-c", "--jobs", "-j"):
            if eq:
                return value
            if i + 1 < len(args) and not args[i + 1].startswith("-"):
                return args[i + 1]
    return None


@dataclass
class LoadSampler:
    """Samples the 1-minute load average in a daemon thread until :meth:`stop`."""

    period: float = LOAD_PERIOD_S
    samples: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.period):
                return

    def stop(self) -> dict[str, float]:
        """Stop sampling; ``{"mean", "max"}`` of the samples (one taken now if none)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if not self.samples:
            self.samples.append(os.getloadavg()[0])
        return {"mean": round(sum(self.samples) / len(self.samples), 2),
                "max": round(max(self.samples), 2)}


def jobs_finished(workdir: Path, since: float) -> int | None:
    """Jobs finished in the Snakemake log this call wrote (the newest log started at or
    after ``since``, a Unix time); None when there is none."""
    logs = [p for p in (workdir / ".snakemake" / "log").glob("*.snakemake.log")
            if p.stat().st_mtime >= since]
    if not logs:
        return None
    newest = max(logs, key=lambda p: p.stat().st_mtime)
    return len(_FINISHED.findall(newest.read_text(errors="replace")))


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_record(*, config: list[str], args: list[str], started: float, ended: float,
                 jobs: int | None, load: dict[str, float]) -> dict[str, Any]:
    """The record of one successful run (see the module docstring for the fields)."""
    given = cores_given(args)
    cores = os.cpu_count() or 1
    run_cores = min(cores, int(given)) if given and given.isdigit() else cores
    return {"schema": SCHEMA, "config": config, "snakemake_args": args,
            "whole_grid": not any(a.startswith("results/") for a in args),
            "commit": git_commit(), "machine": cpu_name(), "cores": cores,
            "cores_given": given, "started": _utc(started), "ended": _utc(ended),
            "minutes": round((ended - started) / 60, 1), "jobs": jobs,
            "load": {**load, "beside": load["mean"] > run_cores + LOAD_SLACK}}


def write_record(results_dir: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` under ``results_dir/run_records/`` atomically; its path."""
    stamp = record["started"].replace(":", "").replace("-", "")
    path = results_dir / RECORD_DIR / f"{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path
