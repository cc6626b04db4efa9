"""Per-document records beside the result JSON: the fast scorer and stock HFLM write the same
records, records carry the data sha256, per-window NLLs add up to the reported perplexity."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WORDS, make_model

pytest.importorskip("lm_eval")
from flexigpt.core import stats as S  # noqa: E402
from flexigpt.methods.perplexity import perplexity, window_nll, window_nlls  # noqa: E402
from flexigpt.runtime.evaluation.results import (  # noqa: E402
    evaluate_model,
    load_records,
    load_result,
    records_paths,
)

TASKS = ("arc_easy", "winogrande", "hellaswag")
N_DOCS = 6


@pytest.fixture(autouse=True)
def offline_single_thread(monkeypatch, single_thread):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _doc(task: str, i: int, rng: random.Random) -> dict:
    if task == "arc_easy":
        labels = ["A", "B", "C", "D"] if i % 2 else ["1", "2", "3", "4"]
        return {"id": f"q{i}", "question": _words(rng, 8) + "?", "answerKey": labels[i % 4],
                "choices": {"text": [_words(rng, rng.randint(1, 4)) for _ in labels],
                            "label": labels}}
    if task == "winogrande":
        return {"sentence": f"{_words(rng, 5)} _ {_words(rng, 4)}.", "option1": "king",
                "option2": "river", "answer": "12"[i % 2]}
    return {"ind": i, "activity_label": "Music", "ctx_a": _words(rng, 6) + ".", "ctx_b": "the",
            "ctx": "", "source_id": "x", "split": "val", "split_type": "indomain",
            "label": str(i % 4), "endings": [_words(rng, 4) for _ in range(4)]}


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("benchmarks")
    splits = {"arc_easy": ("validation", "test"), "winogrande": ("validation",),
              "hellaswag": ("validation",)}
    for k, (task, names) in enumerate(splits.items()):
        (root / task).mkdir()
        for j, split in enumerate(names):
            rng = random.Random(10 * k + j)
            lines = [json.dumps(_doc(task, i, rng)) for i in range(N_DOCS)]
            (root / task / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def test_fast_and_stock_write_the_same_records(bench_dir, tiny_checkpoint, text_file, tmp_path):
    opts = {"tasks": list(TASKS), "limit": 5, "tasks_dir": str(bench_dir),
            "ppl_text": str(text_file), "ppl_seq_len": 64, "ppl_windows": 5, "batch_size": 2}
    fast = evaluate_model(tiny_checkpoint, tmp_path / "fast.json", **opts)
    stock = evaluate_model(tiny_checkpoint, tmp_path / "stock.json", backend="hf", **opts)
    assert stock["lm_eval"]["backend"] == "hf" and fast["lm_eval"]["config"]["class"] == "FastHFLM"
    assert fast["records"] == {"tasks": "fast.samples.jsonl.gz", "perplexity": "fast.windows.json"}
    assert load_result(tmp_path / "fast.json")["records"] == fast["records"]
    paths = records_paths(tmp_path / "fast.json")
    assert all(p.is_file() for p in paths.values())
    # the result JSON stays small: no per-doc data in it
    assert "loglikelihoods" not in (tmp_path / "fast.json").read_text()
    # deterministic gzip (mtime 0): a byte-identical rerun would give a byte-identical file
    with gzip.open(paths["tasks"]) as fh:
        assert fh.read()
    assert paths["tasks"].read_bytes()[4:8] == b"\0\0\0\0"

    rec_f, rec_s = load_records(tmp_path / "fast.json"), load_records(tmp_path / "stock.json")
    assert list(rec_f["tasks"]) == list(rec_s["tasks"]) == list(TASKS)
    for task in TASKS:
        docs_f, docs_s = rec_f["tasks"][task], rec_s["tasks"][task]
        entry = fast["tasks"][task]
        assert [d["doc_id"] for d in docs_f] == [d["doc_id"] for d in docs_s] == list(range(5))
        for a, b in zip(docs_f, docs_s):
            assert set(a) == set(b)
            assert a["data_sha256"] == entry["data_sha256"] == stock["tasks"][task]["data_sha256"]
            assert len(a["data_sha256"]) == 64 and a["metric"] == entry["metric"]
            for key in ("task", "split", "gold", "target", "is_greedy", "doc_hash",
                        "prompt_hash", "target_hash", "metrics", "filter"):
                assert a[key] == b[key], (task, key)
            for metric in a["metrics"]:
                assert a[metric] == b[metric], (task, metric)
            assert len(a["loglikelihoods"]) == len(b["loglikelihoods"]) >= 2
            assert np.allclose(a["loglikelihoods"], b["loglikelihoods"], atol=1e-4, rtol=0)
            assert [r[0] for r in a["filtered_resps"]] == a["loglikelihoods"]
            assert [r[1] for r in a["filtered_resps"]] == a["is_greedy"]
            assert isinstance(a["gold"], int) and 0 <= a["gold"] < len(a["loglikelihoods"])
            # acc per doc is lm-eval's argmax rule on the recorded log-likelihoods
            assert a["acc"] == float(int(np.argmax(a["loglikelihoods"])) == a["gold"])
        # per-doc metrics average to the result's metrics
        for metric in docs_f[0]["metrics"]:
            assert np.mean([d[metric] for d in docs_f]) == pytest.approx(
                entry["metrics"][metric])
    assert "acc_norm" in rec_f["tasks"]["arc_easy"][0]

    ppl_f, ppl_s = rec_f["perplexity"], rec_s["perplexity"]
    assert ppl_f["text_sha256"] == fast["perplexity"]["text_sha256"]
    assert ppl_f["n_windows"] == len(ppl_f["nll"]) == len(ppl_f["tokens"]) == 5
    assert sum(ppl_f["tokens"]) == ppl_f["n_tokens"] == fast["perplexity"]["n_tokens"]
    assert math.exp(sum(ppl_f["nll"]) / sum(ppl_f["tokens"])) == pytest.approx(
        fast["perplexity"]["value"], rel=1e-6)
    assert math.exp(ppl_f["total_nll"] / ppl_f["n_tokens"]) == fast["perplexity"]["value"]
    assert ppl_f["nll"] == ppl_s["nll"]  # perplexity does not depend on the lm-eval backend

    # the two runs pair: every difference is exactly zero
    cmp = S.compare_runs(rec_f, rec_s, n_boot=200)
    assert all(ci.low == ci.high == 0.0 for ci in cmp["tasks"].values())
    assert cmp["average"].estimate == 0.0 and cmp["log_ppl"].estimate == 0.0

    # a rerun without perplexity removes the stale windows file
    again = evaluate_model(tiny_checkpoint, tmp_path / "fast.json",
                           **{**opts, "ppl_text": None, "tasks": ["winogrande"]})
    assert again["records"] == {"tasks": "fast.samples.jsonl.gz", "perplexity": None}
    assert not paths["perplexity"].exists()
    assert list(load_records(tmp_path / "fast.json")["tasks"]) == ["winogrande"]


def test_window_nlls_equal_perplexity():
    torch.manual_seed(0)
    model = make_model()
    windows = torch.randint(3, 300, (7, 33))
    windows[:, 0] = 0
    ref_total, ref_count = window_nll(model, windows, batch_size=3)
    per = window_nlls(model, windows, batch_size=3)
    assert (per.total, per.count) == (ref_total, ref_count)
    assert per.perplexity() == perplexity(model, windows, batch_size=3)
    assert per.tokens == [32] * 7 and len(per.nll) == 7
    assert sum(per.nll) == pytest.approx(ref_total, rel=1e-6)
    one = window_nlls(model, windows[2:3], batch_size=1)
    assert one.nll[0] == pytest.approx(per.nll[2], rel=1e-5)


def test_load_records_of_an_old_result_says_so(tmp_path):
    old = {"schema": 1, "model_dir": "m", "method": "dense", "created": "x", "num_layers": 1,
           "labels": {}, "provenance": {}, "lm_eval": {}, "parameters": {"compressed": 1},
           "perplexity": None, "tasks": {}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(FileNotFoundError, match="no per-document records"):
        load_records(tmp_path / "old.json")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_nlls_one_window_at_a_time_equal_the_whole_batch(dtype):
    """The perplexity loop scores one window's logits at a time (fp32 temporaries [T-1, V]
    instead of [B(T-1), V]); every token NLL, and so every total, is bit-identical to
    cross-entropy over the whole batch."""
    from flexigpt.methods.perplexity import _token_nlls

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 17, 1000, generator=gen) * 4).to(dtype)
    ids = torch.randint(1000, (3, 17), generator=gen)
    flat = logits[:, :-1].float().reshape(-1, 1000)
    whole = torch.nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1), reduction="none")
    one_by_one = _token_nlls(logits, ids)
    assert torch.equal(one_by_one, whole)
    assert float(one_by_one.sum()) == float(whole.sum())
