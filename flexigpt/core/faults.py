"""Deterministic fault injection: named points where the kill -9 tests stop a process.

``FLEXIGPT_KILL_AT=<point>[:<n>]`` makes the n-th (default: first) arrival of a process at
:func:`point` ``<point>`` SIGKILL it, or its whole process group when
``FLEXIGPT_KILL_GROUP=1`` (a DAG run with all its jobs, as ``kill -9`` of the run's group
would); ``FLEXIGPT_KILL_MARK=<file>`` is written first, so a test knows the kill happened.
``FLEXIGPT_KILL_SIGNAL=INT`` sends SIGINT (what Ctrl-C sends) to this process instead; the
mark then also records how far stderr was written (``stderr <offset>``, when stderr is a
file), so a test can read what the command printed once interrupted. Unset (always,
outside tests), a point costs one environment lookup.

Points (``tests/test_fault_injection.py`` kills at each): ``save:staged`` / ``save:swap``
(:func:`flexigpt.core.fileio.atomic_directory` before its swap / right after the exchange,
or between its two renames where there is none),
``write:staged`` (:func:`~flexigpt.core.fileio.atomic_write_text`), ``ckpt:staged`` /
``ckpt:swap`` (training checkpoints), ``train:step`` (after each optimizer step),
``sweep:rung`` / ``sweep:publish`` (:func:`flexigpt.runtime.training.tuning.run_sweep`),
``compress:done`` (model compressed, not saved), ``eval:ppl`` / ``eval:task``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

ENV = "FLEXIGPT_KILL_AT"
SIGNAL_ENV = "FLEXIGPT_KILL_SIGNAL"
_arrivals: dict[str, int] = {}


def point(name: str) -> None:
    """SIGKILL this process (or its group) here if ``FLEXIGPT_KILL_AT`` names this arrival
    (SIGINT to this process with ``FLEXIGPT_KILL_SIGNAL=INT``: a ``KeyboardInterrupt`` is
    raised here, as after Ctrl-C)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, nth = spec.rpartition(":")
    if not nth.isdigit():  # no arrival count: the whole spec is the point's name
        target, nth = spec, "1"
    if target != name:
        return
    _arrivals[name] = _arrivals.get(name, 0) + 1
    if _arrivals[name] != int(nth):
        return
    interrupt = os.environ.get(SIGNAL_ENV) == "INT"
    mark = os.environ.get("FLEXIGPT_KILL_MARK")
    if mark:
        Path(mark).write_text(f"{name}:{_arrivals[name]} pid {os.getpid()}"
                              f"{_stderr_offset() if interrupt else ''}\n")
    if interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        return
    if os.environ.get("FLEXIGPT_KILL_GROUP") == "1":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _stderr_offset() -> str:
    """`` stderr <bytes written so far>`` when stderr is a file, else ``''``."""
    sys.stderr.flush()
    try:
        return f" stderr {os.lseek(sys.stderr.fileno(), 0, os.SEEK_CUR)}"
    except (OSError, ValueError):
        return ""
