"""Successive halving: a run stopped at the rung continues exactly; the sweep keeps the best
at the rung, trains only it to the end, records every trial and resumes after a kill."""

from __future__ import annotations

import json
import math

import pytest
import torch

import flexigpt.runtime.training.tuning as tuning
from flexigpt.core.fileio import CheckpointError
from flexigpt.runtime.training import TrainConfig, train_model
from flexigpt.runtime.training.checkpoint import checkpoint_dir
from flexigpt.runtime.training.tuning import SELECTION_FILE, run_sweep, rung_step
from flexigpt.storage.artifacts import load_compressed

pytestmark = pytest.mark.usefixtures("single_thread")


def small(**kw) -> TrainConfig:
    """6 steps of 4 windows × 32 tokens (LoRA recipe), no periodic checkpoints."""
    base = dict(tokens=32 * 4 * 6, seq_len=32, micro_batch=2, global_batch=4, eval_windows=4,
                checkpoint_every=0, bf16="off", warmup=1, recipe="lora", lora_rank=4, lr=5e-3)
    base.update(kw)
    return TrainConfig(**base)


def _weights(path):
    return load_compressed(path).model.state_dict()


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rung_step():
    assert rung_step(16, 2, 0.5) == 8 and rung_step(16, 1, 0.5) == 16
    assert rung_step(16, 3, 1.0) == 16 and rung_step(3, 2, 0.01) == 1
    assert rung_step(3, 2, 0.99) == 2
    with pytest.raises(ValueError, match="rung"):
        rung_step(16, 2, 0.0)


def test_stop_at_the_rung_then_continue_equals_one_run(tiny_checkpoint, text_file, tmp_path):
    cfg = small()
    whole = train_model(tiny_checkpoint, tmp_path / "a", cfg, text_file, text_file)
    out = tmp_path / "b"
    rung = train_model(tiny_checkpoint, out, cfg, text_file, text_file, stop_step=3)
    assert rung["stage"] == "rung" and rung["stopped_at_step"] == 3 and rung["steps"] == 6
    assert not out.exists() and checkpoint_dir(out).exists()  # only the checkpoint
    state = json.loads((checkpoint_dir(out) / "state.json").read_text())
    assert state["step"] == 3 and state["log"][-1]["ppl"] == rung["ppl"]
    assert rung["ppl_before"] == whole.history[-1]["ppl_before"]
    with pytest.raises(CheckpointError, match="past the requested stop"):
        train_model(tiny_checkpoint, out, cfg, text_file, text_file, stop_step=2)
    done = train_model(tiny_checkpoint, out, cfg, text_file, text_file)
    assert done.history[-1]["resumed_from_step"] == 3
    assert done.history[-1]["final_ppl"] == whole.history[-1]["final_ppl"]
    assert _same(_weights(tmp_path / "a"), _weights(out))
    assert not checkpoint_dir(out).exists()


def _sweep(tiny_checkpoint, text_file, out, rung=0.5):
    configs = [small(lr=5e-3), small(lr=1e-6)]  # 1e-6 barely moves: the worse tune PPL
    points = [{"lr": 5e-3}, {"lr": 1e-6}]
    return run_sweep(tiny_checkpoint, out, configs, points, text_file, text_file,
                     meta={"run": "m/x/default/r0.3", "tune_text": str(text_file),
                           "tune_windows": 4, "grid": points}, rung=rung)


