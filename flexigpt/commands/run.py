"""flexigpt run: the DAG (``snakemake``) that resumes after any interruption by itself.

``flexigpt run --cores all [any snakemake option]`` runs ``python -m snakemake`` with the
same options plus ``--rerun-incomplete`` (outputs are written atomically, so a job that was
cut simply runs again). A kill -9 leaves Snakemake's lock in ``.snakemake/locks/``, and plain
``snakemake`` then stops with ``LockException`` until ``--unlock``; this command removes the
lock first when it is *stale*: no live ``snakemake`` process has the working directory as
its own (read from ``/proc``; where ``/proc`` is unavailable, the lock is left alone and
Snakemake's own message says what to do). A live run's lock is never touched.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

from flexigpt.config_check import ConfigError, check_config_files

log = logging.getLogger(__name__)

HELP = "run the Snakemake DAG (stale lock after a kill cleared, cut jobs rerun)"
LOCK_DIR = Path(".snakemake") / "locks"
#: the environment variable naming the harness's interpreter in the DAG's shell rules
PYTHON_VAR = "FLEXIGPT_PYTHON"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("snakemake_args", nargs=argparse.REMAINDER,
                   help="options passed to snakemake unchanged (e.g. --cores all "
                        "--configfile config/smoke.yaml)")


def live_snakemake_pids(workdir: Path, proc: Path = Path("/proc")) -> list[int] | None:
    """PIDs of running ``snakemake`` processes whose working directory is ``workdir``
    (this process excluded); None when ``/proc`` cannot tell."""
    if not (proc / "self" / "cwd").exists():
        return None
    target = workdir.resolve()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(entry / "cwd")).resolve()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd == target and any(Path(a.decode(errors="replace")).name == "snakemake"
                                 for a in argv[:3]):
            found.append(int(entry.name))
    return found


def clear_stale_lock(workdir: Path, proc: Path = Path("/proc")) -> list[Path]:
    """Remove ``workdir/.snakemake/locks/*`` when no live snakemake runs there; returns
    the files removed (none when there is no lock, a live run, or no ``/proc``)."""
    locks = sorted((workdir / LOCK_DIR).glob("*.lock"))
    if not locks:
        return []
    live = live_snakemake_pids(workdir, proc)
    if live is None:
        log.warning("cannot tell whether %s is locked by a live run (no /proc); leaving it",
                    workdir / LOCK_DIR)
        return []
    if live:
        log.info("snakemake is running in %s (pid %s); its lock is kept", workdir, live)
        return []
    for lock in locks:
        lock.unlink(missing_ok=True)
    log.info("removed a stale Snakemake lock (no snakemake process runs in %s): %s",
             workdir, ", ".join(p.name for p in locks))
    return locks


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


def run(args: argparse.Namespace) -> int:
    passed = [a for a in args.snakemake_args if a != "--"]
    # an empty or non-mapping --configfile is refused here, naming the file, before
    # Snakemake parses it (its own message for a YAML list does not name the file)
    try:
        check_config_files(configfiles(passed))
    except ConfigError as err:
        log.error("%s", err)
        return 1
    workdir = Path.cwd()
    for flag in ("--directory", "-d"):
        if flag in passed and passed.index(flag) + 1 < len(passed):
            workdir = Path(passed[passed.index(flag) + 1])
    clear_stale_lock(workdir)
    return subprocess.run(snakemake_command(passed)).returncode
