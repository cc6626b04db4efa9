"""Multi-process training (the path a job holding N GPUs takes): ``accelerate launch`` with 2
CPU processes (gloo) gives the loss curve and the saved model of 1 process at the same global
batch, within float tolerance (the all-reduce sums gradients in another order)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import torch

from flexigpt.runtime.training.launch import accelerate_launch
from flexigpt.storage.artifacts import load_compressed


def _train(model, out, text, processes: int) -> list[dict]:
    """``flexigpt train`` on ``processes`` gloo processes (micro-batch 2, global batch 4)."""
    flags = ["-m", "flexigpt.cli", "train", "--model", str(model), "--out", str(out),
             "--tokens", str(32 * 4 * 5), "--text", str(text), "--validation", str(text),
             "--recipe", "lora", "--lora-rank", "4", "--seq-len", "32", "--micro-batch", "2",
             "--global-batch", "4", "--eval-windows", "4", "--bf16", "off", "--warmup", "1",
             "--checkpoint-every", "0", "--lr", "5e-3"]
    cmd = [*accelerate_launch(processes), *flags] if processes > 1 else [sys.executable, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # the gloo path, also on a machine with GPUs
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "train_log.csv") as fh:
        return list(csv.DictReader(fh))


def test_two_gloo_processes_match_one(tiny_checkpoint, text_file, tmp_path):
    one = _train(tiny_checkpoint, tmp_path / "one", text_file, 1)
    two = _train(tiny_checkpoint, tmp_path / "two", text_file, 2)
    assert [r["step"] for r in one] == [r["step"] for r in two] == [str(i) for i in range(6)]
    for a, b in zip(one[1:], two[1:]):
        assert float(a["loss"]) == pytest.approx(float(b["loss"]), rel=1e-4, abs=1e-5)
        assert a["tokens"] == b["tokens"]
    a, b = load_compressed(tmp_path / "one"), load_compressed(tmp_path / "two")
    ha, hb = a.manifest.history[-1], b.manifest.history[-1]
    assert (ha["processes"], ha["accumulation"]) == (1, 2)
    assert (hb["processes"], hb["accumulation"]) == (2, 1)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    worst = max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)
    assert worst < 1e-4, worst
    # the processes trained different micro-batches: the loss changed over the run
    assert float(one[1]["loss"]) != float(one[-1]["loss"])


def test_dag_train_job_on_two_processes_matches_one(tiny_checkpoint, text_file, tmp_path,
                                                    monkeypatch):
    """The DAG's train script with ``jobs.train_processes: 2`` (what a job holding 2 GPUs
    runs): a 2-trial successive-halving sweep under ``accelerate launch`` chooses the trial
    one process chooses, with the same rung scores and, within float tolerance, the same
    model; the main process alone writes (nothing is left beside the output)."""
    import json

    from conftest import run_script

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # gloo, also on a machine with GPUs
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = {"tokens": 4 * 4 * 32, "seq_len": 32, "micro_batch": 2, "global_batch": 4,
              "eval_windows": 4, "checkpoint_every": 0, "warmup_min_steps": 0, "bf16": "off",
              "recipe": "lora", "lora_rank": 4, "device": "cpu"}
    trials = [{"config": {**config, "lr": lr}, "point": {"lr": lr}} for lr in (5e-3, 5e-2)]
    outs = {}
    for processes in (1, 2):
        out = outs[processes] = tmp_path / f"p{processes}" / "trained"
        run_script("train", tmp_path, monkeypatch,
                   params={"trials": trials, "meta": {"run": "test"}, "rung": 0.5,
                           "teacher": None, "processes": processes},
                   inputs={"model": tiny_checkpoint, "text": text_file, "tune": text_file},
                   outputs={"model": out})
        assert sorted(p.name for p in out.parent.iterdir()) == ["trained"], processes
    one, two = (json.loads((outs[p] / "selection.json").read_text()) for p in (1, 2))
    assert one["chosen_trial"] == two["chosen_trial"] and one["rung"] == two["rung"]
    for a, b in zip(one["trials"], two["trials"]):
        assert a["tune_ppl"] == pytest.approx(b["tune_ppl"], rel=1e-4)
    ha = load_compressed(outs[1]).manifest.history[-1]
    hb = load_compressed(outs[2]).manifest.history[-1]
    assert (ha["processes"], hb["processes"]) == (1, 2)
    assert hb["final_ppl"] == pytest.approx(ha["final_ppl"], rel=1e-4)
    sa, sb = load_compressed(outs[1]).model.state_dict(), load_compressed(outs[2]).model.state_dict()
    worst = max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa)
    assert worst < 1e-4, worst


def test_train_processes_follow_the_jobs_gpus():
    from flexigpt.runtime.training.launch import launch_command, processes_for

    assert processes_for(3, 0) == 3  # explicit, any device
    assert processes_for(None, 0) == processes_for(None, 1) == 1
    if not torch.cuda.is_available():
        assert processes_for(None, 4) == 1  # GPUs granted but none visible: one process
    cmd = launch_command("spec.json", 2)
    assert cmd[-3:] == ["-m", "flexigpt.runtime.training.launch", "spec.json"]
    assert cmd[cmd.index("--num_processes") + 1] == "2"
    with pytest.raises(ValueError, match="at least 2"):
        launch_command("spec.json", 1)
