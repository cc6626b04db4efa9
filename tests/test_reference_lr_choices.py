"""Every committed reference run's learning rates: each recovered row's choice is bracketed
by its search, or its table states why not (the search rule's hard range or trial cap, or
the config's reason for reusing another run's choice). Reference runs made with the fixed
grids before the bracketing search are listed here by name, and the test holds the list
honest: such a run's table must show its edges, and a rerun with the search leaves the list.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from flexigpt.tables.selections import read_selection

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
#: every committed run's sweep table, its sittings (``<run>/bracketed_<commit>/``) included
SWEEPS = sorted([*REFERENCE.glob("*/lr_sweep_*.csv"),
                 *REFERENCE.glob("*/bracketed_*/lr_sweep_*.csv")])

#: reference runs made with a fixed two- or three-point grid, before the bracketing search
#: (their choices sit at grid edges; each reruns with the search in a later sitting)
FIXED_GRID_RUNS = {"gemma3-270m", "smollm2-135m", "smollm2-135m-thorough", "smollm2-135m-budget"}
#: the edges the search rule itself gives a reason for
RULE_REASONS = ("hard range", "trial cap")


def _chosen(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    return table[table["chosen"].astype(bool)]


def test_the_reference_runs_have_sweep_tables():
    assert SWEEPS, "no committed lr_sweep table"
    assert any(p.parent.name.startswith("bracketed_") for p in SWEEPS), "no searched run"
    assert {p.parent.name for p in SWEEPS} >= FIXED_GRID_RUNS


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: str(p.parent.relative_to(REFERENCE)))
def test_a_chosen_learning_rate_is_bracketed_or_says_why(path: Path):
    for _, row in _chosen(path).iterrows():
        status = str(row["search_status"])
        if path.parent.name in FIXED_GRID_RUNS:  # made before the search and the reasons
            assert not row["searched"], (
                f"{row['run']} was searched: take {path.parent.name} out of FIXED_GRID_RUNS")
            assert status == "bracketed" or status.startswith(("edge: ", "reuses ")), status
            continue
        if status.startswith("reuses "):
            assert ": " in status, f"{row['run']} reuses a learning rate without a reason"
            continue
        assert row["searched"], f"{row['run']}: not searched by the bracketing rule"
        assert status == "bracketed" or any(r in status for r in RULE_REASONS), (
            f"{row['run']}: chosen learning rate at an edge without a stated reason: {status}")


def test_a_fixed_grid_edge_is_shown_as_an_edge(tmp_path):
    """The status is read from the trials: a choice at the end of {4e-3, 1.6e-2} is an edge,
    named by side, so a reader of an older table sees it."""
    record = {"schema": 1, "run": "m/shortgpt_lora/default/r0.3", "metric": "tune_ppl",
              "tune_text": "t", "tune_windows": 4, "chosen": {"lr": 4e-3, "gamma_lr": None},
              "chosen_trial": 0,
              "trials": [{"lr": 4e-3, "gamma_lr": None, "tune_ppl": 316.0,
                          "tune_ppl_before": 8000.0, "trainable_params": 10, "tokens": 5},
                         {"lr": 1.6e-2, "gamma_lr": None, "tune_ppl": math.inf,
                          "tune_ppl_before": 8000.0, "trainable_params": 10, "tokens": 5,
                          "diverged": True}]}
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(record))
    row = read_selection(path).iloc[0]
    assert row["search_status"] == "edge: lr below: grid edge; lr above: nearest trial ×4 away"
    assert not row["searched"]


def _checked(tmp_path, finals, rung=6):
    """A searched selection record whose bracketing trials reached the end (``finals``),
    ranked at step ``rung`` of 16."""
    trials = [{"lr": lr, "gamma_lr": None, "tune_ppl": rung, "tune_ppl_before": 900.0,
               "trainable_params": 10, "tokens": 5, "tune_ppl_final": final}
              for lr, rung, final in zip((4e-3, 2e-3, 8e-3), (100.0, 120.0, 140.0), finals)]
    record = {"schema": 1, "run": "m/shortgpt_lora/default/r0.3", "metric": "tune_ppl",
              "tune_text": "t", "tune_windows": 4, "chosen": {"lr": 4e-3, "gamma_lr": None},
              "chosen_trial": 0, "rung": {"step": rung, "steps": 16}, "trials": trials,
              "search": {"rule": {"factor": 2.0, "max_trials": 12, "range": {"lr": [1e-5, 1]}},
                         "status": "bracketed", "axes": ["lr"], "trials": 3}}
    path = tmp_path / "selection.json"
    path.write_text(json.dumps(record))
    return read_selection(path)


def test_the_rung_check_table_compares_the_rung_order_with_the_final_one(tmp_path):
    from flexigpt.tables.rung_check import rung_check_table

    same = rung_check_table(_checked(tmp_path, (60.0, 70.0, 80.0)), "m").csv.iloc[0]
    assert same["same_choice"] and same["same_order"]
    assert same["rung_order"] == "0.004 > 0.002 > 0.008"
    flipped = rung_check_table(_checked(tmp_path, (75.0, 70.0, 80.0)), "m").csv.iloc[0]
    assert not flipped["same_choice"] and flipped["final_order"] == "0.002 > 0.004 > 0.008"
    assert rung_check_table(_checked(tmp_path, (60.0, None, None)), "m") is None
    # no rung (every trial compared at its end): nothing to check, no table
    assert rung_check_table(_checked(tmp_path, (100.0, 120.0, 140.0), rung=16), "m") is None


def test_a_reused_choice_says_where_it_sits_in_the_sweep_and_the_ladder_tables():
    """A run trained at another run's choice (the budget ladder's larger budgets, the seeds)
    is marked bracketed or edge by that choice's own search, in the LR-sweep table's Search
    cell and in the ladder's LR column; the committed ladder shows every unbracketed row."""
    from flexigpt.tables.budget import _lr_text
    from flexigpt.tables.sweep import choice_status, sweep_table

    base = {"model": "m", "method": "shortgpt_lora", "ratio": 0.3, "setting": "r0.3",
            "metric": "tune_ppl", "tune_text": "t", "tune_windows": 4, "gamma_lr": math.nan,
            "trainable_params": 10, "tokens": 5, "tune_ppl_before": 900.0, "rung_step": math.nan,
            "steps": 16, "diverged": False, "chosen": True, "search_neighbours": "",
            "search_trials": 3, "lr_reuse": None, "tune_ppl_final": math.nan, "lr": 4e-3,
            "file": "selection.json", "final_diverged": False, "searched": True,
            "tune_ppl": 100.0}
    rows = [{**base, "run": "m/shortgpt_lora/default/r0.3", "variant": "default",
             "search_status": "edge: lr below: grid edge", "lr_from": None},
            {**base, "run": "m/shortgpt_lora/tok131072/r0.3", "variant": "tok131072",
             "search_status": "reuses results/m/shortgpt_lora/default/r0.3",
             "lr_from": "results/m/shortgpt_lora/default/r0.3"},
            {**base, "run": "m/shortgpt_lora/other/r0.3", "variant": "other",
             "search_status": "bracketed", "lr_from": None}]
    sel = pd.DataFrame(rows)
    status = choice_status(sel)
    assert status == {("m", "shortgpt_lora", "default", 0.3): "edge",
                      ("m", "shortgpt_lora", "tok131072", 0.3): "edge",
                      ("m", "shortgpt_lora", "other", 0.3): "bracketed"}
    table = sweep_table(sel, "m")
    assert table is not None
    search = table.blocks[0].frame["Search"].tolist()
    assert any("(a choice at an edge: unbracketed)" in s for s in search), search
    result = pd.Series({"model": "m", "method": "shortgpt_lora", "variant": "tok131072",
                        "ratio": 0.3, "lr": 4e-3, "gamma_lr": None,
                        "lr_source": "chosen by results/m/shortgpt_lora/default/r0.3"})
    assert _lr_text(result, status) == "4e-3 reused, edge"
    assert _lr_text(result, {}) == "4e-3 reused"
    committed = (REFERENCE / "smollm2-135m-budget" / "budget_smollm2-135m-budget_r0.3.md")
    rows = [line for line in committed.read_text().splitlines()
            if line.startswith("| ") and line.split("|")[1].strip()[-1:] in "KM"]
    assert len(rows) == 3 and all(line.count(", edge |") == 2 for line in rows), rows
