"""``flexigpt archive --add``: an archive gains the runs a config added, and nothing else
changes (:func:`flexigpt.workflow.dag.table_inputs.extend_archive`)."""

from __future__ import annotations

import json

import pytest

from flexigpt.tables.from_archive import INDEX, KINDS, read_index
from flexigpt.workflow.dag import table_inputs as ti

OLD = "results/m/shortgpt/default/r0.3/eval_final.json"
NEW = "results/m/linearpatch/default/r0.3/eval_final.json"
NEW_LOG = "results/m/linearpatch/lora/r0.3/trained/train_log.csv"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def archived(tmp_path, monkeypatch):
    """An archive of one result (with its records); a config that adds a result and a
    training log; a workdir holding the new run and a *changed* copy of the old one."""
    archive, work = tmp_path / "archive", tmp_path / "work"
    write(archive / OLD, json.dumps({"records": {"samples": "eval_final.samples.jsonl.gz"}}))
    write(archive / OLD.replace(".json", ".samples.jsonl.gz"), "old records")
    index = {"schema": 1, "results_dir": "results",
             "inputs": {kind: [OLD] if kind == "results" else [] for kind in KINDS},
             "support": [OLD.replace(".json", ".samples.jsonl.gz")],
             "model_names": {"m": "M"}, "model_facts": {}}
    write(archive / INDEX, json.dumps(index))
    write(work / OLD, json.dumps({"records": {}, "changed": True}))
    write(work / NEW, json.dumps({"records": {"windows": "eval_final.windows.json"}}))
    write(work / NEW.replace(".json", ".windows.json"), "new windows")
    write(work / NEW_LOG, "step,loss\n")
    write(work / NEW_LOG.replace("train_log.csv", "manifest.json"), "{}")
    config_inputs = {kind: [] for kind in KINDS}
    config_inputs["results"] = [OLD, NEW]
    config_inputs["train_logs"] = [NEW_LOG]
    monkeypatch.setattr(ti.RunGrid, "from_config", staticmethod(lambda config: None))
    monkeypatch.setattr(ti, "table_inputs", lambda grid: config_inputs)
    return archive, work, config_inputs


def test_adds_only_the_new_runs_and_keeps_archived_files(archived):
    archive, work, config_inputs = archived
    before = (archive / OLD).read_text()
    written = ti.extend_archive({}, archive, workdir=work)
    assert {p.relative_to(archive).as_posix() for p in written} == {
        NEW, NEW_LOG, NEW.replace(".json", ".windows.json"),
        NEW_LOG.replace("train_log.csv", "manifest.json"), INDEX}
    assert (archive / OLD).read_text() == before  # the archived run stays what it was
    index = read_index(archive)
    assert index["inputs"] == config_inputs
    assert index["support"][0] == OLD.replace(".json", ".samples.jsonl.gz")
    assert index["model_names"] == {"m": "M"}
    with pytest.raises(ValueError, match="adds no table input"):
        ti.extend_archive({}, archive, workdir=work)


def test_refuses_a_missing_new_input_and_writes_nothing(archived):
    archive, work, _ = archived
    (work / NEW_LOG).unlink()
    index_before = (archive / INDEX).read_text()
    with pytest.raises(FileNotFoundError, match="train_log.csv"):
        ti.extend_archive({}, archive, workdir=work)
    assert (archive / INDEX).read_text() == index_before
    assert not (archive / NEW).exists()


def test_refuses_a_config_that_drops_archived_runs(archived, monkeypatch):
    archive, work, config_inputs = archived
    monkeypatch.setattr(ti, "table_inputs",
                        lambda grid: {**config_inputs, "results": [NEW]})
    with pytest.raises(ValueError, match="does not list"):
        ti.extend_archive({}, archive, workdir=work)
