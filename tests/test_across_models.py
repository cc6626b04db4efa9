"""Cross-model tables (flexigpt.tables.across) and the facts behind Table 1's second achieved
ratio (flexigpt.tables.facts): the summary rules, the row matching, the errors, and the
committed cross-model tables rebuilt from the committed per-model tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from flexigpt.tables.across import (
    BETTER,
    FAILS,
    HOLDS,
    OPEN,
    UNTESTED,
    across_models,
    classify,
    summary,
    vs_skip,
)
from flexigpt.tables.facts import ACHIEVED, check_facts, non_embedding_ratio, with_facts
from flexigpt.tables.schema import ResultFileError

ROOT = Path(__file__).resolve().parent.parent
ACROSS = ROOT / "results" / "reference" / "across_models"


@pytest.mark.parametrize("classes, text", [
    ([HOLDS, HOLDS], "holds on both"),
    ([HOLDS, FAILS], "holds on one"),
    ([FAILS, FAILS], "holds on neither"),
    ([OPEN, OPEN], "undecided"),
    ([HOLDS, OPEN], "holds on one; undecided on one"),
    ([FAILS, UNTESTED], "fails on one; not tested on one"),
    ([UNTESTED, UNTESTED], "not tested"),
    ([HOLDS, HOLDS, FAILS], "holds on 2 of 3"),
    ([HOLDS, HOLDS, HOLDS], "holds on all"),
])
def test_summary_counts_models(classes, text):
    assert summary(classes) == text


def test_summary_marks_one_seed_only_when_something_was_decided():
    assert summary([HOLDS, HOLDS], single_seed=True) == "holds on both †"
    assert summary([OPEN, OPEN], single_seed=True) == "undecided"


def test_classify_and_vs_skip_follow_the_verdict_rules():
    assert classify("supported") == HOLDS
    assert classify("no practical difference") == FAILS
    assert classify("contradicted") == FAILS
    assert classify("undecided at this budget") == OPEN
    assert classify("not run in this config") == UNTESTED
    assert classify("reported (timing; single run, no interval)") == UNTESTED
    assert vs_skip(-0.5, -0.1) == BETTER
    assert vs_skip(-0.5, 0.1) == "undecided"
    assert vs_skip(-0.01, 0.01) == "no practical difference"
    assert vs_skip(None, None) is None


def _verdicts(model: str, verdict: str, tokens: float, per_param: str) -> pd.DataFrame:
    return pd.DataFrame([{
        "Claim": "(a) A lower PPL than B", "Setting": "30%",
        "Budget": f"32.8K tokens ({per_param} / param)", "Verdict": verdict,
        "Δ [95% CI]": "-0.100 [-0.200, -0.050]", "single_seed": True, "tokens": tokens,
        "model": model}])


def _replacement(ppl_skip: float, ppl_map: float, low: float, high: float) -> pd.DataFrame:
    base = {"variant": "default", "ratio": 0.3, "stage": "final", "trained": True}
    return pd.DataFrame([
        {**base, "method": "shortgpt_lora", "strategy": "nothing (skip)", "ppl": ppl_skip,
         "log_ppl_vs_skip_estimate": None, "log_ppl_vs_skip_low": None,
         "log_ppl_vs_skip_high": None},
        {**base, "method": "streamline", "variant": "lora", "strategy": "one trained module",
         "ppl": ppl_map, "log_ppl_vs_skip_estimate": (low + high) / 2,
         "log_ppl_vs_skip_low": low, "log_ppl_vs_skip_high": high}])


def test_across_models_matches_rows_by_claim_setting_and_tokens(tmp_path):
    """The budget text differs by model (tokens per parameter); the rows still pair up."""
    for model, verdict, per_param, ppl in (("m1", "supported", "0.0002", 50.0),
                                           ("m2", "contradicted", "0.0001", 80.0)):
        run = tmp_path / model
        run.mkdir()
        _verdicts(model, verdict, 32768.0, per_param).to_csv(run / "verdicts.csv", index=False)
        _replacement(100.0, ppl, -0.8, -0.6).to_csv(run / f"table_replacement_{model}.csv",
                                                   index=False)
    written = across_models([tmp_path / "m1", tmp_path / "m2"], tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "table_replacement_across_models.csv", "table_replacement_across_models.md",
        "verdicts_across_models.csv", "verdicts_across_models.md"]
    rows = pd.read_csv(tmp_path / "out" / "verdicts_across_models.csv")
    assert len(rows) == 2 and set(rows["across"]) == {"holds on one †"}
    text = (tmp_path / "out" / "table_replacement_across_models.md").read_text()
    assert f"{BETTER} on both" in text
    assert "1 of 2" in text and "2 of 2" in text  # ranks by PPL per model


def test_across_models_refuses_what_it_cannot_compare(tmp_path):
    with pytest.raises(ValueError, match="at least two runs"):
        across_models([tmp_path], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="holds no verdicts.csv"):
        across_models([tmp_path, tmp_path], tmp_path / "out")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        _verdicts("same", "supported", 1.0, "1").to_csv(tmp_path / name / "verdicts.csv",
                                                        index=False)
    with pytest.raises(ValueError, match="runs of different models"):
        across_models([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    (tmp_path / "b" / "verdicts.csv").write_text("Claim\nx\n")
    with pytest.raises(ResultFileError, match="missing columns"):
        across_models([tmp_path / "a", tmp_path / "b"], tmp_path / "out")


def test_cli_across_refuses_other_inputs(tmp_path, capsys):
    from flexigpt.cli import main as cli_main

    assert cli_main(["tables", "--across", "a", "b", "--results", "r",
                     "--out", str(tmp_path)]) == 2
    assert "drop --results" in capsys.readouterr().err


def test_non_embedding_ratio_counts_outside_the_embeddings():
    """100 parameters, 40 in the embedding, 18 removed from the blocks: 18 % of all, 30 %
    of the 60 outside the embedding; a method that slices the embedding gets no value."""
    agg = pd.DataFrame({"model": ["m", "m", "m"], "method": ["shortgpt", "slicegpt", "dense"],
                        "params_dense": [100, 100, 100], "params_compressed": [82, 70, 100]})
    out = with_facts(agg, check_facts({"m": {"embedding_params": 40,
                                             "compression_basis": "non_embedding"}}))
    assert out[ACHIEVED].iloc[0] == pytest.approx(0.30)
    assert pd.isna(out[ACHIEVED].iloc[1])
    assert out[ACHIEVED].iloc[2] == pytest.approx(0.0)
    assert non_embedding_ratio(agg).isna().all()  # no facts: no value
    assert with_facts(agg, {}) is agg


@pytest.mark.parametrize("facts, message", [
    ({"m": {"embedding_params": -1}}, "integer >= 0"),
    ({"m": {"embedding_params": 1.5}}, "integer >= 0"),
    ({"m": {"embedding_params": 3, "compression_basis": "blocks"}}, "must be one of"),
    ({"m": 3}, "must map model keys to objects"),
])
def test_bad_facts_name_the_model_and_key(facts, message):
    with pytest.raises(ValueError, match=message):
        check_facts(facts)


def test_archive_index_with_bad_facts_is_refused(tmp_path):
    from flexigpt.tables.from_archive import INDEX, read_index

    (tmp_path / INDEX).write_text(json.dumps({
        "schema": 1, "inputs": {k: [] for k in ("results", "timings", "train_logs",
                                                 "manifests", "selections")},
        "model_facts": {"m": {"embedding_params": "many"}}}))
    with pytest.raises(ResultFileError, match="embedding_params must be an integer"):
        read_index(tmp_path)


@pytest.mark.skipif(not (ACROSS / "verdicts_across_models.md").is_file(),
                    reason="no committed cross-model tables")
def test_committed_cross_model_tables_rebuild_from_the_committed_runs(tmp_path):
    """results/reference/across_models was written by ``flexigpt tables --across`` from the
    committed per-model tables it names (its RUN.md); rebuilding gives the same files."""
    runs = [ROOT / "results" / "reference" / name for name in ("smollm2-135m-bracketed", "gemma3-270m")]
    for path in across_models(runs, tmp_path):
        assert path.read_text() == (ACROSS / path.name).read_text(), path.name


def test_model_facts_count_the_embedding_of_a_local_checkpoint(tmp_path, tiny_checkpoint):
    """A tied 300 × 64 embedding: 19,200 embedding parameters; the archive of another model
    refuses them; a hub id (no local checkpoint) has no facts."""
    from flexigpt.tables.from_archive import INDEX, read_index
    from flexigpt.workflow.dag.table_inputs import add_model_facts, model_facts

    config = {"model": {"key": "tiny", "path": str(tiny_checkpoint)},
              "compression_basis": "non_embedding"}
    assert model_facts(config) == {"tiny": {"embedding_params": 19200,
                                            "compression_basis": "non_embedding"}}
    assert model_facts({"model": {"key": "hub", "path": "org/not-local"}}) == {}
    archive = tmp_path / "archive"
    archive.mkdir()
    index = {"schema": 1, "inputs": {k: [] for k in ("results", "timings", "train_logs",
                                                      "manifests", "selections")},
             "model_names": {"other": "Other"}}
    (archive / INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="not a run of model 'tiny'"):
        add_model_facts(config, archive)
    (archive / INDEX).write_text(json.dumps({**index, "model_names": {"tiny": "Tiny"}}))
    add_model_facts(config, archive)
    assert read_index(archive)["model_facts"]["tiny"]["embedding_params"] == 19200
