"""benchmarks/budget_bound.py: tokens from a run's selection records, FLOP per token from a
bench_train JSON, the floor = FLOP ÷ (cores × peak per thread), and the same at the MFU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
BUDGET_RECORDS = (ROOT / "results/reference/smollm2-135m-budget/inputs/results"
                  / "smollm2-135m-budget")


def _load():
    return load_benchmark("budget_bound")


def _selection(root: Path, job: str, tokens: list[int]) -> None:
    path = root / job / "trained" / "selection.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"trials": [{"tokens": t} for t in tokens]}))


def _bench(path: Path, threads: int, peak: dict, rows: list[dict]) -> Path:
    path.write_text(json.dumps({"threads": threads, "peak_flops": peak, "variants": rows}))
    return path


def test_floor_arithmetic(tmp_path):
    bound = _load()
    records = tmp_path / "records"
    _selection(records, "flexigpt/default/r0.3", [1000, 375])  # a sweep: winner + loser
    _selection(records, "flexigpt/tok4000/r0.3", [4000])
    _selection(records, "shortgpt_lora/default/r0.3", [1000, 375])
    flops = _bench(tmp_path / "flops.json", 2, {"fp32": 1.0, "bf16": 1.0}, [
        {"method": "flexigpt", "train_flops_per_token": 600},
        {"method": "shortgpt", "train_flops_per_token": 400}])
    target = _bench(tmp_path / "target.json", 2, {"fp32": 200.0, "bf16": 1.0}, [
        {"bf16": "off", "mfu_vs_fp32_peak": 0.5, "mfu_vs_bf16_peak": 9.0},
        {"bf16": "on", "mfu_vs_fp32_peak": 0.9, "mfu_vs_bf16_peak": 0.9}])
    out = tmp_path / "bound.json"
    assert bound.main(["--records", str(records), "--flops", str(flops), "--target",
                       str(target), "--dtype", "fp32", "--cores", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    total = (1375 + 4000) * 600 + 1375 * 400
    assert result["total_flop"] == total
    assert result["peak_per_thread"] == 100.0  # 200 FLOP/s measured on 2 threads
    assert result["mfu"] == 0.5  # the fp32 row's, not the bf16 row's
    assert result["floor_s_at_peak"] == pytest.approx(total / 200.0)
    assert result["floor_s_at_mfu"] == pytest.approx(total / 100.0)


def test_unmeasured_jobs_are_named_not_counted(tmp_path):
    bound = _load()
    with pytest.raises(FileNotFoundError, match="selection.json"):
        bound.trained_tokens(tmp_path)
    _selection(tmp_path, "slicegpt/default/r0.3", [10])
    with pytest.raises(KeyError, match="slicegpt"):
        bound.floor(bound.trained_tokens(tmp_path), {"flexigpt": 1}, 1.0, 1.0, 2)
    _selection(tmp_path, "flexigpt/default/r0.3", [10])
    result = bound.floor(bound.trained_tokens(tmp_path), {"flexigpt": 3}, 1.0, 1.0, 2)
    assert result["total_flop"] == 30  # the unmeasured job is left out, and named
    assert result["not_counted"] == ["slicegpt/default/r0.3"]


def test_budget_reference_tokens():
    """The committed budget run (sittings 1 and 2) trained, per method of the like-for-like
    pair, 32,768 + 12,288 (the losing trial, stopped at the 0.375 rung) + 2 more seeds of
    32,768 + 3 seeds of 131,072 + 1,048,576 tokens; ReplaceMe + LoRA* and LLM-Streamline +
    LoRA* their 32K sweep, 131,072 and 1,048,576 (sitting 2)."""
    rows = _load().trained_tokens(BUDGET_RECORDS)
    per_method: dict[str, int] = {}
    for row in rows:
        per_method[row["method"]] = per_method.get(row["method"], 0) + row["tokens"]
    pair = 32_768 + 12_288 + 2 * 32_768 + 3 * 131_072 + 1_048_576
    other = 32_768 + 12_288 + 131_072 + 1_048_576
    assert per_method == {"flexigpt": pair, "shortgpt_lora": pair, "replaceme": other,
                          "streamline": other}
