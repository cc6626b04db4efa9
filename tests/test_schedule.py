"""Critical-path job priorities (flexigpt.core.schedule) on a toy DAG of the rules' shape."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from flexigpt.core.schedule import Priorities


def _toy(scale=None) -> Priorities:
    """compress a → train a → train kd (reuses a's LRs) → evaluate; compress b → evaluate;
    both evaluations → tables. Costs: compress 1, train 10, evaluate 2, tables 1."""
    def train_inputs(wc):
        out = {"model": f"r/{wc.run}/compressed", "text": "resources/train.txt"}
        if wc.run == "kd":
            out = {"model": "r/a/compressed", "lr_from": "r/a/trained"}
        return out

    rules = {
        "compress": ("r/{run}/compressed", lambda wc: ["resources/model"]),
        "train": ("r/{run}/trained", train_inputs),
        "evaluate": ("r/{run}/eval_{stage}.json",
                     lambda wc: {"model": f"r/{wc.run}/trained" if wc.run != "b"
                                 else "r/b/compressed"}),
        "tables": ("r/tables", lambda wc: [["r/kd/eval_final.json", "r/b/eval_final.json"]]),
    }
    cost = {"compress": 1, "train": 10, "evaluate_final": 2, "tables": 1}
    return Priorities(rules, ["r/tables"], cost, scale)


def test_priority_is_the_longest_remaining_chain():
    p = _toy()
    assert p.graph["r/tables"] == ["r/kd/eval_final.json", "r/b/eval_final.json"]
    assert p.producer("resources/model") is None  # a source: costs nothing, no job
    remaining = p.remaining
    assert remaining["r/kd/eval_final.json"] == 3 and remaining["r/kd/trained"] == 13
    assert remaining["r/a/trained"] == 23  # its KD successor still has to run
    assert remaining["r/a/compressed"] == 24 and remaining["r/b/compressed"] == 4
    assert "r/a/eval_final.json" not in remaining  # not needed by the targets
    of_train = p.of("train")
    assert of_train(SimpleNamespace(items=lambda: {"run": "a"}.items())) == 23
    assert of_train({"run": "b"}) == 0  # a job outside the graph: lowest priority


def test_compress_of_the_long_chain_outranks_the_short_one():
    p = _toy()
    compress = p.of("compress")
    assert compress({"run": "a"}) > compress({"run": "b"})


@pytest.mark.parametrize("value,expected", [("x", ["x"]), (["x", ["y"]], ["x", "y"]),
                                            ({"a": "x", "b": ["y"]}, ["x", "y"]), (None, [])])
def test_input_values_of_every_shape(value, expected):
    from flexigpt.core.schedule import _paths

    assert _paths(value) == expected


def test_a_longer_training_outranks_a_default_one():
    """A train job's cost scales with its tokens (a budget ladder's 1M-token run first)."""
    p = _toy(scale=lambda rule, wc: 5.0 if (rule, wc.get("run")) == ("train", "a") else 1.0)
    remaining = p.remaining
    assert remaining["r/a/trained"] == 50 + 13 and remaining["r/kd/trained"] == 13
    assert remaining["r/a/compressed"] == 64
