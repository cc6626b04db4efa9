"""The bracketing learning-rate search: it walks a log lattice to a point with a worse (or
diverged) neighbour on each side of every axis, stops at the hard range and the trial cap,
and says why a choice is not bracketed; the DAG gives the same rule to every sweeping run
and refuses a reused learning rate without a stated reason."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from flexigpt.core.lr_search import (
    BRACKETED,
    Bracketing,
    bracket_status,
    lattice_value,
    propose,
)
from flexigpt.workflow.dag.grid import RunGrid

ROOT = Path(__file__).resolve().parents[1]
RULE = Bracketing(2.0, {"lr": (1e-5, 1e-1), "gamma_lr": (1e-3, 1.0)}, 12)


def _walk(start: dict[str, float], score, rule: Bracketing = RULE):
    """Run the search on a score function: every point and score, in order."""
    points, scores = [start], [score(start)]
    while (point := propose(points, scores, rule)) is not None:
        assert point not in points, "a point is never scored twice"
        points.append(point)
        scores.append(score(point))
    return points, scores


def _bowl(**centre: float):
    """Squared log2-distance from ``centre`` (minimum 0 there)."""
    return lambda p: sum(math.log2(p[a] / c) ** 2 for a, c in centre.items())


def test_one_axis_walks_down_to_the_minimum_and_brackets_it():
    points, scores = _walk({"lr": 4e-3}, _bowl(lr=5e-4))
    assert [p["lr"] for p in points] == [4e-3, 2e-3, 1e-3, 5e-4, 2.5e-4]  # greedy: no 8e-3
    best = min(range(len(scores)), key=scores.__getitem__)
    assert points[best] == {"lr": 5e-4}
    status = bracket_status(points, scores, best, ["lr"], rule=RULE)
    assert status["status"] == BRACKETED
    assert status["neighbours"]["lr"]["below"][0] == 2.5e-4
    assert status["neighbours"]["lr"]["above"][0] == 1e-3


def test_a_diverged_neighbour_counts_as_worse():
    def score(p):
        return None if p["lr"] > 5e-3 else -p["lr"]  # better with size, diverges above 5e-3

    points, scores = _walk({"lr": 4e-3}, score)
    assert points == [{"lr": 4e-3}, {"lr": 2e-3}, {"lr": 8e-3}]
    assert bracket_status(points, scores, 0, ["lr"], rule=RULE)["status"] == BRACKETED


def test_every_trial_diverged_steps_down_until_the_range_ends():
    rule = Bracketing(2.0, {"lr": (1e-3, 1e-1)}, 12)
    points, scores = _walk({"lr": 8e-3}, lambda p: None, rule)
    assert [p["lr"] for p in points] == [8e-3, 4e-3, 2e-3, 1e-3]


def test_the_hard_range_and_the_cap_are_named_as_the_edge():
    rule = Bracketing(2.0, {"lr": (1e-3, 1e-1)}, 12)
    points, scores = _walk({"lr": 4e-3}, _bowl(lr=1e-4), rule)
    best = min(range(len(scores)), key=scores.__getitem__)
    assert points[best] == {"lr": 1e-3}
    assert bracket_status(points, scores, best, ["lr"], rule=rule)["status"] == \
        "edge: lr below hard range [0.001, 0.1]"
    capped = Bracketing(2.0, {"lr": (1e-5, 1e-1)}, 3)
    points, scores = _walk({"lr": 4e-3}, _bowl(lr=1e-4), capped)
    assert len(points) == 3
    assert bracket_status(points, scores, 2, ["lr"], rule=capped)["status"] == \
        "edge: lr below untried: trial cap 3"


def test_two_axes_end_at_a_point_no_axis_neighbour_beats():
    score = _bowl(lr=1e-3, gamma_lr=0.2)
    points, scores = _walk({"lr": 4e-3, "gamma_lr": 5e-2}, score)
    best = min(range(len(scores)), key=scores.__getitem__)
    assert points[best] == {"lr": 1e-3, "gamma_lr": 0.2}
    assert bracket_status(points, scores, best, ["lr", "gamma_lr"], rule=RULE)["status"] == \
        BRACKETED
    assert len(points) <= RULE.max_trials


def test_start_points_must_lie_on_the_lattice():
    with pytest.raises(ValueError, match="lattice"):
        propose([{"lr": 4e-3}, {"lr": 1e-2}], [1.0, 2.0], RULE)
    assert propose([{"lr": 4e-3}, {"lr": 1.6e-2}], [1.0, 2.0], RULE) == {"lr": 2e-3}
    assert lattice_value(4e-3, 2.0, -1) == 2e-3 and lattice_value(5e-2, 2.0, 2) == 0.2


def test_a_fixed_grid_choice_at_its_end_is_an_edge():
    """The sweeps of the earlier reference runs: {4e-3, 1.6e-2}, 4e-3 chosen."""
    points, scores = [{"lr": 4e-3}, {"lr": 1.6e-2}], [316.0, 4.95e7]
    status = bracket_status(points, scores, 0, ["lr"])
    assert status["status"] == "edge: lr below: grid edge; lr above: nearest trial ×4 away"
    three = [{"lr": 4e-4}, {"lr": 1.6e-3}, {"lr": 6.4e-3}]
    assert bracket_status(three, [1213.0, 1048.0, 7790.0], 1, ["lr"], max_spacing=4.0)[
        "status"] == BRACKETED


@pytest.mark.parametrize("spec, match", [
    ({"factor": 3.0, "max_trials": 12, "range": {"lr": [1e-5, 1e-1]}}, "factor"),
    ({"factor": 2.0, "max_trials": 2, "range": {"lr": [1e-5, 1e-1]}}, "max_trials"),
    ({"factor": 2.0, "max_trials": 5, "range": {"lr": [1e-1, 1e-5]}}, "low < high"),
    ({"factor": 2.0, "max_trials": 5, "range": {"beta": [1e-5, 1e-1]}}, "unknown axis"),
])
def test_a_bad_rule_is_refused_by_name(spec, match):
    with pytest.raises(ValueError, match=match):
        Bracketing.from_dict(spec)


def _config(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


def test_every_sweeping_run_gets_the_same_rule_and_reusers_say_why():
    grid = RunGrid.from_config(_config("config.yaml"))
    recovered = [run for run in grid.runs.values() if run.recovery]
    searched = [run for run in recovered if grid.search(run)]
    rules = {repr(grid.search(run)) for run in searched}
    assert len(rules) == 1 and len(searched) >= 20
    for run in recovered:  # each recovered row searches, or reuses for a stated reason
        assert (grid.search(run) is None) == (run.lr_from is not None), run.name
        if run.lr_from is not None:
            assert grid.reuse_reason(run), run.name
    linearpatch = [r for r in searched if r.method == "linearpatch"]
    assert linearpatch, "LinearPatch + LoRA searches its LoRA learning rate"
    flexigpt = next(r for r in searched if r.method == "flexigpt")
    assert set(grid.trials(flexigpt)[0]) == {"lr", "gamma_lr"}  # both searched


def test_a_reused_learning_rate_without_a_reason_is_refused():
    config = copy.deepcopy(_config("config.yaml"))
    del config["tuning"]["reuse"]["kd"]
    with pytest.raises(ValueError, match=r"without a stated reason: set tuning.reuse.kd"):
        RunGrid.from_config(config)
    del config["tuning"]["bracket"]  # the fixed grid of the earlier reference runs
    RunGrid.from_config(config)


def test_the_rung_check_needs_a_rung_and_a_sweep():
    config = copy.deepcopy(_config("config.yaml"))
    config["tuning"]["rung_check"] = ["flexigpt", "shortgpt_lora"]
    with pytest.raises(ValueError, match="rung_check needs a rung"):
        RunGrid.from_config(config)  # rung 1: every trial already trains to the end
    config["tuning"]["rung"] = 0.375
    grid = RunGrid.from_config(config)
    assert sorted(r.name for r in grid.runs.values() if grid.rung_check(r)) == [
        f"smollm2-135m/{m}/default/{s}" for m in ("flexigpt", "shortgpt_lora")
        for s in ("r0.3", "r0.4")]
    del config["tuning"]["bracket"]  # one grid point and no search: nothing to check
    with pytest.raises(ValueError, match="rung_check names 'flexigpt', which is no swept"):
        RunGrid.from_config(config)


def _selection(tmp_path, trials, chosen):
    import json

    out = tmp_path / "trained"
    out.mkdir()
    (out / "selection.json").write_text(json.dumps({
        "chosen_trial": chosen, "chosen": {k: trials[chosen][k] for k in ("lr", "gamma_lr")},
        "trials": trials}))
    return out


def _trial(lr, score, gamma=None, diverged=False):
    return {"lr": lr, "gamma_lr": gamma, "tune_ppl": score, "diverged": diverged}


def test_the_next_best_rates_are_the_best_neighbour_of_the_choice(tmp_path):
    from flexigpt.runtime.training.choices import chosen_rates

    trials = [_trial(4e-3, 100.0, 5e-2), _trial(2e-3, 130.0, 5e-2),
              _trial(8e-3, None, 5e-2, diverged=True), _trial(4e-3, 120.0, 2.5e-2),
              _trial(4e-3, 150.0, 1e-1), _trial(1e-3, 110.0, 5e-2)]  # 1e-3: no neighbour
    out = _selection(tmp_path, trials, 0)
    assert chosen_rates(out) == {"lr": 4e-3, "gamma_lr": 5e-2}
    assert chosen_rates(out, next_best=True) == {"lr": 4e-3, "gamma_lr": 2.5e-2}


def test_no_next_best_rate_when_every_other_trial_diverged(tmp_path):
    from flexigpt.runtime.training.choices import chosen_rates

    out = _selection(tmp_path, [_trial(4e-3, 100.0), _trial(8e-3, None, diverged=True)], 0)
    with pytest.raises(ValueError, match="no next-best learning rate"):
        chosen_rates(out, next_best=True)


def test_the_sensitivity_rows_train_the_twins_model_at_its_next_best_rates():
    grid = RunGrid.from_config(_config("config.yaml"))
    rows = [run for run in grid.runs.values() if run.table == "sensitivity"]
    assert {(r.method, r.variant, r.setting) for r in rows} == {
        (m, "default_next", s) for m in ("flexigpt", "shortgpt_lora") for s in ("r0.3", "r0.4")}
    for run in rows:
        twin = grid.runs[(run.model, run.method, "default", run.setting)]
        assert run.lr_from == twin.key and run.lr_next and run.compressed_dir == twin.compressed_dir
        assert run.budget == twin.budget and grid.search(run) is None
        assert grid.trials(run) == [{"lr_from": twin.prefix, "lr_rank": "next"}]
        assert grid.reuse_reason(run) and not grid.rung_check(run)
    config = copy.deepcopy(_config("config.yaml"))
    config["tuning"]["sensitivity"] = ["dense"]
    with pytest.raises(ValueError, match="tuning.sensitivity names 'dense'"):
        RunGrid.from_config(config)


def test_the_verdict_sensitivity_names_what_flips():
    from flexigpt.core.stats.intervals import Interval
    from flexigpt.tables.claim_rows import decidable_from
    from flexigpt.tables.comparisons import Diff
    from flexigpt.tables.verdicts import next_key, sensitivity

    def diff(low, high):
        return Diff("ok", Interval((low + high) / 2, low, high, 0.1, 0.95, 100, 2000))

    a, b = ("m", "flexigpt", "default", 0.3, "final"), ("m", "shortgpt_lora", "default", 0.3,
                                                       "final")
    table = {(next_key(a), b): diff(0.1, 0.2), (a, next_key(b)): diff(0.15, 0.3)}

    class Comp:
        def has(self, key):
            return key in (a, b, next_key(a), next_key(b))

        def diff(self, x, y, metric):
            return table[(x, y)]

    assert sensitivity(Comp(), a, b, "log_ppl", "less", 0.02, "contradicted") == "holds"
    table[(a, next_key(b))] = diff(-0.05, 0.01)
    assert sensitivity(Comp(), a, b, "log_ppl", "less", 0.02, "contradicted") == (
        "A at next LR: contradicted +0.150 [+0.100, +0.200]; B at next LR: undecided at this "
        "budget -0.020 [-0.050, +0.010]")
    assert sensitivity(Comp(), a, ("m", "x", "default", 0.3, "final"), "avg", "greater", 1.0,
                       "supported") == "–"
    assert decidable_from(diff(-2.0, 4.0).interval, 1.0) == 4.0
