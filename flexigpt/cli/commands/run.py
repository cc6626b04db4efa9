"""flexigpt run: the DAG (``snakemake``) that resumes after any interruption by itself.

``flexigpt run --cores all [any snakemake option]`` runs ``python -m snakemake`` with the
same options plus ``--rerun-incomplete`` (outputs are written atomically, so a job that was
cut simply runs again). A kill -9 leaves Snakemake's lock in ``.snakemake/locks/``, and plain
``snakemake`` then stops with ``LockException`` until ``--unlock``; this command removes the
lock first when it is *stale*: the ``flexigpt run`` that started it recorded the snakemake
process (pid and start time, :class:`OwnerRecord`) and its lock files, that process is gone,
and the lock files are the ones it recorded. The record is written only by a run whose
snakemake took the lock; a run refused because another holds it writes nothing. Nothing is decided from command lines: a lock
of a run started any other way (``python -X dev -m snakemake ...``), of a live run, or one
the record does not name is left alone, and Snakemake's own message says what to do.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from flexigpt.core.fileio import atomic_write_text
from flexigpt.workflow import run_record
from flexigpt.workflow.config_check import ConfigError, check_config_files

log = logging.getLogger(__name__)

HELP = "run the Snakemake DAG (stale lock after a kill cleared, cut jobs rerun)"
LOCK_DIR = Path(".snakemake") / "locks"
#: the environment variable naming the harness's interpreter in the DAG's shell rules
PYTHON_VAR = "FLEXIGPT_PYTHON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER,
                   help="options passed to snakemake unchanged (e.g. --cores all "
                        "--configfile config/smoke.yaml)")


#: in the lock folder: who holds the lock ``flexigpt run`` started (pid, start time, the
#: lock files' identities)
OWNER_FILE = "flexigpt-run-owner.json"


def process_start(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, field 22 of
    ``/proc/<pid>/stat``): with the pid it names one process for good, since a reused pid
    starts later. None when no such process runs (or ``/proc`` cannot tell)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and ')'
    return fields[19] if len(fields) > 19 and fields[0] != "Z" else None


def lock_identity(path: Path) -> list[int]:
    """``[inode, mtime_ns]`` of a lock file: a lock written by another run differs."""
    st = path.stat()
    return [st.st_ino, st.st_mtime_ns]


def clear_stale_lock(workdir: Path, proc: Path = Path("/proc")) -> list[Path]:
    """Remove ``workdir/.snakemake/locks/*.lock`` only when its owner is provably gone: the
    owner record a ``flexigpt run`` wrote names a process that no longer runs (pid and start
    time) and every lock file is one that run recorded (inode and mtime). A lock with no
    record (a run started any other way, or killed before its lock was recorded), a live
    owner, or a lock file the record does not name is left alone, and Snakemake's own
    message says what to do. Returns the files removed."""
    lock_dir = workdir / LOCK_DIR
    locks = sorted(lock_dir.glob("*.lock"))
    if not locks:
        return []
    if not (proc / "self").exists():
        log.warning("cannot tell whether %s is locked by a live run (no /proc); leaving it",
                    workdir)
        return []
    try:
        record = json.loads((lock_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        log.warning("%s is locked by a run flexigpt run did not start (no owner record); "
                    "left alone: if no run is live there, `snakemake --unlock` frees it",
                    workdir)
        return []
    if process_start(int(record["pid"]), proc) == record["start"]:
        log.info("snakemake is running in %s (pid %s); its lock is kept", workdir,
                 record["pid"])
        return []
    recorded = record.get("locks") or {}
    if any(recorded.get(lock.name) != lock_identity(lock) for lock in locks):
        log.warning("%s holds a lock its last flexigpt run did not write; left alone: if no "
                    "run is live there, `snakemake --unlock` frees it", workdir)
        return []
    for lock in locks:
        lock.unlink(missing_ok=True)
    (lock_dir / OWNER_FILE).unlink(missing_ok=True)
    log.info("removed a stale Snakemake lock (its run, pid %s, is gone): %s", record["pid"],
             ", ".join(p.name for p in locks))
    return locks


def _lock_files(lock_dir: Path) -> dict[str, list[int]]:
    """``{name: identity}`` of the lock files in ``lock_dir`` now (one removed meanwhile is
    left out)."""
    locks = {}
    for lock in lock_dir.glob("*.lock"):
        try:
            locks[lock.name] = lock_identity(lock)
        except OSError:
            continue
    return locks


class OwnerRecord:
    """Keeps ``OWNER_FILE`` for the snakemake process ``child`` once it holds a lock.

    The record belongs to the run that holds the lock: it is written only when lock files
    appear that were not there when the child started (``before``, taken before it was
    started), naming the child (pid, start time) and those files alone. A run that
    Snakemake refuses (another run holds the lock) takes no lock, so it never writes the
    record and never names another run's lock files as its own. It is removed when its run
    ends without leaving its locks behind (a killed run leaves both, for
    :func:`clear_stale_lock`); a record this run did not write is never touched."""

    def __init__(self, workdir: Path, child: subprocess.Popen, proc: Path = Path("/proc"),
                 poll: float = 0.2, before: dict[str, list[int]] | None = None) -> None:
        self.path = workdir / LOCK_DIR / OWNER_FILE
        self.child, self.poll = child, poll
        self.before = _lock_files(self.path.parent) if before is None else before
        self.record: dict[str, Any] = {"pid": child.pid, "start": process_start(child.pid, proc),
                                       "locks": {}}
        self.written = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(self.record, sort_keys=True))
        self.written = True

    def _watch(self) -> None:
        while not self._stop.is_set() and self.child.poll() is None:
            locks = {name: ident for name, ident in _lock_files(self.path.parent).items()
                     if self.before.get(name) != ident}
            if locks and locks != self.record["locks"]:
                self.record["locks"] = locks
                self._write()
            self._stop.wait(self.poll)

    def close(self) -> None:
        """Stop watching; once the child has ended, remove the record it wrote unless one of
        its lock files is still there (killed: the record lets the next run clear it)."""
        self._stop.set()
        self._thread.join()
        if not self.written or self.child.poll() is None:
            return
        current = _lock_files(self.path.parent)
        if any(current.get(name) == ident for name, ident in self.record["locks"].items()):
            return
        try:
            mine = json.loads(self.path.read_text()) == self.record
        except (OSError, ValueError):
            mine = False
        if mine:
            self.path.unlink(missing_ok=True)


def export_harness_python(uses_conda: bool) -> str:
    """Set ``$FLEXIGPT_PYTHON``, the interpreter the DAG's shell rules run the harness with
    (``"$FLEXIGPT_PYTHON" -m flexigpt ...``), and return it.

    It is the interpreter running Snakemake (``sys.executable``), so the rules need no
    ``flexigpt`` on ``PATH`` (``.venv/bin/snakemake`` without an activated venv); a SLURM
    job runs the same interpreter, which re-reads the Snakefile and sets it again. Under
    ``--use-conda`` (``uses_conda``) it is the job environment's ``python``, which imports
    the checkout through ``PYTHONPATH``. An environment variable rather than a literal path
    or a param: the rules' code and params are the same on every machine, so where the
    interpreter lives never triggers a rerun.
    """
    python = "python" if uses_conda else sys.executable
    os.environ[PYTHON_VAR] = python
    return python


def snakemake_command(args: list[str]) -> list[str]:
    extra = [] if "--rerun-incomplete" in args or "--ri" in args else ["--rerun-incomplete"]
    return [sys.executable, "-m", "snakemake", *args, *extra]


def configfiles(args: list[str]) -> list[str]:
    """The paths given to ``--configfile``/``--configfiles`` (each flag takes the words up
    to the next option), in order."""
    found, taking = [], False
    for arg in args:
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            taking = name in ("--configfile", "--configfiles")
            if taking and eq:
                found.append(value)
                taking = name == "--configfiles"
        elif taking:
            found.append(arg)
    return found


#: the config Snakemake reads when no ``--configfile`` is given (the Snakefile's default)
DEFAULT_CONFIG = Path("config") / "config.yaml"


def merged_config(files: list[str]) -> dict[str, Any]:
    """The config Snakemake builds from ``files`` in order (later keys win, mappings merged
    key by key: its own ``update_config``)."""
    import yaml
    from snakemake.utils import update_config

    config: dict[str, Any] = {}
    for path in files:
        update_config(config, yaml.safe_load(Path(path).read_text()) or {})
    return config


def preflight_config(passed: list[str], workdir: Path) -> None:
    """The config checks of the Snakefile, before Snakemake starts, so that a bad config is
    one line naming the file and the key (:func:`flexigpt.workflow.config_schema.check_schema`, then
    the run grid's checks: :meth:`flexigpt.workflow.dag.RunGrid.from_config`), not the schema dump
    and stack frames Snakemake wraps around it. Skipped for ``--config`` overrides (the
    Snakefile checks the merged result) and when no config file is at hand.

    Raises:
        ConfigError: one line.
    """
    import contextlib

    from flexigpt.workflow.config_schema import check_schema
    from flexigpt.workflow.dag import RunGrid

    files = configfiles(passed) or ([str(DEFAULT_CONFIG)] if DEFAULT_CONFIG.is_file() else [])
    if not files or any(a in ("--config", "-C") or a.startswith("--config=") for a in passed):
        return
    config = merged_config(files)
    check_schema(config, files)
    named = ", ".join(repr(f) for f in files)
    with contextlib.chdir(workdir):
        try:
            RunGrid.from_config(config)
        except ConfigError as err:
            raise ConfigError(f"config file {named}: {err}") from None
        except (ValueError, KeyError) as err:
            raise ConfigError(f"config file {named}: {' '.join(str(err).split())}") from None


def _record_run(passed: list[str], workdir: Path, started: float,
                load: run_record.LoadSampler) -> None:
    """Write the run-time record of a finished run (:mod:`flexigpt.workflow.run_record`)
    into its results folder; a failure to write it is a warning, never the run's error."""
    ended = time.time()
    files = configfiles(passed) or [str(DEFAULT_CONFIG)]
    try:
        key = merged_config(files)["model"]["key"]
        record = run_record.build_record(
            config=files, args=passed, started=started, ended=ended,
            jobs=run_record.jobs_finished(workdir, started), load=load.stop())
        path = run_record.write_record(workdir / "results" / str(key), record)
    except (OSError, KeyError, TypeError, ValueError) as err:
        log.warning("run-time record not written: %s", err)
        return
    log.info("run-time record: %s (%.1f min, %s jobs)", path, record["minutes"], record["jobs"])


def run(args: argparse.Namespace) -> int:
    passed = [a for a in args.snakemake_args if a != "--"]
    # an empty or non-mapping --configfile is refused here, naming the file, before
    # Snakemake parses it (its own message for a YAML list does not name the file)
    workdir = Path.cwd()
    for flag in ("--directory", "-d"):
        if flag in passed and passed.index(flag) + 1 < len(passed):
            workdir = Path(passed[passed.index(flag) + 1])
    try:
        check_config_files(configfiles(passed))
        preflight_config(passed, workdir)
    except ConfigError as err:
        log.error("%s", err)
        return 1
    clear_stale_lock(workdir)
    before = _lock_files(workdir / LOCK_DIR)  # another run's locks are never taken as ours
    started, load = time.time(), run_record.LoadSampler().start()
    child = subprocess.Popen(snakemake_command(passed))
    owner = OwnerRecord(workdir, child, before=before)
    try:
        rc = child.wait()
        if rc == 0 and run_record.does_work(passed):
            _record_run(passed, workdir, started, load)
        return rc
    except KeyboardInterrupt:  # snakemake got the same SIGINT: let it stop its jobs
        try:
            return child.wait(timeout=60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            child.kill()
            child.wait()
            return 130
    finally:
        owner.close()
