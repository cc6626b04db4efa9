"""A sweep on several processes: what a ``train`` job holding N > 1 GPUs runs.

The DAG's ``train`` script (``workflow/scripts/train.py``) with ``jobs.train_processes: N``
writes the sweep's arguments to a JSON spec and runs ``accelerate launch --multi_gpu
--num_processes N -m flexigpt.runtime.training.launch SPEC``: every process runs
:func:`flexigpt.runtime.training.tuning.run_sweep` on the same spec (data-parallel DDP, one GPU per
process; gloo on CPU-only machines), the main process scores and writes, the others take
its records (:func:`flexigpt.runtime.training.processes.broadcast_from_main`). The global batch is
the config's, so N processes train the same trajectory as one (each takes
``global_batch / N`` windows per step; ``tests/test_multiprocess_train.py``).

Layering of the package (each module imports only those below it): ``launch`` (this entry
point: a sweep spec, in this process or launched on N) → ``tuning`` (the sweep: trials,
rung, selection; ``choices`` reads a finished sweep for another run) → ``trials`` (the
record formats) and ``runner`` (one training run: load, train, save) → ``loop`` /
``recipes`` / ``checkpoint`` / ``memo`` / ``losses`` / ``data`` / ``outputs`` / ``lora`` →
``config`` and ``processes`` (the process group).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from flexigpt.runtime.training.config import TrainConfig
from flexigpt.runtime.training.tuning import run_sweep

#: the keys a spec must have (``search``, the bracketing rule, and ``finish_all``, the rung
#: check, are optional)
SPEC_KEYS = ("model", "out", "configs", "points", "text", "tune", "meta", "rung", "teacher")


def processes_for(explicit: int | None, gpus: int) -> int:
    """How many processes a ``train`` job runs: ``explicit`` (config ``jobs.train_processes``)
    when set, else one per GPU the job holds when it holds several and they are visible."""
    if explicit:
        return int(explicit)
    if gpus and gpus > 1:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() >= gpus:
            return int(gpus)
    return 1


def accelerate_launch(processes: int) -> list[str]:
    """``accelerate launch`` and its flags for ``processes`` processes on this machine (one
    per GPU; gloo on the CPU when no GPU is visible); the program and its arguments follow."""
    if processes < 2:
        raise ValueError(f"a launched sweep needs at least 2 processes, got {processes}")
    launcher = Path(sys.executable).with_name("accelerate")
    head = ([str(launcher), "launch"] if launcher.exists()
            else [sys.executable, "-m", "accelerate.commands.launch"])
    return [*head, "--num_processes", str(processes), "--num_machines", "1", "--multi_gpu",
            "--mixed_precision", "no", "--dynamo_backend", "no"]


def launch_command(spec: str | os.PathLike, processes: int) -> list[str]:
    """The command line that runs the sweep ``spec`` (a JSON file) on ``processes``
    processes: :func:`accelerate_launch` of this module's :func:`main`."""
    return [*accelerate_launch(processes), "-m", "flexigpt.runtime.training.launch", str(spec)]


def run_launched(spec: dict[str, Any], processes: int, threads: int | None = None) -> None:
    """Write ``spec`` (the :func:`run_sweep` arguments, configs as dicts) and run it on
    ``processes`` processes; ``CalledProcessError`` if any process fails."""
    missing = [k for k in SPEC_KEYS if k not in spec]
    if missing:
        raise ValueError(f"sweep spec lacks {missing}")
    with tempfile.TemporaryDirectory(prefix="flexigpt-sweep-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec, default=str))
        env = dict(os.environ)
        if threads:
            env["OMP_NUM_THREADS"] = str(max(1, threads // processes))
        subprocess.run(launch_command(path, processes), check=True, env=env)


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the sweep ``spec`` describes (:data:`SPEC_KEYS`: the :func:`run_sweep` arguments,
    configs as dicts) in this process: the one-process job, or one of the launched ones."""
    configs = [TrainConfig(**c) for c in spec["configs"]]
    return run_sweep(spec["model"], spec["out"], configs, spec["points"], text=spec["text"],
                     tune=spec["tune"], meta=spec["meta"], rung=spec["rung"],
                     teacher=spec["teacher"], search=spec.get("search"),
                     finish_all=bool(spec.get("finish_all")))


def main(argv: list[str] | None = None) -> int:
    """``python -m flexigpt.runtime.training.launch SPEC.json``: run the sweep ``SPEC.json``
    describes in this process (:func:`run_spec`); 2 on a wrong command line, else 0."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m flexigpt.runtime.training.launch SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    run_spec(json.loads(Path(args[0]).read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