def test_sweep_continues_only_the_best_at_the_rung(tiny_checkpoint, text_file, tmp_path):
    out = tmp_path / "trained"
    selection = _sweep(tiny_checkpoint, text_file, out)
    assert selection["rung"] == {"step": 3, "steps": 6, "fraction": 0.5}
    assert selection["chosen_trial"] == 0 and selection["chosen"]["lr"] == 5e-3
    won, lost = selection["trials"]
    assert won["tune_ppl"] < lost["tune_ppl"] and won["stopped_at_step"] == 6
    assert lost["stopped_at_step"] == 3 and lost["tune_ppl_final"] is None
    assert won["tune_ppl_final"] < won["tune_ppl"] and lost["tokens"] == 32 * 4 * 3
    assert json.loads((out / SELECTION_FILE).read_text()) == selection
    # the kept model is the winner trained without interruption
    train_model(tiny_checkpoint, tmp_path / "ref", small(lr=5e-3), text_file, text_file)
    assert _same(_weights(tmp_path / "ref"), _weights(out))
    assert not (tmp_path / "trained.sweep").exists()


def test_sweep_scores_the_shared_start_once(tiny_checkpoint, text_file, tmp_path, monkeypatch):
    """Trials of one sweep start from the same state: its step-0 tune PPL is evaluated once
    and is the value an unshared run computes; a different start is scored on its own."""
    import flexigpt.runtime.training.loop as loop

    calls = []
    real = loop.perplexity
    monkeypatch.setattr(loop, "perplexity", lambda *a, **k: calls.append(1) or real(*a, **k))
    selection = _sweep(tiny_checkpoint, text_file, tmp_path / "trained")
    assert len(calls) == 3  # step 0 once, then each trial at the rung (final: the runner)
    before = {t["tune_ppl_before"] for t in selection["trials"]}
    ref = train_model(tiny_checkpoint, tmp_path / "ref", small(), text_file, text_file)
    assert before == {ref.history[-1]["ppl_before"]}
    ranks = [small(lora_rank=4), small(lora_rank=2)]  # other adapters: another start
    calls.clear()
    run_sweep(tiny_checkpoint, tmp_path / "r", ranks, [{"r": 4}, {"r": 2}], text_file,
              text_file, meta={"run": "m/x/default/r0.3"}, rung=0.5)
    assert len(calls) == 4


def test_sweep_with_rung_one_trains_every_trial_fully(tiny_checkpoint, text_file, tmp_path):
    selection = _sweep(tiny_checkpoint, text_file, tmp_path / "trained", rung=1.0)
    assert selection["rung"]["step"] == 6 and selection["chosen_trial"] == 0
    assert [t["stopped_at_step"] for t in selection["trials"]] == [6, 6]
    assert all(t["tune_ppl"] == t["tune_ppl_final"] for t in selection["trials"])


def test_sweep_keeps_one_heap_for_every_trial(tiny_checkpoint, text_file, tmp_path, monkeypatch):
    """Every trial of a sweep trains inside one ``reuse_freed_memory`` block (a later trial
    reuses the pages an earlier one faulted in); glibc's defaults come back after it."""
    from flexigpt.core import memory

    depths = []
    real = tuning.train_model
    monkeypatch.setattr(tuning, "train_model",
                        lambda *a, **k: depths.append(memory._depth) or real(*a, **k))
    _sweep(tiny_checkpoint, text_file, tmp_path / "trained")
    assert len(depths) == 3 and all(d >= 1 for d in depths)  # two rungs and the winner
    assert memory._depth == 0


SEARCH = {"factor": 2.0, "max_trials": 4, "range": {"lr": [1e-4, 1e-1]}}


def _searched(tiny_checkpoint, text_file, out, rung=0.5):
    """A sweep that starts at one point and brackets it (at most 4 trials)."""
    return run_sweep(tiny_checkpoint, out, [small(lr=2e-3)], [{"lr": 2e-3}], text_file,
                     text_file, meta={"run": "m/x/default/r0.3"}, rung=rung, search=SEARCH)


