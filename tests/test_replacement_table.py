"""The replacement-strategies table (flexigpt.tables.replacement): which rows it holds, the
parameters each adds back, and which skip row each is paired with."""

from __future__ import annotations

import pandas as pd

from flexigpt.tables.collect import TASKS
from flexigpt.tables.comparisons import Comparator
from flexigpt.tables.replacement import (
    SKIP,
    added_parameters,
    block_size,
    replacement_table,
    skip_partner,
    strategy,
)
from flexigpt.tables.row_intervals import RecordStore

DENSE, BLOCK = 1_000_000, 50_000


def _row(method, variant, trained, blocks, compressed, ratio=0.3, table="main"):
    return {"model": "m", "method": method, "variant": variant, "ratio": ratio,
            "stage": "final", "trained": trained, "table": table,
            "achieved_ratio": 1 - compressed / DENSE, "ppl": 10.0,
            **{t: 50.0 for t in TASKS}, "avg": 50.0, "n_seeds": 1, "ppl_text": "t",
            "ppl_seq_len": 512, "params_dense": DENSE, "params_compressed": compressed,
            "blocks_pruned": blocks, "trainable_params": 1000 if trained else None,
            "tokens": 4096 if trained else None, "loss": "lm"}


def _agg(*extra):
    rows = [_row("dense", "default", False, None, DENSE, ratio=0.0, table="dense"),
            _row("shortgpt", "default", False, 4, DENSE - 4 * BLOCK),
            _row("shortgpt_lora", "default", True, 4, DENSE - 4 * BLOCK),
            _row("replaceme", "default", False, 4, DENSE - 4 * BLOCK),
            _row("replaceme", "lora", True, 4, DENSE - 4 * BLOCK),
            _row("streamline", "default", False, 5, DENSE - 5 * BLOCK + BLOCK),
            _row("flexigpt", "default", True, 4, DENSE - 4 * BLOCK + 1200),
            _row("slicegpt", "default", False, None, DENSE - 200_000), *extra]
    return pd.DataFrame(rows)


def test_strategies_come_from_the_registry():
    assert strategy("shortgpt") == strategy("shortgpt_lora") == SKIP
    assert strategy("slicegpt") is None and strategy("dense") is None
    assert len({strategy(m) for m in ("shortgpt", "replaceme", "streamline", "flexigpt")}) == 4


def test_added_parameters_and_skip_partners():
    agg = _agg()
    assert block_size(agg) == BLOCK
    added = added_parameters(agg, BLOCK)
    by = dict(zip(agg["method"] + "/" + agg["variant"], added))
    assert by["replaceme/default"] == by["shortgpt/default"] == 0  # a folded map adds nothing
    assert by["streamline/default"] == BLOCK  # one block-sized module for a 5-block span
    assert by["flexigpt/default"] == 1200  # the adapters; shared weights add none
    rows = agg.set_index(agg["method"] + "/" + agg["variant"])
    # recovered rows pair with the comparator, one-shot rows with the one-shot skip row
    assert skip_partner(agg, rows.loc["replaceme/lora"])[1:3] == ("shortgpt_lora", "default")
    assert skip_partner(agg, rows.loc["streamline/default"])[1:3] == ("shortgpt", "default")
    assert skip_partner(agg, rows.loc["flexigpt/default"])[1:3] == ("shortgpt_lora", "default")


def test_table_rows_and_missing_partners():
    table = replacement_table(_agg(_row("flexigpt", "default", True, 6,
                                        DENSE - 6 * BLOCK + 1500, ratio=0.4)),
                              Comparator(RecordStore()), "m")
    frame = table.blocks[0].frame
    assert list(frame["Method"]) == ["ShortGPT (one-shot)", "ShortGPT + LoRA*",
                                     "ReplaceMe (one-shot)", "ReplaceMe + LoRA*",
                                     "LLM-Streamline (one-shot)", "FlexiGPT*", "FlexiGPT*"]
    assert "SliceGPT" not in " ".join(frame["Method"])  # a width method has no strategy
    assert list(frame["Added (M)"] * 1e6) == [0, 0, 0, 0, BLOCK, 1200, 1500]
    # skip rows have no difference; a row without a skip row at its ratio says so
    assert list(frame["Δ log-PPL vs skip"])[:2] == ["–", "–"]
    assert frame["Δ log-PPL vs skip"].iloc[-1] == "not run"
    assert set(table.csv["strategy"]) == {SKIP, "linear map (folded)", "one trained module",
                                          "weight-shared block + LoRA"}


def test_one_strategy_gives_no_table():
    agg = _agg()
    only_skip = agg[agg["method"].isin(["dense", "shortgpt", "shortgpt_lora"])]
    assert replacement_table(only_skip, Comparator(RecordStore()), "m") is None


def test_claim_c_compares_against_the_paper_baselines_only():
    """(c) is the paper's claim against its own baselines: ReplaceMe, LLM-Streamline and
    ShortGPT + last-blocks fine-tuning (later baselines) are not in its family."""
    from flexigpt.storage.registry import is_paper_baseline
    from flexigpt.tables.trend import BudgetPair
    from flexigpt.tables.verdicts import _others

    assert is_paper_baseline("slicegpt", "rft") and is_paper_baseline("llm_pruner", "lora")
    assert not is_paper_baseline("replaceme", "lora")
    assert not is_paper_baseline("shortgpt", "last3") and not is_paper_baseline("x", "default")
    agg = _agg(_row("shortgpt", "last3", True, 4, DENSE - 4 * BLOCK),
               _row("slicegpt", "rft", True, None, DENSE - 200_000),
               _row("streamline", "lora", True, 5, DENSE - 4 * BLOCK))
    pair = BudgetPair(0.3, "default", 4096, DENSE, ("m", "flexigpt", "default", "r0.3", "final"),
                      ("m", "shortgpt_lora", "default", "r0.3", "final"))
    keys, names = _others(agg, Comparator(RecordStore()), "m", pair)
    assert names == ["SliceGPT + RFT*"]
    assert [k[1:3] for k in keys] == [("slicegpt", "rft")]
