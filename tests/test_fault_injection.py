"""kill -9 at named points of compress, train, evaluate and a small DAG, then rerun: the final
outputs are byte-identical to an uninterrupted run and nothing is left beside them.

Kills are deterministic (:mod:`flexigpt.core.faults`: ``FLEXIGPT_KILL_AT=<point>[:<n>]`` makes
the n-th arrival at a point SIGKILL the process, or the DAG's whole process group). Each
case runs the real CLI (or ``flexigpt run``) in a subprocess, checks it died by SIGKILL at
that point, reruns the same command without the fault and compares every file under the
work directory with the uninterrupted run's. JSON files are compared without the keys that
differ between any two identical runs (:data:`flexigpt.storage.manifest.VOLATILE_KEYS`: timestamps
and timings), a task's or perplexity's ``seconds`` and ``resumed_from_step`` (which says
that the run was resumed) and the checkout's ``git_commit``; model cards without their
``- created`` line and git commit. Everything else — weights, tokenizer, logs, curves,
per-document records — must be equal byte for byte.

Ctrl-C at the same points (``FLEXIGPT_KILL_SIGNAL=INT``: SIGINT instead of SIGKILL) ends
``compress``, ``train`` and ``evaluate`` in at most two lines, nothing half-written.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import link_resources, without_keys, write_fake_tasks

from flexigpt.core.fileio import MARKER
from flexigpt.storage.manifest import VOLATILE_KEYS
from flexigpt.workflow.run_record import RECORD_DIR

ROOT = Path(__file__).resolve().parent.parent
#: keys a resumed run may legitimately record differently from an uninterrupted one (the
#: checkout's commit moves when a commit lands while the suite runs; the code may not)
RUN_KEYS = VOLATILE_KEYS | {"resumed_from_step", "seconds", "git_commit"}


# ---- comparison --------------------------------------------------------------------------
def _normalised(value):
    return without_keys(value, RUN_KEYS)


def _content(path: Path):
    """What must be equal between an interrupted+resumed and an uninterrupted run."""
    if path.name == MARKER:  # per-file sha256s: those of the files with a timestamp differ
        marker = json.loads(path.read_text())
        files = {k: v for k, v in marker.get("files", {}).items()
                 if k not in ("manifest.json", "README.md")}
        return _normalised({**marker, "files": files})
    if path.suffix == ".json":
        return _normalised(json.loads(path.read_text()))
    if path.name == "README.md":
        return [re.sub(r", git commit \S+$", "", ln) for ln in path.read_text().splitlines()
                if not ln.startswith("- created ")]
    if path.name.endswith(".jsonl.gz"):
        assert gzip.decompress(path.read_bytes())  # readable; bytes compared below
    return path.read_bytes()


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, object]:
    """Every file under ``root`` (hidden ones included) → its comparable content; the
    run-time records ``flexigpt run`` writes (``run_records/``: wall times, by design
    different for every run) left out."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if RECORD_DIR in Path(rel).parts:
            continue
        if path.is_file() and not any(rel.startswith(s) for s in skip):
            out[rel] = _content(path)
    return out


def assert_same(resumed: dict, reference: dict) -> None:
    assert sorted(resumed) == sorted(reference), (
        f"extra: {sorted(set(resumed) - set(reference))}, "
        f"missing: {sorted(set(reference) - set(resumed))}")
    for rel in reference:
        assert resumed[rel] == reference[rel], rel