@pytest.mark.parametrize("rung", [0.5, 1.0])
def test_a_search_adds_lattice_neighbours_until_its_choice_is_bracketed(
        tiny_checkpoint, text_file, tmp_path, rung):
    """From one start the sweep adds trials one at a time on the ×2 lattice, compares them
    at the rung (one start is not one trial: the rung still applies), and records the rule,
    the count and the status; the published model is the chosen trial trained alone."""
    out = tmp_path / "trained"
    selection = _searched(tiny_checkpoint, text_file, out, rung)
    trials = selection["trials"]
    lrs = [t["lr"] for t in trials]
    assert lrs[:2] == [2e-3, 1e-3] and 2 <= len(lrs) <= 4 and len(set(lrs)) == len(lrs)
    assert all(math.log2(lr / 2e-3).is_integer() for lr in lrs)
    assert selection["rung"]["step"] == (3 if rung < 1 else 6)
    search = selection["search"]
    assert search["rule"] == SEARCH and search["trials"] == len(trials)
    assert search["grid_points"] == 1 and search["axes"] == ["lr"]
    scores = [t["tune_ppl"] for t in trials]
    chosen = selection["chosen_trial"]
    assert scores[chosen] == min(scores)
    others = sorted(lrs)
    at = others.index(lrs[chosen])
    bracketed = 0 < at < len(others) - 1
    assert (search["status"] == "bracketed") == bracketed, search["status"]
    if not bracketed:
        assert "trial cap 4" in search["status"] or "hard range" in search["status"]
    train_model(tiny_checkpoint, tmp_path / "ref", small(lr=lrs[chosen]), text_file, text_file)
    assert _same(_weights(tmp_path / "ref"), _weights(out))


@pytest.mark.parametrize("sweep", [_sweep, _searched], ids=["grid", "searched"])
def test_sweep_resumes_without_retraining(tiny_checkpoint, text_file, tmp_path, monkeypatch,
                                          sweep):
    """Killed before publishing, a sweep (a grid, or a search, which proposes the same trials
    again from the stored scores) reads every trial back and trains nothing."""
    out = tmp_path / "trained"
    real = tuning._publish

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill before the output appeared")

    monkeypatch.setattr(tuning, "_publish", killed)
    with pytest.raises(KeyboardInterrupt):
        sweep(tiny_checkpoint, text_file, out)
    assert not out.exists() and (tmp_path / "trained.sweep" / "t1" / "rung.json").exists()
    monkeypatch.setattr(tuning, "_publish", real)
    calls = []
    original = tuning.train_model
    monkeypatch.setattr(tuning, "train_model",
                        lambda *a, **k: calls.append(k) or original(*a, **k))
    selection = sweep(tiny_checkpoint, text_file, out)
    assert calls == [] and len(selection["trials"]) >= 2  # every record read back
    train_model(tiny_checkpoint, tmp_path / "ref", small(lr=selection["chosen"]["lr"]),
                text_file, text_file)
    assert _same(_weights(tmp_path / "ref"), _weights(out))


def test_the_rung_check_finishes_every_trial_and_keeps_the_rungs_choice(
        tiny_checkpoint, text_file, tmp_path):
    """``finish_all``: every trial scored at the rung is also trained to the end (its final
    tune PPL recorded) and the published model is still the rung's choice."""
    plain = _sweep(tiny_checkpoint, text_file, tmp_path / "plain")
    configs = [small(lr=5e-3), small(lr=1e-6)]
    points = [{"lr": 5e-3}, {"lr": 1e-6}]
    checked = run_sweep(tiny_checkpoint, tmp_path / "checked", configs, points, text_file,
                        text_file, meta={"run": "m/x/default/r0.3", "tune_text": str(text_file),
                                         "tune_windows": 4, "grid": points},
                        rung=0.5, finish_all=True)
    assert checked["chosen_trial"] == plain["chosen_trial"] == 0
    assert [t["tune_ppl"] for t in checked["trials"]] == [t["tune_ppl"] for t in plain["trials"]]
    assert all(t["stopped_at_step"] == 6 and t["tune_ppl_final"] is not None
               for t in checked["trials"])
    assert plain["trials"][1]["tune_ppl_final"] is None
    assert _same(_weights(tmp_path / "plain"), _weights(tmp_path / "checked"))
