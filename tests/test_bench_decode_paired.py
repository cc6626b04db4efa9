"""benchmarks/bench_decode_paired.py: the paired-round statistics, and a smoke run on tiny saved
models (Dynamo's ``eager`` backend: the protocol, not Inductor, is under test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_benchmark, make_model, manifest_for
from test_generation import PROMPTS, flexi

from flexigpt.export.publish import publish_compressed as save_compressed

ROOT = Path(__file__).resolve().parents[1]


def _load():
    return load_benchmark("bench_decode_paired")


def test_paired_ratio():
    bench = _load()
    ref = [10.0, 20.0, 40.0, 10.0, 30.0]
    same = bench.paired_ratio(ref, [1.05 * x for x in ref])  # a drifting machine, fixed ratio
    assert same["median_ratio"] == pytest.approx(1.05)
    assert same["low"] == pytest.approx(1.05) and same["high"] == pytest.approx(1.05)
    assert same["rounds"] == 5
    mixed = bench.paired_ratio([10.0] * 4, [9.0, 10.0, 11.0, 12.0])
    assert mixed["median_ratio"] == pytest.approx(1.05)
    assert 0.9 <= mixed["low"] <= mixed["median_ratio"] <= mixed["high"] <= 1.2
    assert mixed["ratio_of_medians"] == pytest.approx(1.05)
    with pytest.raises(ValueError, match="equally many rounds"):
        bench.paired_ratio([1.0], [1.0, 2.0])


def test_smoke_run(tmp_path, tiny_tokenizer, monkeypatch):
    import flexigpt.runtime.generation.generator as generator

    monkeypatch.setattr(generator, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    model, manifest = flexi()
    save_compressed(model, tiny_tokenizer, manifest, tmp_path / "flexi")
    dense = make_model()
    save_compressed(dense, tiny_tokenizer, manifest_for("dense", model=dense), tmp_path / "dense")
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "paired.json"
    rc = _load().main([str(tmp_path / "dense"), str(tmp_path / "flexi"), "--labels", "dense",
                       "flexi", "--prompts-file", str(prompts), "--rounds", "2",
                       "--batch-sizes", "1", "2", "--max-new-tokens", "4", "--out", str(out)])
    torch._dynamo.reset()
    assert rc == 0
    result = json.loads(out.read_text())
    assert set(result["by_batch"]) == {"1", "2"} and result["labels"] == ["dense", "flexi"]
    for row in result["by_batch"].values():
        assert [len(v) for v in row["per_token_ms"].values()] == [2, 2]
        assert row["models"]["dense"]["median_ratio"] == 1.0
        for stats in row["models"].values():
            assert stats["greedy_same_as_eager"] and stats["median_ms"] > 0
            assert stats["low"] <= stats["median_ratio"] <= stats["high"]
    assert set(result["loadavg"]) == {"start", "end"}