# ---- running the CLI with a fault ---------------------------------------------------------
def _env(kill: str | None, mark: Path | None, group: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXIGPT_KILL")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if kill:
        env.update(FLEXIGPT_KILL_AT=kill, FLEXIGPT_KILL_MARK=str(mark))
        if group:
            env["FLEXIGPT_KILL_GROUP"] = "1"
    return env


def run_cli(argv: list[str], cwd: Path, kill: str | None = None) -> subprocess.CompletedProcess:
    """``python -m flexigpt.cli *argv`` in ``cwd``; with ``kill``, assert it died there."""
    mark = cwd.parent / f"{cwd.name}.killed"
    mark.unlink(missing_ok=True)
    out = subprocess.run([sys.executable, "-m", "flexigpt.cli", *argv], cwd=cwd,
                         env=_env(kill, mark), capture_output=True, text=True, timeout=600)
    if kill:
        assert out.returncode == -signal.SIGKILL and mark.is_file(), (
            f"not killed at {kill} (rc {out.returncode}): {out.stderr[-2000:]}")
    else:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


# ---- the three CLI stages -----------------------------------------------------------------
def _inputs(base: Path, tiny_checkpoint: Path, text_file: Path) -> dict[str, Path]:
    """Inputs shared by every case, outside the work directories that are compared."""
    bench = base / "tasks"
    if not bench.exists():
        write_fake_tasks(bench, n_docs=5)
    return {"model": tiny_checkpoint, "text": text_file, "bench": bench}


def _compress(method: str):
    return lambda i: ["compress", "--method", method, "--model", str(i["model"]), "--out", "out",
                      "--ratio", "0.5", "--calibration", str(i["text"]), "--n-calibration",
                      "2", "--seq-len", "16"]


STAGES = {
    "compress": _compress("flexigpt"),
    # the replacement baselines save through the same path; their compress points again
    "compress-replaceme": _compress("replaceme"),
    "compress-streamline": _compress("streamline"),
    "train": lambda i: ["train", "--model", str(i["model"]), "--out", "out", "--tokens",
                        str(32 * 4 * 6), "--text", str(i["text"]), "--validation",
                        str(i["text"]), "--seq-len", "32", "--micro-batch", "2",
                        "--global-batch", "4", "--eval-windows", "4", "--checkpoint-every",
                        "2", "--bf16", "off", "--recipe", "lora", "--lora-rank", "4",
                        "--lr", "5e-3", "--warmup", "1"],
    "evaluate": lambda i: ["evaluate", "--model", str(i["model"]), "--out", "out/eval.json",
                           "--tasks", "arc_easy,winogrande,piqa", "--limit", "3",
                           "--tasks-dir", str(i["bench"]), "--ppl-text", str(i["text"]),
                           "--ppl-seq-len", "32", "--ppl-windows", "4", "--batch-size", "4"],
}

#: (stage, kill point, the case starts from a finished previous output of the same command)
CASES = [
    ("compress", "compress:done", False),  # compressed in memory, nothing saved
    ("compress", "compress:done", True),
    ("compress", "save:staged", False),    # every file written to the staging directory
    ("compress", "save:staged", True),
    ("compress", "save:swap", True),       # the previous output moved aside, not yet replaced
    ("compress-replaceme", "save:staged", False),
    ("compress-streamline", "save:swap", True),
    pytest.param("compress-replaceme", "compress:done", True, marks=pytest.mark.slow),
    pytest.param("compress-replaceme", "save:swap", True, marks=pytest.mark.slow),
    pytest.param("compress-streamline", "compress:done", False, marks=pytest.mark.slow),
    pytest.param("compress-streamline", "save:staged", True, marks=pytest.mark.slow),
    ("train", "train:step:1", False),      # before the first checkpoint
    ("train", "train:step:3", False),      # checkpoint of step 2 on disk
    ("train", "ckpt:staged:1", False),     # first checkpoint written, not yet in place
    ("train", "ckpt:staged:2", False),     # step-4 checkpoint staged beside step 2's
    ("train", "ckpt:swap:1", False),       # step-2 checkpoint moved aside, step 4 not in place
    ("train", "train:step:6", False),      # trained, not saved
    ("train", "save:staged", False),
    ("train", "save:swap", True),
    ("evaluate", "eval:ppl", False),
    ("evaluate", "eval:task:1", False),
    ("evaluate", "eval:task:3", False),    # every task scored, nothing written
    ("evaluate", "write:staged:1", False),  # per-document records staged
    ("evaluate", "write:staged:2", False),  # per-window records staged
    ("evaluate", "write:staged:3", False),  # the result JSON itself
]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Uninterrupted run of each stage, computed once: stage → (inputs, snapshot)."""
    return {}


def _reference(references, stage, inputs, base):
    if stage not in references:
        work = base / f"ref-{stage}"
        work.mkdir()
        run_cli(STAGES[stage](inputs), work)
        references[stage] = snapshot(work)
    return references[stage]


def _case_id(case) -> str:
    s, k, p = case.values if hasattr(case, "values") else case
    return f"{s}-{k}{'-over-previous' if p else ''}"


@pytest.mark.parametrize("stage,kill,previous", CASES, ids=[_case_id(c) for c in CASES])
def test_kill_then_rerun_equals_uninterrupted(stage, kill, previous, references,
                                              tiny_checkpoint, text_file, tmp_path_factory):
    base = tmp_path_factory.getbasetemp() / "faults"
    base.mkdir(exist_ok=True)
    shared = base / "model"
    if not shared.exists():  # one tiny checkpoint for every case (the fixture's is per test)
        shutil.copytree(tiny_checkpoint, shared)
    inputs = _inputs(base, shared, text_file)
    reference = _reference(references, stage, inputs, base)
    work = base / f"{stage}-{kill.replace(':', '_')}-{int(previous)}"
    work.mkdir()
    argv = STAGES[stage](inputs)
    if previous:
        run_cli(argv, work)
    run_cli(argv, work, kill=kill)
    run_cli(argv, work)
    assert_same(snapshot(work), reference)


# ---- Ctrl-C while a command works ----------------------------------------------------------
@pytest.mark.parametrize("stage,point", [("compress", "compress:done"),
                                         ("compress", "save:staged"),
                                         ("train", "train:step:3"), ("evaluate", "eval:ppl")])
def test_ctrl_c_while_working_prints_at_most_two_lines(stage, point, tiny_checkpoint, text_file,
                                                       tmp_path):
    """SIGINT, what Ctrl-C sends, while ``compress``, ``train`` or ``evaluate`` works (the
    real signal, at a fault point: ``FLEXIGPT_KILL_SIGNAL=INT``): exit 130 and at most two
    lines after it, one saying what was kept, on a line of its own (an open progress bar
    ends its line first), no traceback; nothing half-written, the training checkpoint kept
    and named."""
    inputs = _inputs(tmp_path, tiny_checkpoint, text_file)
    work, mark, stderr = tmp_path / "work", tmp_path / "mark", tmp_path / "stderr"
    work.mkdir()
    with stderr.open("w") as err:
        done = subprocess.run([sys.executable, "-m", "flexigpt.cli", *STAGES[stage](inputs)],
                              cwd=work, env={**_env(point, mark), "FLEXIGPT_KILL_SIGNAL": "INT"},
                              stdout=subprocess.DEVNULL, stderr=err, timeout=600)
    text = stderr.read_text()
    said = re.search(r" stderr (\d+)$", mark.read_text().strip()) if mark.is_file() else None
    assert said, text[-3000:]
    after = text.encode()[int(said[1]):].decode()
    assert done.returncode == 130 and "Traceback" not in text, text[-3000:]
    # what a terminal shows: a line redrawn after "\r" (a progress bar) is one line
    lines = [seg.rsplit("\r", 1)[-1] for seg in after.split("\n")]
    lines = [ln for ln in lines if ln.strip()]
    assert 1 <= len(lines) <= 2, after
    message = f"flexigpt {stage}: interrupted; "
    assert [ln for ln in lines if ln.startswith(message)] == lines[-1:], after
    assert re.search(rf"(^|\n){re.escape(message)}", text), after  # never glued to a bar
    assert not (work / "out").exists() and not [p for p in work.iterdir() if p.name != "out.ckpt"]
    if stage == "train":
        assert (work / "out.ckpt").is_dir() and "out.ckpt is kept" in lines[-1], lines


# ---- the swap of a save over a previous output ---------------------------------------------
#: a save through the harness's atomic directory (no model: the swap is what is tested)
_SAVE = ("import sys\nfrom pathlib import Path\nfrom flexigpt.core.fileio import "
         "atomic_directory\nwith atomic_directory(sys.argv[1]) as staged:\n"
         "    (Path(staged) / 'weights').write_text(sys.argv[2])\n")


def _save(out: Path, text: str, exchange: bool, kill: str | None = None) -> None:
    mark = out.parent.parent / f"{out.parent.name}.killed"  # outside the folder compared
    mark.unlink(missing_ok=True)
    # FLEXIGPT_NO_EXCHANGE (fileio.NO_EXCHANGE_ENV): two renames, as where there is no exchange
    env = {**_env(kill, mark), **({} if exchange else {"FLEXIGPT_NO_EXCHANGE": "1"})}
    done = subprocess.run([sys.executable, "-c", _SAVE, str(out), text], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == (-signal.SIGKILL if kill else 0), done.stderr[-2000:]
    assert mark.is_file() == bool(kill)


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_kill_at_the_swap_keeps_an_output(exchange, tmp_path, capsys):
    """kill -9 at the swap of a save over a previous output: with the one-step exchange,
    ``--out`` holds the previous or the new output right after the kill; with two renames
    (a file system without the exchange), the next command naming ``--out`` restores the
    previous output first and says so in one line. The next save leaves nothing beside it."""
    from flexigpt.cli import main as cli_main

    out = tmp_path / "out"
    _save(out, "previous", exchange)
    _save(out, "new", exchange, kill="save:swap")
    if exchange:
        assert (out / "weights").read_text() in ("previous", "new")
    else:
        assert not out.exists()  # cut between the two renames
        capsys.readouterr()
        cli_main(["compress", "--method", "dense", "--model", str(tmp_path / "no-model"),
                  "--out", str(out)])
        said = [ln for ln in capsys.readouterr().err.splitlines() if "restored" in ln]
        assert len(said) == 1 and "restored the previous --out" in said[0], said
        assert (out / "weights").read_text() == "previous"
    _save(out, "newer", exchange)
    assert (out / "weights").read_text() == "newer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---- a small DAG, killed as a whole (Snakemake and its jobs) ---------------------------------
MINI = {
    "model": {"key": "tiny-llama", "name": "tiny random Llama", "path":
              "resources/models/tiny-llama", "resource": "tiny-llama", "dtype": "float32"},
    "data": {"train_text": "resources/text/wiki/train.txt",
             "validation_text": "resources/text/wiki/validation.txt",
             "tasks": "resources/tasks", "task_source": "local"},
    "calibration": {"n_windows": 4, "seq_len": 64},
    "seed": 0,
    "jobs": {"threads": 1, "gpu": 0},
    "ratios": [0.3],
    "methods": {"dense": {}, "flexigpt": {"options": {"policy": "matched"}, "recovery": True}},
    "tuning": {"windows": 2, "rung": 0.5,
               "grid": {"flexigpt": {"lr": [4.0e-3], "gamma_lr": [1.0e-2, 5.0e-2]}}},
    "training": {"tokens": 1024, "seq_len": 32, "micro_batch": 4, "global_batch": 4,
                 "eval_windows": 2},
    "evaluation": {"tasks": ["arc_easy", "piqa"], "limit": 2, "ppl_seq_len": 64,
                   "ppl_windows": 2, "backend": "fast", "batch_size": 4},
    "inference": {"batch": 1, "seq_len": 16, "repeats": 1},
}
#: outputs whose content depends on the machine's speed, not on the run
TIMED = ("results/tiny-llama/inference.json", "results/tiny-llama/tables")


def _dag(work: Path, kill: str | None = None) -> subprocess.CompletedProcess:
    """``flexigpt run`` of the mini config in ``work`` (its own session, so a group kill
    takes Snakemake and every running job, like kill -9 of the whole run)."""
    mark = work.parent / f"{work.name}.killed"
    mark.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "flexigpt.cli", "run", "--snakefile",
            str(ROOT / "Snakefile"), "--configfile", "mini.yaml", "--cores", "2"]
    out = subprocess.run(argv, cwd=work, env=_env(kill, mark, group=True), capture_output=True,
                         text=True, timeout=1200, start_new_session=True)
    if kill:
        assert mark.is_file() and out.returncode != 0, out.stdout[-3000:]
    else:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out


def _dag_dir(base: Path, name: str, resources: Path) -> Path:
    """A working directory for the mini DAG: its ``resources`` links to ``resources`` (the
    session's tiny resources, never the checkout's)."""
    work = base / name
    work.mkdir(parents=True)
    link_resources(work, resources)
    (work / "mini.yaml").write_text(yaml.safe_dump(MINI))
    return work


def _dag_outputs(work: Path) -> dict[str, object]:
    return snapshot(work / "results", skip=tuple(p.removeprefix("results/") for p in TIMED))


@pytest.mark.parametrize("kill", ["sweep:rung:1", "sweep:publish", "eval:task:2"])
def test_dag_killed_then_flexigpt_run_equals_uninterrupted(kill, tmp_path_factory,
                                                           tiny_resources):
    """The mini DAG killed as a whole at ``kill`` (``sweep:rung:1``: a trial's first rung
    scored; ``sweep:publish``: every trial scored and stored, the choice not yet published;
    ``eval:task:2``), then ``flexigpt run`` again: the outputs equal an uninterrupted run's."""
    base = tmp_path_factory.getbasetemp() / "dag-faults"
    reference = base / "reference"
    if not reference.exists():
        _dag(_dag_dir(base, "reference", tiny_resources))
    work = _dag_dir(base, kill.replace(":", "_"), tiny_resources)
    _dag(work, kill=kill)
    assert list((work / ".snakemake" / "locks").glob("*.lock")), "expected a stale lock"
    out = _dag(work)  # flexigpt run clears the stale lock and reruns what was cut
    assert "stale Snakemake lock" in out.stderr
    assert_same(_dag_outputs(work), _dag_outputs(reference))
    assert all((work / p).exists() for p in TIMED)
