"""Zero-shot evaluation: local task configs = lm-eval's built-in ones, result JSON, CLI,
inference timing. Uses small fake task files in lm-eval's hub schemas (no resources/)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import SPLITS, make_model, write_fake_tasks

pytest.importorskip("lm_eval")
from flexigpt.runtime.evaluation import tasks as T  # noqa: E402
from flexigpt.runtime.evaluation.results import evaluate_model, load_result  # noqa: E402


@pytest.fixture(autouse=True)
def offline_single_thread(monkeypatch, single_thread):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    return write_fake_tasks(tmp_path_factory.mktemp("tasks"), 5)


def test_local_tasks_render_exactly_like_builtin(bench_dir, monkeypatch):
    """Built-in task object (its own config; hub loader fed the same docs) vs ours."""
    import datasets

    real_load = datasets.load_dataset
    seen = []

    def fake_hub(path, name=None, **kwargs):
        if path == "json":
            return real_load(path, name=name, **kwargs)
        task = next(t for t in SPLITS if (T.builtin_config(t)["dataset_path"],
                                          T.builtin_config(t).get("dataset_name")) == (path, name))
        seen.append((path, name))
        splits = {s: datasets.Dataset.from_json(str(bench_dir / task / f"{s}.jsonl"))
                  for s in SPLITS[task]}
        return datasets.DatasetDict({"train": splits["validation"], **splits})

    for name in SPLITS:
        ours = T.build_task(T.local_config(name, bench_dir))
        with monkeypatch.context() as m:
            m.setattr(datasets, "load_dataset", fake_hub)
            theirs = T.build_task(T.hub_config(name))
        assert seen[-1][0] == T.builtin_config(name)["dataset_path"]
        docs_a, docs_b = list(ours.eval_docs), list(theirs.eval_docs)
        assert len(docs_a) == len(docs_b) == 5
        for a, b in zip(docs_a, docs_b):
            assert ours.doc_to_text(a) == theirs.doc_to_text(b)
            assert ours.doc_to_choice(a) == theirs.doc_to_choice(b)
            assert ours.doc_to_target(a) == theirs.doc_to_target(b)
        for task in (ours, theirs):
            task.set_config(key="num_fewshot", value=0)
            task.build_all_requests(limit=None, rank=0, world_size=1)
        assert [i.args for i in ours.instances] == [i.args for i in theirs.instances]
        assert ours.config.metric_list == theirs.config.metric_list
        assert ours.config.test_split == theirs.config.test_split  # same evaluated split
    assert len(seen) == len(SPLITS)


def test_scoped_task_index_matches_lm_evals_full_index():
    """The manager over the supported tasks' folders finds each task at the YAML path that
    ``TaskManager()`` (every built-in task, ~16 s) registers, and loads the same config."""
    from lm_eval.tasks import TaskManager

    assert set(T.BUILTIN_FOLDER) == set(T.HEADLINE_METRIC)
    full, scoped = TaskManager().task_index, T.task_manager().task_index
    for name in T.HEADLINE_METRIC:
        assert scoped[name].yaml_path == full[name].yaml_path, name
        assert T.builtin_config(name) == T._load_yaml(full[name].yaml_path)


def test_limit_is_first_n_docs(bench_dir):
    task = T.build_task(T.local_config("piqa", bench_dir))
    task.set_config(key="num_fewshot", value=0)
    task.build_all_requests(limit=2, rank=0, world_size=1)
    first = [json.loads(line) for line in (bench_dir / "piqa" / "validation.jsonl")
             .read_text().splitlines()[:2]]
    assert sorted({i.doc_id for i in task.instances}) == [0, 1]
    assert [i.doc for i in task.instances[::2]] == first


def test_task_errors(bench_dir, tmp_path, tiny_checkpoint, text_file):
    with pytest.raises(T.TaskDataError, match="unknown task"):
        T.task_specs(["arc_eazy"], "local", bench_dir)
    (tmp_path / "arc_easy").mkdir()
    (tmp_path / "arc_easy" / "validation.jsonl").write_text("{}\n")
    with pytest.raises(T.TaskDataError, match="test.jsonl"):
        T.local_config("arc_easy", tmp_path)
    with pytest.raises(T.TaskDataError, match="does not exist"):
        T.task_specs(["piqa"], "local", tmp_path / "nowhere")
    with pytest.raises(ValueError, match="source"):
        T.task_specs(["piqa"], "disk", bench_dir)
    with pytest.raises(T.TaskDataError, match="hub"):  # offline (fixture): no network call
        T.build_task(T.hub_config("piqa"))
    out = tmp_path / "r.json"
    for bad, match in [({"limit": 0}, "limit"), ({"limit": 1.0}, "limit"),
                       ({"backend": "vllm"}, "backend"), ({"tasks": [], "ppl_text": None},
                                                          "nothing to evaluate"),
                       ({"ppl_text": str(tmp_path / "no.txt")}, "no.txt")]:
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            evaluate_model(tiny_checkpoint, out, tasks_dir=bench_dir,
                           **{"ppl_text": str(text_file), **bad})
    with pytest.raises(RuntimeError, match="not a checkpoint"):
        evaluate_model(tmp_path / "missing-model", out, tasks_dir=bench_dir,
                       tasks=["piqa"], ppl_text=None)
    assert not out.exists()


def test_evaluate_model_end_to_end(bench_dir, tiny_checkpoint, text_file, tmp_path):
    from flexigpt.cli import main

    labels = {"model": "tiny", "method": "dense", "variant": "default", "ratio": None,
              "stage": "final", "seed": 0}
    opts = {"tasks": ["arc_easy", "winogrande"], "limit": 3, "tasks_dir": str(bench_dir),
            "ppl_text": str(text_file), "ppl_seq_len": 64, "ppl_windows": 4, "batch_size": 4}
    first = evaluate_model(tiny_checkpoint, tmp_path / "a.json", labels=labels, **opts)
    data = load_result(tmp_path / "a.json")
    assert data == json.loads(json.dumps(first))
    assert data["method"] == "dense" and data["manifest_hash"] is None
    assert data["num_layers"] == 4 and data["parameters"]["achieved_ratio"] == 0.0
    ppl = data["perplexity"]
    assert math.isfinite(ppl["value"]) and ppl["n_windows"] == 4 and ppl["seq_len"] == 64
    assert len(ppl["text_sha256"]) == 64
    for task, metric in (("arc_easy", "acc_norm"), ("winogrande", "acc")):
        entry = data["tasks"][task]
        assert entry["metric"] == metric and 0 <= entry["value"] <= 1
        assert entry["value"] == entry["metrics"][metric]
        assert math.isfinite(entry["stderr"]) and entry["n_docs"] == 3 and entry["limit"] == 3
        assert entry["source"] == "local" and len(entry["data_sha256"]) == 64
    assert set(data["tasks"]["arc_easy"]["metrics"]) == {"acc", "acc_stderr", "acc_norm",
                                                         "acc_norm_stderr"}
    assert data["tasks"]["arc_easy"]["split"] == "test"
    lm = data["lm_eval"]
    assert lm["num_fewshot"] == 0 and lm["backend"] == "fast" and lm["version"] == "0.4.13"
    assert lm["config"]["add_bos_token"] is False and lm["config"]["fast"]["fallback_reason"] is None
    assert data["labels"] == labels and "versions" in data["provenance"]

    # the same model again, through the CLI: identical numbers
    argv = ["evaluate", "--model", str(tiny_checkpoint), "--out", str(tmp_path / "b.json"),
            "--tasks", "arc_easy,winogrande", "--limit", "3", "--tasks-dir", str(bench_dir),
            "--ppl-text", str(text_file), "--ppl-seq-len", "64", "--ppl-windows", "4",
            "--batch-size", "4", "--label", "model=tiny", "--label", "ratio=null"]
    assert main(argv) == 0
    second = load_result(tmp_path / "b.json")
    assert second["perplexity"]["value"] == ppl["value"]
    assert {t: e["metrics"] for t, e in second["tasks"].items()} == \
           {t: e["metrics"] for t, e in data["tasks"].items()}
    assert second["labels"] == {"model": "tiny", "ratio": None}

    # stock lm-eval backend: identical metrics
    stock = evaluate_model(tiny_checkpoint, tmp_path / "c.json", backend="hf",
                           **{**opts, "ppl_text": None})
    assert stock["perplexity"] is None and stock["lm_eval"]["backend"] == "hf"
    assert {t: e["metrics"] for t, e in stock["tasks"].items()} == \
           {t: e["metrics"] for t, e in data["tasks"].items()}

    collect = pytest.importorskip("flexigpt.tables.collect")
    row = collect.parse_result(tmp_path / "a.json")
    assert row["ppl"] == ppl["value"] and row["arc_easy"] == 100 * data["tasks"]["arc_easy"]["value"]


def test_measure_inference_and_timing_json(tmp_path, tiny_tokenizer):
    from flexigpt.runtime.evaluation.inference import measure_inference, run_inference_cost

    models = {"dense/default/full": make_model(layers=4), "shortgpt/default/r0.5": make_model(layers=2)}
    rows = measure_inference(models, batch=2, seq_len=16, repeats=3)
    assert [r["name"] for r in rows] == list(models)
    assert rows[0]["relative_time"] == 1.0 and rows[0]["relative_throughput"] == 1.0
    assert all(r["seconds"] > 0 and len(r["seconds_all"]) == 3 for r in rows)
    with pytest.raises(ValueError, match="repeats"):
        measure_inference(models, batch=2, seq_len=16, repeats=0)
    dirs = {}
    for name, model in models.items():
        dirs[name] = tmp_path / name.replace("/", "_")
        model.save_pretrained(dirs[name])
        tiny_tokenizer.save_pretrained(dirs[name])
    out = run_inference_cost(dirs, tmp_path / "tiny" / "inference.json", batch=2, seq_len=16,
                             repeats=2)
    assert out["model"] == "tiny" and out["rows"][1]["ratio"] == 0.5
    assert out["rows"][1]["num_layers"] == 2
    collect = pytest.importorskip("flexigpt.tables.collect")
    df = collect.parse_timing(tmp_path / "tiny" / "inference.json")
    assert list(df["method"]) == ["dense", "shortgpt"]


def test_autocast_rule_and_bf16_scoring(bench_dir, tiny_checkpoint, text_file, tmp_path):
    """``autocast_dtype``: one resolution rule (flexigpt.core.precision), refused with the stock
    backend, applied to perplexity and tasks alike and recorded in the result."""
    import torch

    from flexigpt.core.precision import native_bf16, resolve_autocast
    from flexigpt.runtime.evaluation.results import EvalConfig

    assert resolve_autocast(None, "cpu") is None and resolve_autocast("none", "cpu") is None
    assert resolve_autocast("bfloat16", "cpu") is torch.bfloat16
    assert resolve_autocast("auto", "cpu") is (torch.bfloat16 if native_bf16("cpu") else None)
    with pytest.raises(ValueError, match="autocast must be"):
        resolve_autocast("int8", "cpu")
    with pytest.raises(ValueError, match="needs backend 'fast'"):
        EvalConfig(backend="hf", autocast_dtype="bfloat16", ppl_text=str(text_file))
    opts = {"tasks": ["arc_easy"], "limit": 3, "tasks_dir": str(bench_dir),
            "ppl_text": str(text_file), "ppl_seq_len": 64, "ppl_windows": 4, "batch_size": 4}
    fp32 = evaluate_model(tiny_checkpoint, tmp_path / "a.json", **opts)
    bf16 = evaluate_model(tiny_checkpoint, tmp_path / "b.json", autocast_dtype="bfloat16",
                          **opts)
    assert fp32["perplexity"]["autocast"] is None
    assert bf16["perplexity"]["autocast"] == "bfloat16"
    assert bf16["lm_eval"]["config"]["fast"]["autocast_dtype"] == "bfloat16"
    # bf16 changes the numbers a little, never by much on a tiny model
    assert bf16["perplexity"]["value"] != fp32["perplexity"]["value"]
    assert bf16["perplexity"]["value"] == pytest.approx(fp32["perplexity"]["value"], rel=0.05)


def test_tasks_skip_lm_evals_environment_report(bench_dir, tiny_checkpoint, monkeypatch):
    """lm-eval's per-call environment report (``collect_env``: pip, compiler and driver
    subprocesses) is replaced while a task runs, restored after, and no task spawns a
    process; the scores do not depend on it."""
    import subprocess

    import lm_eval.evaluator as evaluator

    from flexigpt.core import memory
    from flexigpt.runtime.evaluation import zeroshot
    from flexigpt.storage.artifacts import load_compressed

    original = evaluator.add_env_info, evaluator.get_git_commit_hash
    with zeroshot.without_environment_report():
        storage: dict = {}
        evaluator.add_env_info(storage)
        assert storage["pretty_env_info"] == zeroshot.NOT_COLLECTED
        assert evaluator.get_git_commit_hash() == zeroshot.NOT_COLLECTED
    assert (evaluator.add_env_info, evaluator.get_git_commit_hash) == original

    started: list = []

    def no_process(*args, **kwargs):  # lm-eval catches what collect_env raises: record it
        started.append(args)
        raise OSError("no process in this test")

    loaded = load_compressed(tiny_checkpoint)
    lm = zeroshot.make_lm(loaded.model, loaded.tokenizer, batch_size=4)
    spec = T.task_specs(["arc_easy"], "local", bench_dir)[0]
    memory._libc()  # finds glibc once per process (``ldconfig -p``), before the count
    monkeypatch.setattr(subprocess, "Popen", no_process)
    entry = zeroshot.run_task(lm, spec, limit=3)
    assert entry["n_docs"] == 3 and 0 <= entry["value"] <= 1
    assert started == []
    assert (evaluator.add_env_info, evaluator.get_git_commit_hash) == original
