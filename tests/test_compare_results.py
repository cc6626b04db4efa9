"""benchmarks/compare_results.py: the paired A − B intervals of two committed reference results
are those of the reference tables' comparisons.csv (same engine), and unpaired runs are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "results" / "reference" / "smollm2-135m"
RUNS = REF / "inputs" / "results" / "smollm2-135m"


def _load():
    return load_benchmark("compare_results")


def test_equals_the_reference_comparison(tmp_path):
    a = RUNS / "flexigpt" / "default" / "r0.3" / "eval_final.json"
    b = RUNS / "shortgpt_lora" / "default" / "r0.3" / "eval_final.json"
    module = _load()
    assert module.main([str(a), str(b), "--out", str(tmp_path / "d.json")]) == 0
    out = json.loads((tmp_path / "d.json").read_text())
    table = pd.read_csv(REF / "comparisons.csv")
    rows = table[(table.method == "flexigpt") & (table.variant == "default")
                 & (table.ratio == 0.3) & (table.baseline.str.startswith("shortgpt_lora"))]
    assert len(rows) == 7  # log-PPL, five tasks, the average
    for _, row in rows.iterrows():
        iv = (out["diff"]["log_ppl"] if row.metric == "log_ppl" else out["diff"]["average"]
              if row.metric == "avg" else out["diff"]["tasks"][row.metric])
        for key, col in (("estimate", "estimate"), ("low", "ci_low"), ("high", "ci_high")):
            assert iv[key] == pytest.approx(row[col], abs=6e-5), (row.metric, key)
        assert iv["n"] == row.n


def test_unpaired_runs_are_refused_and_missing_records_named():
    """The thorough run scored 1,000 documents per task, the default run 100: no pairing."""
    from flexigpt.core.stats import PairingError

    module = _load()
    a = RUNS / "flexigpt" / "default" / "r0.3" / "eval_final.json"
    thorough = (ROOT / "results" / "reference" / "smollm2-135m-thorough" / "inputs" / "results"
                / "smollm2-135m-thorough" / "flexigpt" / "default" / "r0.3" / "eval_final.json")
    with pytest.raises(PairingError, match="doc ids differ"):
        module.compare(thorough, a)
    start = RUNS / "flexigpt" / "default" / "r0.3" / "eval_start.json"  # PPL windows only
    out = module.compare(a, start)
    assert out["diff"]["average"] is None and out["diff"]["tasks"] == {}
    assert out["diff"]["log_ppl"]["n"] == 16
    with pytest.raises(FileNotFoundError):
        module.compare(a, RUNS / "missing" / "eval_final.json")


@pytest.mark.parametrize("ratio", ["r0.3", "r0.4"])
@pytest.mark.parametrize("stage", ["eval_start", "eval_final"])
def test_committed_solver_comparison_rebuilds(ratio, stage):
    """results/reference/smollm2-135m-svd-randomized: every committed comparison (randomized
    vs exact SVD, FlexiGPT on SmolLM2) is what the committed records give."""
    folder = ROOT / "results" / "reference" / "smollm2-135m-svd-randomized"
    committed = json.loads((folder / f"compare_{ratio}_{stage}.json").read_text())
    out = _load().compare(ROOT / committed["a"], ROOT / committed["b"])
    out["a"], out["b"] = committed["a"], committed["b"]  # the paths as given, from the root
    assert json.loads(json.dumps(out)) == committed
